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

pub use weightlift_remote::Location;

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
    let location = Location::new(path).map_err(|e| FormatError::new(path, ErrorKind::Remote(e)))?;
    match by_extension(&location) {
        Some(d) => Ok(d),
        None => detect_input(&input::Input::open_at(&location)?),
    }
}

fn by_extension(location: &Location) -> Option<Detected> {
    match location.extension() {
        Some("safetensors") => Some(Detected::Safetensors),
        Some("gguf") => Some(Detected::Gguf),
        Some("json") => Some(Detected::ShardIndex),
        _ => None,
    }
}

/// The format of an opened input, by its first bytes.
fn detect_input(input: &input::Input) -> Result<Detected, FormatError> {
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
/// Several paths form one index; a tensor name may appear only once across them. Each path is told a local file
/// or an object's URL here, once; where any is an object, they are opened at once (as a shard index's shards are).
pub fn open(paths: &[PathBuf], raw: Option<RawSpec>) -> Result<TensorIndex, FormatError> {
    let locations = paths
        .iter()
        .map(|path| Location::new(path).map_err(|e| FormatError::new(path, ErrorKind::Remote(e))))
        .collect::<Result<Vec<_>, _>>()?;
    // Objects are opened at once, as a shard index's are: a list of 34 shard URLs (what transformers hands a
    // loader) read one after another waited 34 round trips (1.05 s at 30 ms) before the first byte of weights.
    let at_once = if locations.iter().any(|l| l.object().is_some()) { sharded::SHARDS_AT_ONCE } else { 1 };
    let parts = sharded::read_all(&locations, at_once, |location| open_at(location, raw));
    TensorIndex::merge(parts.into_iter().collect::<Result<Vec<_>, _>>()?)
}

/// Reads the checkpoint file (or shard index) at `location`. An object is opened once: by one GET of its first
/// bytes, which parsing reads its header from.
pub fn open_at(location: &Location, raw: Option<RawSpec>) -> Result<TensorIndex, FormatError> {
    if let Some(spec) = raw {
        return raw::read_input(&input::Input::open_at(location)?, spec);
    }
    match by_extension(location) {
        Some(Detected::Safetensors) => safetensors::read_at(location),
        Some(Detected::ShardIndex) => sharded::read_at(location),
        Some(Detected::Gguf) => gguf::read_input(input::Input::open_at(location)?),
        None => {
            let input = input::Input::open_at(location)?;
            match detect_input(&input)? {
                Detected::Gguf => gguf::read_input(input),
                _ => safetensors::read_input(&input),
            }
        }
    }
}
