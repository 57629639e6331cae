//! What the software controller is asked to be and what it counts: plain data, shared by its front (`SoftNvme`)
//! and its engine.

use std::time::Duration;

use crate::spec::{IoOpcode, Status};

/// How the software controller presents itself.
#[derive(Clone, Debug)]
pub struct SoftConfig {
    /// Logical block size: 512 or 4096 bytes.
    pub lba_size: u32,
    /// Maximum Data Transfer Size as reported in Identify: 2 ^ MDTS pages of 4 KiB (5: 128 KiB).
    pub mdts: u8,
    /// Largest queue the controller accepts (CAP.MQES + 1).
    pub max_queue_entries: u32,
    /// I/O queue pairs the controller grants at most.
    pub max_io_queues: u16,
    /// CAP.DSTRD: doorbells are 4 << stride bytes apart.
    pub doorbell_stride: u8,
    /// Delay between fetching a command and posting its completion (commands overlap while they wait).
    pub latency: Duration,
    /// Threads serving I/O queues (queue `q` is served by thread `(q - 1) % io_threads`); one more serves
    /// registers and the admin queue.
    pub io_threads: usize,
    /// Whether Write commands may change the backing file.
    pub writable: bool,
}

impl Default for SoftConfig {
    fn default() -> SoftConfig {
        SoftConfig {
            lba_size: 512,
            mdts: 5,
            max_queue_entries: 1024,
            max_io_queues: 64,
            doorbell_stride: 0,
            latency: Duration::ZERO,
            io_threads: 1,
            writable: false,
        }
    }
}

/// An injected failure: every command of kind `op` (any I/O command when `None`) whose blocks include `lba`
/// completes with `status` and moves no data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The logical block that triggers it.
    pub lba: u64,
    /// The status such commands complete with.
    pub status: Status,
    /// The kind of command it applies to; `None` for every I/O command.
    pub op: Option<IoOpcode>,
}

/// Counters of what the controller did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftStats {
    /// I/O commands executed (failed ones included).
    pub io_commands: u64,
    /// Admin commands executed.
    pub admin_commands: u64,
    /// Bytes read commands moved from the backing file into memory.
    pub bytes_read: u64,
    /// Bytes write commands moved from memory into the backing file.
    pub bytes_written: u64,
}
