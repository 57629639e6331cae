//! The result of parsing: which bytes of which file are which tensor.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{ErrorKind, FormatError};
pub use crate::metadata::Metadata;

/// The container format of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// safetensors: a JSON header, then the tensor data.
    Safetensors,
    /// GGUF (versions 2 and 3), as llama.cpp writes it.
    Gguf,
    /// A raw file: one tensor of a given type, no header.
    Raw,
}

impl Format {
    /// The lowercase name reports use.
    pub fn name(self) -> &'static str {
        match self {
            Format::Safetensors => "safetensors",
            Format::Gguf => "gguf",
            Format::Raw => "raw",
        }
    }
}

/// One file of a checkpoint.
#[derive(Clone, Debug)]
pub struct SourceFile {
    /// The path the file was opened by.
    pub path: PathBuf,
    /// Its container format.
    pub format: Format,
    /// File length in bytes when it was parsed.
    pub len: u64,
    /// Absolute offset where the tensor data section starts.
    pub data_start: u64,
    /// What the file says besides its tensors.
    pub metadata: Metadata,
    /// GGUF version (2 or 3), when the file is GGUF.
    pub gguf_version: Option<u32>,
    /// For an object (a URL): the ETag it had when parsed, which a load of it then requires.
    pub etag: Option<String>,
    /// For an object: its bytes `0..data_start`, as the request that fetched them for parsing brought them (`None`
    /// for a local file, and for a header longer than that first request).
    pub header: Option<HeaderBytes>,
    /// For an object: the object as parsing opened it, pinned to `etag`. A load reads it as it is, without a
    /// request to open it again (a GET of a replaced object fails: every GET asks for the pinned ETag).
    pub object: Option<std::sync::Arc<weightlift_remote::Object>>,
}

/// An object's bytes before its tensor data, kept from parsing: a load that writes the object's local copy
/// (`remote_cache_dir`) writes its header from here instead of fetching it again. Shared, so cheap to clone.
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderBytes(pub Arc<[u8]>);

impl std::fmt::Debug for HeaderBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HeaderBytes({} bytes)", self.0.len())
    }
}

/// One tensor: its name, type, shape and the absolute byte range that holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    /// Its name in the checkpoint.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Row-major shape, innermost dimension last (GGUF dims are stored innermost first and are reversed here).
    pub shape: Vec<u64>,
    /// Index into [`TensorIndex::files`].
    pub file: usize,
    /// Absolute byte offset in the file.
    pub offset: u64,
    /// Bytes it spans.
    pub nbytes: u64,
}

impl TensorEntry {
    /// Absolute offset one past its last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.nbytes
    }

    /// Elements in it (the product of the shape; 1 for a scalar).
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// Every tensor of a checkpoint of one or several files, in file order then offset order.
#[derive(Clone, Debug, Default)]
pub struct TensorIndex {
    /// The files, in the order given.
    pub files: Vec<SourceFile>,
    /// The tensors, in file order then offset order.
    pub tensors: Vec<TensorEntry>,
}

impl TensorIndex {
    /// The single format of every file, or `None` for an empty or mixed index.
    pub fn format(&self) -> Option<Format> {
        let first = self.files.first()?.format;
        self.files.iter().all(|f| f.format == first).then_some(first)
    }

    /// Bytes of all tensors together.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.nbytes).sum()
    }

    /// The tensor called `name`, if any.
    pub fn get(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Joins indexes of separate files into one, rejecting a tensor name held by two files.
    pub fn merge(parts: Vec<TensorIndex>) -> Result<TensorIndex, FormatError> {
        let mut merged = TensorIndex::default();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for part in parts {
            let base = merged.files.len();
            merged.files.extend(part.files);
            for mut t in part.tensors {
                t.file += base;
                if let Some(&first) = seen.get(&t.name) {
                    let (first, second) = (merged.files[first].path.clone(), merged.files[t.file].path.clone());
                    let kind = ErrorKind::DuplicateAcrossFiles { tensor: t.name, first, second: second.clone() };
                    return Err(FormatError::new(second, kind));
                }
                seen.insert(t.name.clone(), t.file);
                merged.tensors.push(t);
            }
        }
        Ok(merged)
    }
}
