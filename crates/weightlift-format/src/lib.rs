//! Checkpoint formats for weightlift: which bytes of a file are which tensor, found safely before any byte of
//! tensor data is read.
//!
//! - [`safetensors`]: single files (reader and writer), [`sharded`]: `*.safetensors.index.json` checkpoints,
//! - [`gguf`]: GGUF v2/v3 (reader and writer), every ggml tensor type,
//! - [`raw`]: a file as one tensor of a given dtype,
//! - [`wlpack`]: `.wlpack` files, checkpoints split into byte planes and compressed chunk by chunk.
//! - [`regular`]: opening only regular files, refusing FIFOs, sockets and devices before anything can block.
//! - [`output`]: the one way every writer opens its output (never an input, never a non-regular file, atomic).
//!
//! Every reader validates headers against the file length with checked arithmetic and never allocates a size read
//! from the file before checking it. [`open`] picks the reader by extension, then by the file's first bytes.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "test-support")]
pub mod corpus;
mod dtype;
mod error;
pub mod gguf;
mod index;
mod input;
mod metadata;
pub mod output;
pub mod raw;
pub mod regular;
pub mod safetensors;
pub mod sharded;
pub mod synth;
pub mod wlpack;
mod writer;

use std::path::{Path, PathBuf};

pub use dtype::{DType, GgmlType, SizeError};
pub use error::{ErrorKind, FormatError};
pub use index::{Format, HeaderBytes, Metadata, SourceFile, TensorEntry, TensorIndex};
pub use raw::RawSpec;

/// What kind of file a path holds, as [`open`] decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detected {
    /// One safetensors file.
    Safetensors,
    /// A `*.safetensors.index.json` naming the shards of one checkpoint.
    ShardIndex,
    /// A GGUF file.
    Gguf,
}

/// Decides a file's format: by extension (`.safetensors`, `.gguf`, `.json`), else by its first bytes.
pub fn detect(path: &Path) -> Result<Detected, FormatError> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("safetensors") => return Ok(Detected::Safetensors),
        Some("gguf") => return Ok(Detected::Gguf),
        Some("json") => return Ok(Detected::ShardIndex),
        _ => {}
    }
    let input = input::Input::open(path)?;
    let head = input.prefix(16)?;
    if head.starts_with(&gguf::MAGIC) {
        return Ok(Detected::Gguf);
    }
    if head.len() >= 9 {
        let n = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
        if n <= safetensors::MAX_HEADER_BYTES && n.saturating_add(8) <= input.len && head[8] == b'{' {
            return Ok(Detected::Safetensors);
        }
    }
    Err(input.err(ErrorKind::UnknownFormat { first: head.into_iter().take(8).collect() }))
}

/// Reads one checkpoint made of `paths`: safetensors files, shard indexes, GGUF files, or (with `raw`) raw files.
/// Several paths form one index; a tensor name may appear only once across them.
pub fn open(paths: &[PathBuf], raw: Option<RawSpec>) -> Result<TensorIndex, FormatError> {
    let mut parts = Vec::with_capacity(paths.len());
    for path in paths {
        parts.push(open_one(path, raw)?);
    }
    TensorIndex::merge(parts)
}

fn open_one(path: &Path, raw: Option<RawSpec>) -> Result<TensorIndex, FormatError> {
    if let Some(spec) = raw {
        return raw::read(path, spec);
    }
    match detect(path)? {
        Detected::Safetensors => safetensors::read(path),
        Detected::ShardIndex => sharded::read(path),
        Detected::Gguf => gguf::read(path),
    }
}
