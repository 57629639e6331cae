//! GGUF (versions 2 and 3): header, metadata key/values, tensor infos and the aligned data section; and a writer
//! whose output the `gguf` Python package reads.
//!
//! Every count and length read from the file is checked against the bytes left in the file before anything is
//! allocated for it, so a hostile header fails with a specific error instead of exhausting memory.

use std::collections::HashSet;
use std::io::{self, BufReader, Read, Write};
use std::path::Path;

use crate::dtype::GgmlType;
use crate::dtype::expected_size;
use crate::error::{ErrorKind, FormatError};
use crate::index::{Format, Metadata, SourceFile, TensorEntry, TensorIndex};
use crate::input::{Input, Sequential};
pub use crate::metadata::{GgufArray, GgufValue};

/// The first four bytes of every GGUF file.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Tensor data alignment when the file has no `general.alignment` key.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// Deepest array nesting accepted in metadata (real files nest at most once).
pub const MAX_NESTING: usize = 8;

/// Smallest encoding of a value of a type: used to bound array counts by the bytes left in the file.
fn min_encoded_size(type_id: u32) -> u64 {
    match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => 1,
    }
}

/// A position-tracking reader over the file that refuses to read past its end.
struct Cursor {
    input_len: u64,
    reader: BufReader<Sequential>,
    pos: u64,
}

impl Cursor {
    fn remaining(&self) -> u64 {
        self.input_len - self.pos
    }

    fn bytes<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ErrorKind> {
        let mut buf = [0u8; N];
        self.fill(&mut buf, what)?;
        Ok(buf)
    }

    fn fill(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), ErrorKind> {
        let end = self.pos + buf.len() as u64;
        if end > self.input_len {
            return Err(ErrorKind::Truncated { what, offset: self.pos, end, file_len: self.input_len });
        }
        self.reader.read_exact(buf).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                ErrorKind::Truncated { what, offset: self.pos, end, file_len: self.input_len }
            } else {
                ErrorKind::Read { offset: self.pos, cause: e }
            }
        })?;
        self.pos = end;
        Ok(())
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, ErrorKind> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, ErrorKind> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }

    fn string(&mut self, what: &'static str) -> Result<String, ErrorKind> {
        let offset = self.pos;
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(ErrorKind::StringTooLong { len, offset, remaining: self.remaining() });
        }
        let mut buf = vec![0u8; len as usize];
        self.fill(&mut buf, what)?;
        Ok(match String::from_utf8(buf) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in what is left of the file.
    fn check_count(&self, what: &'static str, count: u64, min_size: u64, offset: u64) -> Result<(), ErrorKind> {
        if count.saturating_mul(min_size) > self.remaining() {
            return Err(ErrorKind::CountTooLarge { what, count, offset, remaining: self.remaining() });
        }
        Ok(())
    }

    fn value(&mut self, key: &str, type_id: u32, depth: usize) -> Result<GgufValue, ErrorKind> {
        let offset = self.pos;
        Ok(match type_id {
            0 => GgufValue::U8(u8::from_le_bytes(self.bytes("metadata value")?)),
            1 => GgufValue::I8(i8::from_le_bytes(self.bytes("metadata value")?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.bytes("metadata value")?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.bytes("metadata value")?)),
            4 => GgufValue::U32(u32::from_le_bytes(self.bytes("metadata value")?)),
            5 => GgufValue::I32(i32::from_le_bytes(self.bytes("metadata value")?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.bytes("metadata value")?)),
            7 => GgufValue::Bool(self.bytes::<1>("metadata value")?[0] != 0),
            8 => GgufValue::String(self.string("metadata string")?),
            9 => GgufValue::Array(self.array(key, depth)?),
            10 => GgufValue::U64(u64::from_le_bytes(self.bytes("metadata value")?)),
            11 => GgufValue::I64(i64::from_le_bytes(self.bytes("metadata value")?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.bytes("metadata value")?)),
            other => return Err(ErrorKind::UnknownValueType { key: key.to_string(), type_id: other, offset }),
        })
    }

    /// An array (its element type, count and elements), at nesting `depth`, into a vector of its element type.
    fn array(&mut self, key: &str, depth: usize) -> Result<GgufArray, ErrorKind> {
        if depth >= MAX_NESTING {
            return Err(ErrorKind::NestingTooDeep { key: key.to_string(), max: MAX_NESTING });
        }
        let offset = self.pos;
        let elem = self.u32("array element type")?;
        let count_offset = self.pos;
        let unknown = || ErrorKind::UnknownValueType { key: key.to_string(), type_id: elem, offset };
        if elem > 12 {
            return Err(unknown());
        }
        let count = self.u64("array length")?;
        self.check_count("array element", count, min_encoded_size(elem), count_offset)?;
        let mut array = GgufArray::with_capacity(elem, count as usize).ok_or_else(unknown)?;
        for _ in 0..count {
            self.push(&mut array, key, depth)?;
        }
        Ok(array)
    }

    fn push(&mut self, array: &mut GgufArray, key: &str, depth: usize) -> Result<(), ErrorKind> {
        const W: &str = "metadata value";
        match array {
            GgufArray::U8(v) => v.push(u8::from_le_bytes(self.bytes(W)?)),
            GgufArray::I8(v) => v.push(i8::from_le_bytes(self.bytes(W)?)),
            GgufArray::U16(v) => v.push(u16::from_le_bytes(self.bytes(W)?)),
            GgufArray::I16(v) => v.push(i16::from_le_bytes(self.bytes(W)?)),
            GgufArray::U32(v) => v.push(u32::from_le_bytes(self.bytes(W)?)),
            GgufArray::I32(v) => v.push(i32::from_le_bytes(self.bytes(W)?)),
            GgufArray::F32(v) => v.push(f32::from_le_bytes(self.bytes(W)?)),
            GgufArray::Bool(v) => v.push(self.bytes::<1>(W)?[0] != 0),
            GgufArray::String(v) => v.push(self.string("metadata string")?),
            GgufArray::Array(v) => v.push(self.array(key, depth + 1)?),
            GgufArray::U64(v) => v.push(u64::from_le_bytes(self.bytes(W)?)),
            GgufArray::I64(v) => v.push(i64::from_le_bytes(self.bytes(W)?)),
            GgufArray::F64(v) => v.push(f64::from_le_bytes(self.bytes(W)?)),
        }
        Ok(())
    }
}

