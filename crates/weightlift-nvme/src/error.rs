//! The NVMe crate's error type: which command, queue, LBA range or setup step failed, and the controller's status.

use std::path::PathBuf;

use crate::spec::{IoOpcode, Status};

/// An error from the NVMe layer. Displays as one line naming the queue, LBA range or step where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NvmeError {
    /// An I/O command completed with an error status.
    #[error(
        "{} of LBA {slba}..{} ({nlb} blocks) on queue {qid} (command {cid}) failed: {status}",
        io_name(*opcode),
        slba.saturating_add(u64::from(*nlb))
    )]
    Command {
        /// The I/O queue's id.
        qid: u16,
        /// The command's identifier on that queue.
        cid: u16,
        /// The I/O opcode (a [`IoOpcode`] value, or another the controller saw).
        opcode: u8,
        /// The first logical block.
        slba: u64,
        /// How many blocks (the field's 0-based value plus one).
        nlb: u32,
        /// The completion's status.
        status: Status,
    },
    /// An admin command completed with an error status.
    #[error("admin command {name} (opcode {opcode:#04x}) failed: {status}")]
    Admin {
        /// The command's name ([`crate::spec::AdminOpcode::name`]; `unknown` for an opcode it lacks).
        name: &'static str,
        /// Its admin opcode.
        opcode: u8,
        /// The completion's status.
        status: Status,
    },
    /// A transfer larger than the controller accepts in one command (MDTS) or than the queue's slots hold.
    #[error("transfer of {bytes} bytes exceeds the {limit}-byte limit per command ({why})")]
    TooLarge {
        /// The transfer asked for, in bytes.
        bytes: u64,
        /// The largest one allowed, in bytes.
        limit: u64,
        /// Which limit: the controller's MDTS or the queue's slot size.
        why: &'static str,
    },
    /// Every submission slot of a queue pair holds a command still in flight.
    #[error("queue {qid} is full ({in_flight} commands in flight)")]
    QueueFull {
        /// The queue's id.
        qid: u16,
        /// Commands in flight on it.
        in_flight: usize,
    },
    /// A value outside what the protocol or this implementation accepts.
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// What is invalid (a field, an option, a queue size).
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// The controller did not answer in time.
    #[error("timed out after {waited_ms} ms waiting for {what}")]
    Timeout {
        /// What was awaited (the controller becoming ready, a command's completion).
        what: String,
        /// How long, in milliseconds.
        waited_ms: u64,
    },
    /// The controller reported a fatal status (CSTS.CFS) or the queues can no longer be trusted.
    #[error("controller failed: {0}")]
    ControllerFailed(String),
    /// A register offset outside BAR0 or not 4-byte aligned.
    #[error("register access at offset {offset:#x} outside the {len}-byte register window or misaligned")]
    Register {
        /// The register's offset in BAR0, in bytes.
        offset: usize,
        /// The register window's length in bytes.
        len: usize,
    },
    /// Memory for queues, PRP lists or data could not be allocated or mapped for DMA.
    #[error("DMA memory of {bytes} bytes: {reason}")]
    Dma {
        /// The memory asked for, in bytes.
        bytes: u64,
        /// Why it could not be had.
        reason: String,
    },
    /// A byte range outside the namespace or the destination.
    #[error("range of {len} bytes at offset {offset} lies outside the {limit}-byte {what}")]
    OutOfRange {
        /// Which: `namespace` or `destination`.
        what: &'static str,
        /// Where the range starts, in bytes.
        offset: u64,
        /// Its length in bytes.
        len: u64,
        /// The namespace's or destination's length in bytes.
        limit: u64,
    },
    /// The software controller's backing file could not be opened or examined, or its thread not started.
    #[error("{}: {what}: {cause}", path.display())]
    Backing {
        /// The backing file.
        path: PathBuf,
        /// The step that failed.
        what: &'static str,
        /// What the operating system said.
        cause: std::io::Error,
    },
    /// No NVMe controller is bound to vfio-pci (the message says how to bind one).
    #[error("no NVMe controller bound to vfio-pci{found}; {how}")]
    NoVfioDevice {
        /// What the PCI bus holds instead (each NVMe controller and its driver), as a parenthesised clause.
        found: String,
        /// How to bind one to vfio-pci.
        how: String,
    },
    /// A VFIO step failed.
    #[error("vfio: {step}: {detail}")]
    Vfio {
        /// The step (an ioctl, a mapping, a sysfs read).
        step: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// A CUDA step of the GPU path failed (or CUDA is missing).
    #[error("gpu: {step}: {detail}")]
    Gpu {
        /// The step (registering memory, compiling or launching the kernel, ...).
        step: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// Something this backend cannot do.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

fn io_name(opcode: u8) -> String {
    IoOpcode::from_u8(opcode).map_or_else(|| format!("I/O opcode {opcode:#04x}"), |op| op.to_string())
}

impl NvmeError {
    pub(crate) fn invalid(what: &'static str, detail: impl Into<String>) -> NvmeError {
        NvmeError::Invalid { what, detail: detail.into() }
    }

    pub(crate) fn gpu(step: &'static str) -> impl FnOnce(String) -> NvmeError {
        move |detail| NvmeError::Gpu { step, detail }
    }

    /// The controller status behind this error, if a command failed.
    pub fn status(&self) -> Option<Status> {
        match self {
            NvmeError::Command { status, .. } | NvmeError::Admin { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The first LBA of the failed I/O command, if this is one.
    pub fn lba(&self) -> Option<u64> {
        match self {
            NvmeError::Command { slba, .. } => Some(*slba),
            _ => None,
        }
    }
}
