//! The storage engine's error type: what failed, on which file, at which offset.

use std::io;
use std::path::PathBuf;

/// An error from the storage engine. Displays as one line naming the file and offset where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    #[error("{}: cannot open: {cause}", path.display())]
    Open { path: PathBuf, cause: io::Error },
    #[error("{}: {}", path.display(), node.refusal())]
    NotAFile { path: PathBuf, node: weightlift_format::regular::NodeKind },
    #[error("{}: read of {len} bytes at offset {offset} failed: {cause}", path.display())]
    Read { path: PathBuf, offset: u64, len: u64, cause: io::Error },
    #[error("{}: write of {len} bytes at offset {offset} failed: {cause}", path.display())]
    Write { path: PathBuf, offset: u64, len: u64, cause: io::Error },
    #[error("{}: file ended at offset {offset} while {expected_end} bytes were expected (truncated while being read?)", path.display())]
    Truncated { path: PathBuf, offset: u64, expected_end: u64 },
    #[error("{}: {len} bytes at offset {offset} lie past the end of the {file_len}-byte file (did it change since it was parsed?)", path.display())]
    PastEnd { path: PathBuf, offset: u64, len: u64, file_len: u64 },
    #[error("setting {name}={value:?}: {reason}")]
    Setting { name: &'static str, value: String, reason: String },
    /// Pinning staging memory for device DMA failed (the cause keeps the driver's error).
    #[error("pinning {bytes} bytes of staging memory: {cause}")]
    Staging { bytes: u64, cause: Box<dyn std::error::Error + Send + Sync> },
    /// Host memory ran out.
    #[error("out of host memory allocating {bytes} bytes for {what}{}", cause.as_ref().map(|c| format!(" ({c})")).unwrap_or_default())]
    OutOfMemory { what: &'static str, bytes: u64, cause: Option<io::Error> },
    /// An io_uring call failed.
    #[error("io_uring {call}: {cause}")]
    Uring { call: &'static str, cause: io::Error },
    /// io_uring was asked for but this kernel or sandbox refuses it.
    #[error("io_uring was requested by {origin} but is unavailable: {reason}")]
    UringUnavailable { origin: String, reason: String },
    /// An I/O thread could not be started.
    #[error("cannot start an I/O thread: {0}")]
    Thread(io::Error),
    /// An I/O thread panicked (a bug; the load is abandoned cleanly).
    #[error("an I/O thread panicked: {0}")]
    Panicked(String),
    /// A lane could not make staging that serves the load (a bug: the load fails instead of waiting forever).
    #[error("{0}")]
    StagingUnfit(String),
    #[error("invalid destinations: {0}")]
    Destinations(String),
    #[error("{0}")]
    Sink(#[source] Box<dyn std::error::Error + Send + Sync>),
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