/// Reads and validates the header, metadata and tensor infos of a GGUF file.
pub fn read(path: impl AsRef<Path>) -> Result<TensorIndex, FormatError> {
    let input = Input::open(path.as_ref())?;
    read_input(input)
}

pub(crate) fn read_input(input: Input) -> Result<TensorIndex, FormatError> {
    let path = input.path.clone();
    let len = input.len;
    let etag = input.etag();
    let object = input.object();
    let reader = Sequential { input, pos: 0 };
    let mut cur = Cursor { input_len: len, reader: BufReader::with_capacity(1 << 16, reader), pos: 0 };
    let parsed = parse(&mut cur).map_err(|k| FormatError::new(&path, k))?;
    let header = cur.reader.into_inner().input.header_bytes(parsed.data_start);
    let file = SourceFile {
        path,
        format: Format::Gguf,
        len,
        data_start: parsed.data_start,
        metadata: Metadata::Gguf(parsed.kv),
        gguf_version: Some(parsed.version),
        etag,
        header,
        object,
    };
    Ok(TensorIndex { files: vec![file], tensors: parsed.tensors })
}

struct ParsedGguf {
    version: u32,
    kv: Vec<(String, GgufValue)>,
    data_start: u64,
    tensors: Vec<TensorEntry>,
}

