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
    /// A file could not be opened, read or written.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        cause: io::Error,
    },
    /// A chunk decoded to bytes whose checksum differs from the one recorded for it.
    #[error(
        "{path}: {item:?}, chunk {chunk} (bytes {start}..{end}): checksum {actual:#018x} does not match the recorded {expected:#018x}"
    )]
    Checksum {
        /// The pack, or for a manifest check the file the bytes were read from.
        path: PathBuf,
        /// The tensor's name, or for the bytes between tensors a description of the range ("bytes A..B of FILE").
        item: String,
        /// The chunk's number within the item, from 0.
        chunk: u64,
        /// Where the chunk starts in the item's bytes.
        start: u64,
        /// Where the chunk ends in the item's bytes (exclusive).
        end: u64,
        /// The recorded xxh3-64.
        expected: u64,
        /// The xxh3-64 of the bytes decoded or read.
        actual: u64,
    },
    /// A stored stream could not be decoded to its recorded length.
    #[error("{path}: {item:?}, chunk {chunk}, plane {plane}: {codec} stream does not decode: {reason}")]
    Codec {
        /// The pack.
        path: PathBuf,
        /// The tensor's name, or a description of the range between tensors.
        item: String,
        /// The chunk's number within the item, from 0.
        chunk: u64,
        /// The byte plane whose stream failed (0 for an item stored in one plane).
        plane: u8,
        /// The codec's name (`raw`, `zstd`, `lz4`, `deflate` or `huffman`).
        codec: &'static str,
        /// What the decoder said.
        reason: String,
    },
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
