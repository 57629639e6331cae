//! The one error type of this crate: the file it concerns and what is wrong with it.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// A checkpoint could not be read, parsed or written. Displays as one line: `PATH: what is wrong`.
#[derive(Debug)]
pub struct FormatError {
    /// The file the error concerns.
    pub path: PathBuf,
    /// What is wrong with it.
    pub kind: ErrorKind,
}

impl FormatError {
    /// An error about the file at `path`.
    pub fn new(path: impl AsRef<Path>, kind: ErrorKind) -> Self {
        FormatError { path: path.as_ref().to_path_buf(), kind }
    }
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            // An object's error names its URL already.
            ErrorKind::Remote(e) => write!(f, "{e}"),
            kind => write!(f, "{}: {kind}", self.path.display()),
        }
    }
}

// The message already includes any underlying I/O error's text, so no `source()` is reported: printing the
// error chain would repeat it. Match on `kind` to get at the `io::Error`.
impl std::error::Error for FormatError {}

/// What is wrong, with the tensor, offset and lengths involved. Each variant's fields are the values its message
/// names (shown in its documentation), so they are not documented one by one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // the fields: see above; every variant has its message as documentation
pub enum ErrorKind {
    /// Displays as `cannot open: {0}`.
    #[error("cannot open: {0}")]
    Open(io::Error),
    /// An object (a URL) could not be opened or read.
    #[error("{0}")]
    Remote(weightlift_remote::RemoteError),
    /// The path is a directory, FIFO, socket or device, not a regular file.
    #[error("{}", node.refusal())]
    NotAFile { node: crate::regular::NodeKind },
    /// Displays as `read failed at offset {offset}: {cause}`.
    #[error("read failed at offset {offset}: {cause}")]
    Read { offset: u64, cause: io::Error },
    /// Displays as `write failed: {0}`.
    #[error("write failed: {0}")]
    Write(io::Error),
    /// Displays as `file ends at {file_len} bytes, inside the {what} that needs bytes {offset}..{end}`.
    #[error("file ends at {file_len} bytes, inside the {what} that needs bytes {offset}..{end}")]
    Truncated { what: &'static str, offset: u64, end: u64, file_len: u64 },
    /// Displays as `not a safetensors, GGUF or index file (first bytes {first:02x?}); read it with --raw DTYPE`.
    #[error("not a safetensors, GGUF or index file (first bytes {first:02x?}); read it with --raw DTYPE")]
    UnknownFormat { first: Vec<u8> },

    // safetensors
    /// Displays as `file is {file_len} bytes, too small for the 8-byte safetensors header length`.
    #[error("file is {file_len} bytes, too small for the 8-byte safetensors header length")]
    HeaderTooSmall { file_len: u64 },
    /// Displays as `header length {len} exceeds the {max}-byte limit`.
    #[error("header length {len} exceeds the {max}-byte limit")]
    HeaderTooLarge { len: u64, max: u64 },
    /// Displays as `header length {header_len} runs past the end of the {file_len}-byte file`.
    #[error("header length {header_len} runs past the end of the {file_len}-byte file")]
    HeaderPastEnd { header_len: u64, file_len: u64 },
    /// Displays as `header is not UTF-8 (invalid byte at file offset {offset})`.
    #[error("header is not UTF-8 (invalid byte at file offset {offset})")]
    HeaderNotUtf8 { offset: u64 },
    /// Displays as `header is not valid JSON: {message}`.
    #[error("header is not valid JSON: {message}")]
    HeaderJson { message: String },
    /// Displays as `tensor {tensor:?}: {message}`.
    #[error("tensor {tensor:?}: {message}")]
    InvalidEntry { tensor: String, message: String },
    /// Displays as `__metadata__ must map strings to strings ({key:?} is not a string)`.
    #[error("__metadata__ must map strings to strings ({key:?} is not a string)")]
    MetadataNotString { key: String },
    /// Displays as `tensor {tensor:?} appears twice in the header`.
    #[error("tensor {tensor:?} appears twice in the header")]
    DuplicateName { tensor: String },
    /// Displays as `tensor {tensor:?} has unknown dtype {dtype:?}`.
    #[error("tensor {tensor:?} has unknown dtype {dtype:?}")]
    UnknownDtype { tensor: String, dtype: String },
    /// Displays as `tensor {tensor:?}: element or byte count of shape {shape:?} overflows 64 bits`.
    #[error("tensor {tensor:?}: element or byte count of shape {shape:?} overflows 64 bits")]
    ShapeOverflow { tensor: String, shape: Vec<u64> },
    /// Displays as `tensor {tensor:?}: {elements_desc} of {bits}-bit elements do not fill whole bytes`.
    #[error("tensor {tensor:?}: {elements_desc} of {bits}-bit elements do not fill whole bytes")]
    NotWholeBytes { tensor: String, elements_desc: String, bits: u64 },
    /// Displays as `tensor {tensor:?}: innermost dimension {inner} is not a whole number of {block}-element {dtype} blocks`.
    #[error("tensor {tensor:?}: innermost dimension {inner} is not a whole number of {block}-element {dtype} blocks")]
    NotWholeBlocks { tensor: String, dtype: &'static str, inner: u64, block: u64 },
    /// Displays as `tensor {tensor:?}: {dtype} × {shape:?} is {expected} bytes but its offsets span {actual}`.
    #[error("tensor {tensor:?}: {dtype} × {shape:?} is {expected} bytes but its offsets span {actual}")]
    SizeMismatch { tensor: String, dtype: &'static str, shape: Vec<u64>, expected: u64, actual: u64 },
    /// Displays as `tensor {tensor:?}: data_offsets [{begin}, {end}] end before they begin`.
    #[error("tensor {tensor:?}: data_offsets [{begin}, {end}] end before they begin")]
    OffsetsReversed { tensor: String, begin: u64, end: u64 },
    /// Displays as `tensor {tensor:?} ends at data offset {end}, past the {data_len}-byte data section`.
    #[error("tensor {tensor:?} ends at data offset {end}, past the {data_len}-byte data section")]
    OffsetPastEnd { tensor: String, end: u64, data_len: u64 },
    /// Displays as `tensor {tensor:?} overlaps tensor {other:?} at data offset {at}`.
    #[error("tensor {tensor:?} overlaps tensor {other:?} at data offset {at}")]
    Overlap { tensor: String, other: String, at: u64 },
    /// Displays as `data bytes {start}..{end} belong to no tensor (a gap {where_})`.
    #[error("data bytes {start}..{end} belong to no tensor (a gap {where_})")]
    Uncovered { start: u64, end: u64, where_: String },

    // sharded index
    /// Displays as `shard index: {message}`.
    #[error("shard index: {message}")]
    ShardIndex { message: String },
    /// Displays as `tensor {tensor:?} is listed in the weight_map for {shard:?} but that shard does not hold it`.
    #[error("tensor {tensor:?} is listed in the weight_map for {shard:?} but that shard does not hold it")]
    ShardTensorMissing { tensor: String, shard: String },
    /// Displays as `tensor {tensor:?} is held by both {first} and {second}`.
    #[error("tensor {tensor:?} is held by both {first} and {second}")]
    DuplicateAcrossFiles { tensor: String, first: PathBuf, second: PathBuf },

    // GGUF
    /// Displays as `bad GGUF magic {found:02x?}`.
    #[error("bad GGUF magic {found:02x?}")]
    BadMagic { found: [u8; 4] },
    /// Displays as `big-endian GGUF files are not supported`.
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    /// Displays as `GGUF version {version} is not supported (versions 2 and 3 are)`.
    #[error("GGUF version {version} is not supported (versions 2 and 3 are)")]
    UnsupportedVersion { version: u32 },
    /// Displays as `{what} count {count} at offset {offset} cannot fit in the {remaining} bytes left in the file`.
    #[error("{what} count {count} at offset {offset} cannot fit in the {remaining} bytes left in the file")]
    CountTooLarge { what: &'static str, count: u64, offset: u64, remaining: u64 },
    /// Displays as `string of {len} bytes at offset {offset} runs past the end of the file ({remaining} bytes left)`.
    #[error("string of {len} bytes at offset {offset} runs past the end of the file ({remaining} bytes left)")]
    StringTooLong { len: u64, offset: u64, remaining: u64 },
    /// Displays as `metadata key {key:?} has unknown value type {type_id} at offset {offset}`.
    #[error("metadata key {key:?} has unknown value type {type_id} at offset {offset}")]
    UnknownValueType { key: String, type_id: u32, offset: u64 },
    /// Displays as `metadata key {key:?} appears twice`.
    #[error("metadata key {key:?} appears twice")]
    DuplicateMetadataKey { key: String },
    /// Displays as `metadata key {key:?} nests arrays more than {max} deep`.
    #[error("metadata key {key:?} nests arrays more than {max} deep")]
    NestingTooDeep { key: String, max: usize },
    /// Displays as `metadata key {key:?} is {found}, expected {expected}`.
    #[error("metadata key {key:?} is {found}, expected {expected}")]
    MetadataType { key: String, expected: &'static str, found: &'static str },
    /// Displays as `general.alignment {alignment} is not a non-zero multiple of 8 and power of two`.
    #[error("general.alignment {alignment} is not a non-zero multiple of 8 and power of two")]
    BadAlignment { alignment: u64 },
    /// Displays as `tensor {tensor:?} has {n_dims} dimensions (at most {max} are allowed)`.
    #[error("tensor {tensor:?} has {n_dims} dimensions (at most {max} are allowed)")]
    TooManyDims { tensor: String, n_dims: u32, max: u32 },
    /// Displays as `tensor {tensor:?} has unknown ggml type {type_id}`.
    #[error("tensor {tensor:?} has unknown ggml type {type_id}")]
    UnknownGgmlType { tensor: String, type_id: u32 },
    /// Displays as `tensor {tensor:?} data offset {offset} is not a multiple of the alignment {alignment}`.
    #[error("tensor {tensor:?} data offset {offset} is not a multiple of the alignment {alignment}")]
    TensorMisaligned { tensor: String, offset: u64, alignment: u64 },
    /// Displays as `tensor {tensor:?} ends at byte {end}, past the end of the {file_len}-byte file`.
    #[error("tensor {tensor:?} ends at byte {end}, past the end of the {file_len}-byte file")]
    TensorPastEnd { tensor: String, end: u64, file_len: u64 },

    // raw
    /// Displays as `raw file holds {have} bytes but {count} {dtype} elements need {need}`.
    #[error("raw file holds {have} bytes but {count} {dtype} elements need {need}")]
    RawTooShort { count: u64, dtype: &'static str, need: u64, have: u64 },
    /// Displays as `raw tensor of {count} {dtype} elements: {reason}`.
    #[error("raw tensor of {count} {dtype} elements: {reason}")]
    RawInvalid { count: u64, dtype: &'static str, reason: &'static str },

    // packs (.wlpack)
    /// Displays as `not a weightlift pack (first bytes {found:02x?})`.
    #[error("not a weightlift pack (first bytes {found:02x?})")]
    PackBadMagic { found: Vec<u8> },
    /// Displays as `pack format version {version} is not supported (version 1 is)`.
    #[error("pack format version {version} is not supported (version 1 is)")]
    PackUnsupportedVersion { version: u64 },
    /// Displays as `pack header: {message}`.
    #[error("pack header: {message}")]
    PackHeader { message: String },
    /// Displays as `pack index checksum {computed:#018x} does not match the stored {stored:#018x}: the header or tables are corrupt`.
    #[error(
        "pack index checksum {computed:#018x} does not match the stored {stored:#018x}: the header or tables are corrupt"
    )]
    PackIndexChecksum { stored: u64, computed: u64 },
    /// Displays as `pack tables of {tables_len} bytes run past the end of the {file_len}-byte file`.
    #[error("pack tables of {tables_len} bytes run past the end of the {file_len}-byte file")]
    PackTablesPastEnd { tables_len: u64, file_len: u64 },
    /// Displays as `pack names file {name:?}, which is not a plain, unique file name`.
    #[error("pack names file {name:?}, which is not a plain, unique file name")]
    PackFileName { name: String },
    /// Displays as `pack item {item:?}: {message}`.
    #[error("pack item {item:?}: {message}")]
    PackItem { item: String, message: String },
    /// Displays as `packed file {file:?}, bytes {start}..{end}: {message}`.
    #[error("packed file {file:?}, bytes {start}..{end}: {message}")]
    PackCoverage { file: String, start: u64, end: u64, message: String },
    /// Displays as `pack item {item:?}, chunk {chunk}: {message}`.
    #[error("pack item {item:?}, chunk {chunk}: {message}")]
    PackChunk { item: String, chunk: u64, message: String },
    /// Displays as `pack stream {stream}: {message}`.
    #[error("pack stream {stream}: {message}")]
    PackStream { stream: u64, message: String },
    /// Displays as `pack bytes {start}..{end} belong to no stream`.
    #[error("pack bytes {start}..{end} belong to no stream")]
    PackTrailing { start: u64, end: u64 },

    // writers
    /// Displays as `cannot write tensor {tensor:?}: {reason}`.
    #[error("cannot write tensor {tensor:?}: {reason}")]
    Unwritable { tensor: String, reason: String },
    /// Displays as `is the same file as the input {}: refusing to write over it`.
    #[error("is the same file as the input {}: refusing to write over it", input.display())]
    OutputIsInput { input: PathBuf },
    /// Displays as `is a {node}, not a regular file: refusing to replace it`.
    #[error("is a {node}, not a regular file: refusing to replace it")]
    OutputNotAFile { node: crate::regular::NodeKind },
}