fn parse(cur: &mut Cursor) -> Result<ParsedGguf, ErrorKind> {
    let magic: [u8; 4] = cur.bytes("GGUF magic")?;
    if magic != MAGIC {
        return Err(ErrorKind::BadMagic { found: magic });
    }
    let version = cur.u32("GGUF version")?;
    if matches!(version.swap_bytes(), 1..=3) && !matches!(version, 1..=3) {
        return Err(ErrorKind::BigEndian);
    }
    if !matches!(version, 2 | 3) {
        return Err(ErrorKind::UnsupportedVersion { version });
    }
    let count_offset = cur.pos;
    let n_tensors = cur.u64("tensor count")?;
    let n_kv = cur.u64("metadata count")?;
    // A key/value needs at least a key length (8), a type (4) and one byte; a tensor info at least a name length
    // (8), a dimension count (4), a type (4) and an offset (8).
    cur.check_count("metadata key/value", n_kv, 13, count_offset + 8)?;
    cur.check_count("tensor", n_tensors, 24, count_offset)?;

    let mut kv = Vec::with_capacity(n_kv as usize);
    let mut keys = HashSet::new();
    for _ in 0..n_kv {
        let key = cur.string("metadata key")?;
        let type_id = cur.u32("metadata value type")?;
        let value = cur.value(&key, type_id, 0)?;
        if !keys.insert(key.clone()) {
            return Err(ErrorKind::DuplicateMetadataKey { key });
        }
        kv.push((key, value));
    }
    let alignment = match kv.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((k, v)) => {
            let Some(a) = v.as_u64() else {
                return Err(ErrorKind::MetadataType {
                    key: k.clone(),
                    expected: "an unsigned integer",
                    found: v.type_name(),
                });
            };
            if a == 0 || !a.is_power_of_two() || a % 8 != 0 {
                return Err(ErrorKind::BadAlignment { alignment: a });
            }
            a
        }
    };

    struct Info {
        name: String,
        ggml: GgmlType,
        shape: Vec<u64>,
        rel: u64,
        nbytes: u64,
    }
    let mut infos = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::new();
    for _ in 0..n_tensors {
        let name = cur.string("tensor name")?;
        let n_dims = cur.u32("tensor dimension count")?;
        if n_dims > MAX_DIMS {
            return Err(ErrorKind::TooManyDims { tensor: name, n_dims, max: MAX_DIMS });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(cur.u64("tensor dimension")?);
        }
        let type_id = cur.u32("tensor type")?;
        let Some(ggml) = GgmlType::from_id(type_id) else {
            return Err(ErrorKind::UnknownGgmlType { tensor: name, type_id });
        };
        let rel = cur.u64("tensor offset")?;
        if !names.insert(name.clone()) {
            return Err(ErrorKind::DuplicateName { tensor: name });
        }
        dims.reverse();
        let nbytes = expected_size(&name, ggml.dtype(), &dims)?;
        if rel % alignment != 0 {
            return Err(ErrorKind::TensorMisaligned { tensor: name, offset: rel, alignment });
        }
        infos.push(Info { name, ggml, shape: dims, rel, nbytes });
    }
    let data_start = cur.pos.next_multiple_of(alignment);
    let file_len = cur.input_len;

    let mut tensors: Vec<TensorEntry> = Vec::with_capacity(infos.len());
    for info in infos {
        let end = data_start.checked_add(info.rel).and_then(|o| o.checked_add(info.nbytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                let end = end.unwrap_or(u64::MAX);
                return Err(ErrorKind::TensorPastEnd { tensor: info.name, end, file_len });
            }
        }
        tensors.push(TensorEntry {
            name: info.name,
            dtype: info.ggml.dtype(),
            shape: info.shape,
            file: 0,
            offset: data_start + info.rel,
            nbytes: info.nbytes,
        });
    }
    tensors.sort_by_key(|t| (t.offset, t.nbytes));
    for pair in tensors.windows(2) {
        if pair[1].offset < pair[0].end() {
            return Err(ErrorKind::Overlap {
                tensor: pair[1].name.clone(),
                other: pair[0].name.clone(),
                at: pair[1].offset - data_start,
            });
        }
    }
    Ok(ParsedGguf { version, kv, data_start, tensors })
}

/// A tensor to be written to GGUF: `shape` is row-major (innermost last), as everywhere in weightlift.
#[derive(Clone, Debug)]
pub struct GgufTensorSpec {
    /// Its name in the file.
    pub name: String,
    /// Its ggml type.
    pub ggml: GgmlType,
    /// Its shape, innermost dimension last.
    pub shape: Vec<u64>,
}

/// Where every byte of a GGUF file goes.
#[derive(Clone, Debug)]
pub struct GgufLayout {
    /// Header, metadata and tensor infos, padded to the alignment.
    pub header: Vec<u8>,
    /// The tensors in file order with absolute offsets (`file` is 0).
    pub tensors: Vec<TensorEntry>,
    /// Bytes of the whole file.
    pub file_len: u64,
}

