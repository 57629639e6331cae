//! The one error type of this crate.

use std::io;
use std::path::PathBuf;

use weightlift_format::FormatError;

/// Packing, unpacking or verifying failed. Displays as one line naming the file and what is wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PackError {
    /// The input checkpoint or the pack's header is malformed.
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{path}: {cause}")]
    Io { path: PathBuf, cause: io::Error },
    /// A chunk decoded to bytes whose checksum differs from the one recorded for it.
    #[error(
        "{path}: {item:?}, chunk {chunk} (bytes {start}..{end}): checksum {actual:#018x} does not match the recorded {expected:#018x}"
    )]
    Checksum { path: PathBuf, item: String, chunk: u64, start: u64, end: u64, expected: u64, actual: u64 },
    /// A stored stream could not be decoded to its recorded length.
    #[error("{path}: {item:?}, chunk {chunk}, plane {plane}: {codec} stream does not decode: {reason}")]
    Codec { path: PathBuf, item: String, chunk: u64, plane: u8, codec: &'static str, reason: String },
    /// A request that cannot be carried out (bad option, unsupported input).
    #[error("{0}")]
    Invalid(String),
}

impl PackError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> PackError {
        let path = path.into();
        move |cause| PackError::Io { path, cause }
    }
}
