//! Raw files: the whole file (or its first `count` elements) as one 1-D tensor of a caller-given dtype, as
//! dstorage-gpu's `load_tensor(path, num_elements, dtype)` reads it.

use std::path::Path;

use crate::dtype::DType;
use crate::error::{ErrorKind, FormatError};
use crate::index::{Format, Metadata, SourceFile, TensorEntry, TensorIndex};
use crate::input::Input;

/// How to read a raw file: its dtype and, optionally, how many elements to take from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawSpec {
    /// The element type of the whole file.
    pub dtype: DType,
    /// `None` takes the whole file, which must then hold a whole number of elements.
    pub count: Option<u64>,
}

/// Describes a raw file as one tensor named after the file.
pub fn read(path: impl AsRef<Path>, spec: RawSpec) -> Result<TensorIndex, FormatError> {
    read_input(&Input::open(path.as_ref())?, spec)
}

pub(crate) fn read_input(input: &Input, spec: RawSpec) -> Result<TensorIndex, FormatError> {
    let dtype = spec.dtype;
    let invalid = |count, reason| input.err(ErrorKind::RawInvalid { count, dtype: dtype.name(), reason });
    if matches!(dtype, DType::Ggml(_)) {
        return Err(invalid(spec.count.unwrap_or(0), "block-quantized types cannot be read as raw elements"));
    }
    let bits = dtype.bits().unwrap_or(8);
    let count = match spec.count {
        Some(c) => c,
        None => {
            let whole = input.len.checked_mul(8).map(|b| b / bits);
            match whole {
                Some(c) if c * bits == input.len * 8 => c,
                _ => return Err(invalid(input.len, "the file length is not a whole number of elements")),
            }
        }
    };
    let need = match dtype.byte_size(&[count]) {
        Ok(n) => n,
        Err(_) => return Err(invalid(count, "the element count does not give a whole number of bytes")),
    };
    if need > input.len {
        return Err(input.err(ErrorKind::RawTooShort { count, dtype: dtype.name(), need, have: input.len }));
    }
    let name = input.path.file_name().map_or_else(|| "data".to_string(), |n| n.to_string_lossy().into_owned());
    let file = SourceFile {
        path: input.path.clone(),
        format: Format::Raw,
        len: input.len,
        data_start: 0,
        metadata: Metadata::None,
        gguf_version: None,
        etag: input.etag(),
        header: None,
        object: input.object(),
    };
    let tensor = TensorEntry { name, dtype, shape: vec![count], file: 0, offset: 0, nbytes: need };
    Ok(TensorIndex { files: vec![file], tensors: vec![tensor] })
}