/// Lays out a version-3 GGUF file. The alignment is taken from `general.alignment` if `kv` holds it.
pub fn layout(kv: &[(String, GgufValue)], specs: &[GgufTensorSpec]) -> Result<GgufLayout, ErrorKind> {
    let alignment =
        kv.iter().find(|(k, _)| k == "general.alignment").and_then(|(_, v)| v.as_u64()).unwrap_or(DEFAULT_ALIGNMENT);
    if alignment == 0 || !alignment.is_power_of_two() || alignment % 8 != 0 {
        return Err(ErrorKind::BadAlignment { alignment });
    }
    let mut h = Vec::new();
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&3u32.to_le_bytes());
    h.extend_from_slice(&(specs.len() as u64).to_le_bytes());
    h.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        put_string(&mut h, k);
        h.extend_from_slice(&v.type_id().to_le_bytes());
        put_value(&mut h, v);
    }
    let mut rel = 0u64;
    let mut offsets = Vec::with_capacity(specs.len());
    let mut names = HashSet::new();
    for s in specs {
        if !names.insert(s.name.as_str()) {
            return Err(ErrorKind::DuplicateName { tensor: s.name.clone() });
        }
        if s.shape.len() > MAX_DIMS as usize {
            return Err(ErrorKind::TooManyDims { tensor: s.name.clone(), n_dims: s.shape.len() as u32, max: MAX_DIMS });
        }
        let nbytes = expected_size(&s.name, s.ggml.dtype(), &s.shape)?;
        put_string(&mut h, &s.name);
        h.extend_from_slice(&(s.shape.len() as u32).to_le_bytes());
        for d in s.shape.iter().rev() {
            h.extend_from_slice(&d.to_le_bytes());
        }
        h.extend_from_slice(&s.ggml.id().to_le_bytes());
        h.extend_from_slice(&rel.to_le_bytes());
        offsets.push((rel, nbytes));
        rel = (rel + nbytes).next_multiple_of(alignment);
    }
    let data_start = (h.len() as u64).next_multiple_of(alignment);
    h.resize(data_start as usize, 0);
    let tensors = specs
        .iter()
        .zip(offsets)
        .map(|(s, (r, n))| TensorEntry {
            name: s.name.clone(),
            dtype: s.ggml.dtype(),
            shape: s.shape.clone(),
            file: 0,
            offset: data_start + r,
            nbytes: n,
        })
        .collect::<Vec<_>>();
    let file_len = tensors.last().map_or(data_start, |t: &TensorEntry| t.end());
    Ok(GgufLayout { header: h, tensors, file_len })
}

impl GgufLayout {
    /// Writes the file: header, then each tensor's bytes from `fill(tensor_index, offset_in_tensor, buffer)`,
    /// with zero padding between tensors.
    pub fn write_to<W: Write>(
        &self,
        out: &mut W,
        piece: usize,
        fill: impl FnMut(usize, u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        crate::writer::write_file(out, &self.header, &self.tensors, self.file_len, piece, fill)
    }
}

fn put_array(h: &mut Vec<u8>, a: &GgufArray) {
    h.extend_from_slice(&a.element_type().to_le_bytes());
    h.extend_from_slice(&(a.len() as u64).to_le_bytes());
    match a {
        GgufArray::U8(v) => h.extend_from_slice(v),
        GgufArray::I8(v) => v.iter().for_each(|x| h.extend_from_slice(&x.to_le_bytes())),
        GgufArray::U16(v) => v.iter().for_each(|x| h.extend_from_slice(&x.to_le_bytes())),
        GgufArray::I16(v) => v.iter().for_each(|x| h.extend_from_slice(&x.to_le_bytes())),
        GgufArray::U32(v) => v.iter().for_each(|x| h.extend_from_slice(&x.to_le_bytes())),
        GgufArray::I32(v) => v.iter().for_each(|x| h.extend_from_slice(&x.to_le_bytes())),
        GgufArray::F32(v) => v.iter().for_each(|x| h.extend_from_slice(&x.to_le_bytes())),
        GgufArray::Bool(v) => v.iter().for_each(|&x| h.push(u8::from(x))),
        GgufArray::String(v) => v.iter().for_each(|x| put_string(h, x)),
        GgufArray::Array(v) => v.iter().for_each(|x| put_array(h, x)),
        GgufArray::U64(v) => v.iter().for_each(|x| h.extend_from_slice(&x.to_le_bytes())),
        GgufArray::I64(v) => v.iter().for_each(|x| h.extend_from_slice(&x.to_le_bytes())),
        GgufArray::F64(v) => v.iter().for_each(|x| h.extend_from_slice(&x.to_le_bytes())),
    }
}

fn put_string(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I8(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => h.push(u8::from(*x)),
        GgufValue::String(s) => put_string(h, s),
        GgufValue::Array(a) => put_array(h, a),
        GgufValue::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
    }
}
