//! The storage engine's error type: what failed, on which file, at which offset.

use std::io;
use std::path::PathBuf;

/// An error from the storage engine. Displays as one line naming the file and offset where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// A file could not be opened (or created, for a write).
    #[error("{}: cannot open: {cause}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        cause: io::Error,
    },
    /// The path is a directory, FIFO, socket or device, not a regular file.
    #[error("{}: {}", path.display(), node.refusal())]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        node: weightlift_format::regular::NodeKind,
    },
    /// A read failed with an error other than an interruption (those are retried, up to a bound).
    #[error("{}: read of {len} bytes at offset {offset} failed: {cause}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Where the read started, in bytes from the file's start.
        offset: u64,
        /// Bytes it asked for.
        len: u64,
        /// What the operating system (or the injected fault) said.
        cause: io::Error,
    },
    /// A write failed, stored nothing, or (from [`crate::durable`], with offset and length 0) the file could not be
    /// replaced.
    #[error("{}: write of {len} bytes at offset {offset} failed: {cause}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Where the failed write started, in bytes from the file's start.
        offset: u64,
        /// Bytes it was to write from there.
        len: u64,
        /// What the operating system said.
        cause: io::Error,
    },
    /// A read met the end of the file before bytes the plan needs (the file shrank after it was opened).
    #[error("{}: file ended at offset {offset} while {expected_end} bytes were expected (truncated while being read?)", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Where the file ended.
        offset: u64,
        /// The end of the bytes the read needed.
        expected_end: u64,
    },
    /// A requested range lies past the end of the file as it is now.
    #[error("{}: {len} bytes at offset {offset} lie past the end of the {file_len}-byte file (did it change since it was parsed?)", path.display())]
    PastEnd {
        /// The file.
        path: PathBuf,
        /// Where the range starts.
        offset: u64,
        /// The range's length in bytes.
        len: u64,
        /// The file's length in bytes when it was opened.
        file_len: u64,
    },
    /// A setting has a value the engine cannot use.
    #[error("setting {name}={value:?}: {reason}")]
    Setting {
        /// The setting's name (`chunk_bytes`, say).
        name: &'static str,
        /// The value given, as text.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// Pinning staging memory for device DMA failed (the cause keeps the driver's error).
    #[error("pinning {bytes} bytes of staging memory: {cause}")]
    Staging {
        /// The bytes that were to be pinned.
        bytes: u64,
        /// The pinner's error.
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Host memory ran out.
    #[error("out of host memory allocating {bytes} bytes for {what}{}", cause.as_ref().map(|c| format!(" ({c})")).unwrap_or_default())]
    OutOfMemory {
        /// What the memory was for: `host` (a [`crate::HostBuffer`]) or `staging` (a lane's staging slots).
        what: &'static str,
        /// The allocation that failed, in bytes.
        bytes: u64,
        /// The operating system's error, where a mapping failed (the allocator gives none).
        cause: Option<io::Error>,
    },
    /// An io_uring call failed.
    #[error("io_uring {call}: {cause}")]
    Uring {
        /// The step that failed (`setup` of the ring, `submit`).
        call: &'static str,
        /// What the kernel said.
        cause: io::Error,
    },
    /// io_uring was asked for but this kernel or sandbox refuses it.
    #[error("io_uring was requested by {origin} but is unavailable: {reason}")]
    UringUnavailable {
        /// Who asked for it (a setting's source: an environment variable, the caller).
        origin: String,
        /// Why it is unavailable (the probe's finding).
        reason: String,
    },
    /// An I/O thread could not be started.
    #[error("cannot start an I/O thread: {0}")]
    Thread(io::Error),
    /// An I/O thread panicked (a bug; the load is abandoned cleanly).
    #[error("an I/O thread panicked: {0}")]
    Panicked(String),
    /// A lane could not make staging that serves the load (a bug: the load fails instead of waiting forever).
    #[error("{0}")]
    StagingUnfit(String),
    /// The destinations or staging asked for cannot serve the load (overlapping or out-of-range destinations, an
    /// empty staging ring, an object read given to the file interface).
    #[error("invalid destinations: {0}")]
    Destinations(String),
    /// The sink failed to take delivered bytes (a device copy failed, say); the cause is the sink's error.
    #[error("{0}")]
    Sink(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The load was cancelled before it completed: its `cancel` flag was set, [`crate::Running::cancel`] was called
    /// or its `Running` dropped, or an object read was stopped.
    #[error("load cancelled")]
    Cancelled,
    /// An object could not be opened or read (its message names the URL and the byte range).
    #[error("{0}")]
    Remote(weightlift_remote::RemoteError),
}

fn copy_io(e: &io::Error) -> io::Error {
    e.raw_os_error().map_or_else(|| io::Error::new(e.kind(), e.to_string()), io::Error::from_raw_os_error)
}

impl IoError {
    /// A copy of this error (the same variant, path, offsets and OS error; boxed causes as their text), for a
    /// failure several callers report: a background load's error, given to each take that waited on it.
    pub fn duplicate(&self) -> IoError {
        let text = |e: &(dyn std::error::Error + Send + Sync)| -> Box<dyn std::error::Error + Send + Sync> {
            e.to_string().into()
        };
        match self {
            IoError::Open { path, cause } => IoError::Open { path: path.clone(), cause: copy_io(cause) },
            IoError::NotAFile { path, node } => IoError::NotAFile { path: path.clone(), node: *node },
            IoError::Read { path, offset, len, cause } => {
                IoError::Read { path: path.clone(), offset: *offset, len: *len, cause: copy_io(cause) }
            }
            IoError::Write { path, offset, len, cause } => {
                IoError::Write { path: path.clone(), offset: *offset, len: *len, cause: copy_io(cause) }
            }
            IoError::Truncated { path, offset, expected_end } => {
                IoError::Truncated { path: path.clone(), offset: *offset, expected_end: *expected_end }
            }
            IoError::PastEnd { path, offset, len, file_len } => {
                IoError::PastEnd { path: path.clone(), offset: *offset, len: *len, file_len: *file_len }
            }
            IoError::Setting { name, value, reason } => {
                IoError::Setting { name, value: value.clone(), reason: reason.clone() }
            }
            IoError::Staging { bytes, cause } => IoError::Staging { bytes: *bytes, cause: text(cause.as_ref()) },
            IoError::OutOfMemory { what, bytes, cause } => {
                IoError::OutOfMemory { what, bytes: *bytes, cause: cause.as_ref().map(copy_io) }
            }
            IoError::Uring { call, cause } => IoError::Uring { call, cause: copy_io(cause) },
            IoError::UringUnavailable { origin, reason } => {
                IoError::UringUnavailable { origin: origin.clone(), reason: reason.clone() }
            }
            IoError::Thread(cause) => IoError::Thread(copy_io(cause)),
            IoError::Panicked(why) => IoError::Panicked(why.clone()),
            IoError::StagingUnfit(why) => IoError::StagingUnfit(why.clone()),
            IoError::Destinations(why) => IoError::Destinations(why.clone()),
            IoError::Sink(cause) => IoError::Sink(text(cause.as_ref())),
            IoError::Cancelled => IoError::Cancelled,
            IoError::Remote(e) => IoError::Remote(e.clone()),
        }
    }

    /// The OS error number behind this error, if any.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            IoError::Open { cause, .. }
            | IoError::Read { cause, .. }
            | IoError::Write { cause, .. }
            | IoError::Uring { cause, .. }
            | IoError::Thread(cause) => cause.raw_os_error(),
            _ => None,
        }
    }

    /// The `io::ErrorKind` behind this error, for callers mapping errors to their own hierarchy.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            IoError::Open { cause, .. } | IoError::Read { cause, .. } | IoError::Write { cause, .. } => {
                Some(cause.kind())
            }
            IoError::Remote(e) => Some(e.io_kind()),
            _ => None,
        }
    }
}

/// The message of a panic's payload.
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
}
