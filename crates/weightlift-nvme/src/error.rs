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
    Command { qid: u16, cid: u16, opcode: u8, slba: u64, nlb: u32, status: Status },
    /// An admin command completed with an error status.
    #[error("admin command {name} (opcode {opcode:#04x}) failed: {status}")]
    Admin { name: &'static str, opcode: u8, status: Status },
    /// A transfer larger than the controller accepts in one command (MDTS) or than the queue's slots hold.
    #[error("transfer of {bytes} bytes exceeds the {limit}-byte limit per command ({why})")]
    TooLarge { bytes: u64, limit: u64, why: &'static str },
    /// Every submission slot of a queue pair holds a command still in flight.
    #[error("queue {qid} is full ({in_flight} commands in flight)")]
    QueueFull { qid: u16, in_flight: usize },
    /// A value outside what the protocol or this implementation accepts.
    #[error("invalid {what}: {detail}")]
    Invalid { what: &'static str, detail: String },
    /// The controller did not answer in time.
    #[error("timed out after {waited_ms} ms waiting for {what}")]
    Timeout { what: String, waited_ms: u64 },
    /// The controller reported a fatal status (CSTS.CFS) or the queues can no longer be trusted.
    #[error("controller failed: {0}")]
    ControllerFailed(String),
    /// A register offset outside BAR0 or not 4-byte aligned.
    #[error("register access at offset {offset:#x} outside the {len}-byte register window or misaligned")]
    Register { offset: usize, len: usize },
    /// Memory for queues, PRP lists or data could not be allocated or mapped for DMA.
    #[error("DMA memory of {bytes} bytes: {reason}")]
    Dma { bytes: u64, reason: String },
    /// A byte range outside the namespace or the destination.
    #[error("range of {len} bytes at offset {offset} lies outside the {limit}-byte {what}")]
    OutOfRange { what: &'static str, offset: u64, len: u64, limit: u64 },
    /// The backing file of the software controller.
    #[error("{}: {what}: {cause}", path.display())]
    Backing { path: PathBuf, what: &'static str, cause: std::io::Error },
    /// No NVMe controller is bound to vfio-pci (the message says how to bind one).
    #[error("no NVMe controller bound to vfio-pci{found}; {how}")]
    NoVfioDevice { found: String, how: String },
    /// A VFIO step failed.
    #[error("vfio: {step}: {detail}")]
    Vfio { step: &'static str, detail: String },
    /// A CUDA step of the GPU path failed (or CUDA is missing).
    #[error("gpu: {step}: {detail}")]
    Gpu { step: &'static str, detail: String },
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
