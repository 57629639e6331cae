//! safetensors: `u64 LE header length | JSON header | data`, read from a bounded prefix and validated against the
//! file length before any tensor byte is touched; and a writer whose output the upstream `safetensors` package reads.
//!
//! Hand-written rather than built on the `safetensors` crate: that crate reads the header from a buffer holding the
//! whole file, reports gaps, overlaps and out-of-range offsets as one error, and writes no aligned layout; weightlift
//! needs a header-only read, one specific error per defect and 4 KiB-aligned tensor starts.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io::{self, Write};
use std::path::Path;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;
use weightlift_remote::Location;

use crate::dtype::DType;
use crate::dtype::expected_size;
use crate::error::{ErrorKind, FormatError};
use crate::index::{Format, Metadata, SourceFile, TensorEntry, TensorIndex};
use crate::input::Input;

/// Upstream's cap on the JSON header (safetensors `MAX_HEADER_SIZE`).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;
/// `__metadata__` key that marks a file written with aligned tensor starts; its value is the alignment.
pub const ALIGN_KEY: &str = "weightlift.align";
/// Name prefix of the U8 tensors that fill the gaps an aligned layout leaves. Upstream readers see them as
/// ordinary tensors; weightlift's reader leaves them out of the index when the file carries [`ALIGN_KEY`].
pub const PAD_PREFIX: &str = "__weightlift_pad_";

/// Reads and validates the header of a safetensors file.
pub fn read(path: impl AsRef<Path>) -> Result<TensorIndex, FormatError> {
    let input = Input::open(path.as_ref())?;
    read_input(&input)
}

/// [`read`] of a location (a local file, or an object opened with one GET of its first bytes).
pub fn read_at(location: &Location) -> Result<TensorIndex, FormatError> {
    read_input(&Input::open_at(location)?)
}

pub(crate) fn read_input(input: &Input) -> Result<TensorIndex, FormatError> {
    if input.len < 8 {
        return Err(input.err(ErrorKind::HeaderTooSmall { file_len: input.len }));
    }
    let mut len_bytes = [0u8; 8];
    input.read_at(0, &mut len_bytes, "header length")?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES {
        return Err(input.err(ErrorKind::HeaderTooLarge { len: header_len, max: MAX_HEADER_BYTES }));
    }
    if 8 + header_len > input.len {
        return Err(input.err(ErrorKind::HeaderPastEnd { header_len, file_len: input.len }));
    }
    let header = input.read_vec(8, header_len, "header")?;
    let data_start = 8 + header_len;
    let (tensors, metadata) = parse_header(&header, input.len - data_start).map_err(|k| input.err(k))?;
    let tensors = tensors
        .into_iter()
        .map(|t| TensorEntry {
            name: t.name,
            dtype: t.dtype,
            shape: t.shape,
            file: 0,
            offset: data_start + t.begin,
            nbytes: t.end - t.begin,
        })
        .collect();
    let file = SourceFile {
        path: input.path.clone(),
        format: Format::Safetensors,
        len: input.len,
        data_start,
        metadata: Metadata::Safetensors(metadata),
        gguf_version: None,
        etag: input.etag(),
        header: input.header_bytes(data_start),
        object: input.object(),
    };
    Ok(TensorIndex { files: vec![file], tensors })
}

struct Parsed {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    begin: u64,
    end: u64,
}

/// Parses and validates a header whose data section holds `data_len` bytes. Returns the tensors in offset order
/// (padding tensors of an aligned file left out) and the `__metadata__` map.
fn parse_header(header: &[u8], data_len: u64) -> Result<(Vec<Parsed>, BTreeMap<String, String>), ErrorKind> {
    let text =
        std::str::from_utf8(header).map_err(|e| ErrorKind::HeaderNotUtf8 { offset: 8 + e.valid_up_to() as u64 })?;
    let mut de = serde_json::Deserializer::from_str(text);
    let entries = de.deserialize_map(EntriesVisitor).map_err(|e| ErrorKind::HeaderJson { message: e.to_string() })?;
    de.end().map_err(|e| ErrorKind::HeaderJson { message: e.to_string() })?;

    let mut seen = HashSet::new();
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        if !seen.insert(name.clone()) {
            return Err(ErrorKind::DuplicateName { tensor: name });
        }
        if name == "__metadata__" {
            let Value::Object(map) = value else {
                return Err(ErrorKind::MetadataNotString { key: "__metadata__".into() });
            };
            for (k, v) in map {
                let Value::String(v) = v else { return Err(ErrorKind::MetadataNotString { key: k }) };
                metadata.insert(k, v);
            }
            continue;
        }
        tensors.push(parse_entry(name, value)?);
    }

    // Coverage: sorted by (begin, end), each tensor must start exactly where the previous one ended.
    tensors.sort_by_key(|t| (t.begin, t.end));
    let mut cursor = 0u64;
    let mut prev: Option<&str> = None;
    for t in &tensors {
        if t.end > data_len {
            return Err(ErrorKind::OffsetPastEnd { tensor: t.name.clone(), end: t.end, data_len });
        }
        if t.begin < cursor {
            let other = prev.unwrap_or_default().to_string();
            return Err(ErrorKind::Overlap { tensor: t.name.clone(), other, at: t.begin });
        }
        if t.begin > cursor {
            let where_ = match prev {
                Some(p) => format!("between {p:?} and {:?}", t.name),
                None => format!("before the first tensor {:?}", t.name),
            };
            return Err(ErrorKind::Uncovered { start: cursor, end: t.begin, where_ });
        }
        cursor = t.end;
        prev = Some(&t.name);
    }
    if cursor < data_len {
        let where_ = match prev {
            Some(p) => format!("after the last tensor {p:?}"),
            None => "in a file with no tensors".to_string(),
        };
        return Err(ErrorKind::Uncovered { start: cursor, end: data_len, where_ });
    }

    if metadata.contains_key(ALIGN_KEY) {
        tensors.retain(|t| !is_padding(&t.name, t.dtype, &t.shape));
    }
    Ok((tensors, metadata))
}

fn is_padding(name: &str, dtype: DType, shape: &[u64]) -> bool {
    name.starts_with(PAD_PREFIX) && dtype == DType::U8 && shape.len() == 1
}

fn parse_entry(name: String, value: Value) -> Result<Parsed, ErrorKind> {
    let invalid = |message: &str| ErrorKind::InvalidEntry { tensor: name.clone(), message: message.to_string() };
    let Value::Object(obj) = value else { return Err(invalid("entry is not a JSON object")) };
    let Some(Value::String(dtype_name)) = obj.get("dtype") else {
        return Err(invalid("missing or non-string \"dtype\""));
    };
    let Some(dtype) = DType::from_safetensors_name(dtype_name) else {
        return Err(ErrorKind::UnknownDtype { tensor: name.clone(), dtype: dtype_name.clone() });
    };
    let Some(Value::Array(dims)) = obj.get("shape") else {
        return Err(invalid("missing or non-array \"shape\""));
    };
    let shape: Vec<u64> = dims
        .iter()
        .map(Value::as_u64)
        .collect::<Option<_>>()
        .ok_or_else(|| invalid("\"shape\" must hold non-negative integers"))?;
    let offsets = match obj.get("data_offsets") {
        Some(Value::Array(o)) if o.len() == 2 => o,
        _ => return Err(invalid("\"data_offsets\" must be an array of two integers")),
    };
    let (Some(begin), Some(end)) = (offsets[0].as_u64(), offsets[1].as_u64()) else {
        return Err(invalid("\"data_offsets\" must hold non-negative integers"));
    };
    if end < begin {
        return Err(ErrorKind::OffsetsReversed { tensor: name, begin, end });
    }
    let expected = expected_size(&name, dtype, &shape)?;
    if end - begin != expected {
        return Err(ErrorKind::SizeMismatch {
            tensor: name,
            dtype: dtype.name(),
            shape,
            expected,
            actual: end - begin,
        });
    }
    Ok(Parsed { name, dtype, shape, begin, end })
}

/// Collects the top-level header object as an ordered list, so that a repeated key is seen rather than silently
/// replaced (which is what deserializing into a map would do).
struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Vec<(String, Value)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object mapping tensor names to entries")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Value>()? {
            out.push((k, v));
        }
        Ok(out)
    }
}

/// A tensor to be written: name, dtype and shape; its bytes come from the caller at write time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Its name in the header.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its shape, row-major.
    pub shape: Vec<u64>,
}

impl TensorSpec {
    /// A tensor called `name` of `dtype` and `shape`.
    pub fn new(name: impl Into<String>, dtype: DType, shape: Vec<u64>) -> TensorSpec {
        TensorSpec { name: name.into(), dtype, shape }
    }
}

/// Where every byte of a safetensors file goes, computed before any byte is written.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The 8-byte length and the padded JSON header.
    pub header: Vec<u8>,
    /// The tensors in file order with absolute offsets (`file` is 0).
    pub tensors: Vec<TensorEntry>,
    /// Absolute ranges of padding tensors (written as zeros).
    pub pads: Vec<(u64, u64)>,
    /// Bytes of the whole file.
    pub file_len: u64,
}

/// Lays out a safetensors file. `align` is 8 for upstream's layout (data section aligned to 8 bytes, tensors
/// packed), or a larger power of two to start every non-empty tensor at a multiple of it.
pub fn layout(specs: &[TensorSpec], metadata: &BTreeMap<String, String>, align: u64) -> Result<Layout, ErrorKind> {
    if align < 8 || !align.is_power_of_two() {
        return Err(ErrorKind::Unwritable {
            tensor: String::new(),
            reason: format!("alignment {align} is not a power of two ≥ 8"),
        });
    }
    let mut metadata = metadata.clone();
    if align > 8 {
        metadata.insert(ALIGN_KEY.to_string(), align.to_string());
    }
    let mut names = HashSet::new();
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), serde_json::to_value(&metadata).unwrap_or_default());
    }
    let mut rel = Vec::with_capacity(specs.len());
    let mut pads = Vec::new();
    let mut cursor = 0u64;
    for spec in specs {
        let unwritable = |reason: String| ErrorKind::Unwritable { tensor: spec.name.clone(), reason };
        if spec.name == "__metadata__" || (align > 8 && spec.name.starts_with(PAD_PREFIX)) {
            return Err(unwritable("the name is reserved".into()));
        }
        if !names.insert(spec.name.as_str()) {
            return Err(ErrorKind::DuplicateName { tensor: spec.name.clone() });
        }
        if matches!(spec.dtype, DType::Ggml(_)) {
            return Err(unwritable(format!("safetensors has no dtype {}", spec.dtype)));
        }
        let nbytes = expected_size(&spec.name, spec.dtype, &spec.shape)?;
        let misalign = cursor % align;
        if align > 8 && nbytes > 0 && misalign != 0 {
            let pad = align - misalign;
            let name = format!("{PAD_PREFIX}{}", pads.len());
            header.insert(name, entry_json(DType::U8, &[pad], cursor, cursor + pad));
            pads.push((cursor, pad));
            cursor += pad;
        }
        let end = cursor.checked_add(nbytes).ok_or_else(|| unwritable("file size overflows".into()))?;
        header.insert(spec.name.clone(), entry_json(spec.dtype, &spec.shape, cursor, end));
        rel.push((cursor, nbytes));
        cursor = end;
    }
    let mut json = serde_json::to_vec(&header)
        .map_err(|e| ErrorKind::Unwritable { tensor: String::new(), reason: e.to_string() })?;
    // Pad the header with spaces (valid JSON whitespace, as upstream does) so the data section starts aligned.
    let padded = (8 + json.len() as u64).next_multiple_of(align) - 8;
    json.resize(padded as usize, b' ');
    let data_start = 8 + padded;
    let mut bytes = Vec::with_capacity(json.len() + 8);
    bytes.extend_from_slice(&padded.to_le_bytes());
    bytes.extend_from_slice(&json);
    let tensors = specs
        .iter()
        .zip(rel)
        .map(|(s, (begin, nbytes))| TensorEntry {
            name: s.name.clone(),
            dtype: s.dtype,
            shape: s.shape.clone(),
            file: 0,
            offset: data_start + begin,
            nbytes,
        })
        .collect();
    let pads = pads.into_iter().map(|(b, n)| (data_start + b, n)).collect();
    Ok(Layout { header: bytes, tensors, pads, file_len: data_start + cursor })
}

fn entry_json(dtype: DType, shape: &[u64], begin: u64, end: u64) -> Value {
    serde_json::json!({ "dtype": dtype.name(), "shape": shape, "data_offsets": [begin, end] })
}

impl Layout {
    /// Writes the whole file to `out`: header, then every tensor in file order, asking `fill` for the bytes of
    /// each tensor in pieces of at most `piece` bytes (`fill(tensor_index, offset_in_tensor, buffer)`).
    pub fn write_to<W: Write>(
        &self,
        out: &mut W,
        piece: usize,
        fill: impl FnMut(usize, u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        crate::writer::write_file(out, &self.header, &self.tensors, self.file_len, piece, fill)
    }
}

/// Serializes tensors held in memory into a complete safetensors file image.
pub fn serialize(
    tensors: &[(TensorSpec, &[u8])],
    metadata: &BTreeMap<String, String>,
    align: u64,
) -> Result<Vec<u8>, ErrorKind> {
    let specs: Vec<TensorSpec> = tensors.iter().map(|(s, _)| s.clone()).collect();
    let layout = layout(&specs, metadata, align)?;
    for ((spec, data), laid) in tensors.iter().zip(&layout.tensors) {
        if data.len() as u64 != laid.nbytes {
            let reason =
                format!("{} × {:?} needs {} bytes but {} were given", spec.dtype, spec.shape, laid.nbytes, data.len());
            return Err(ErrorKind::Unwritable { tensor: spec.name.clone(), reason });
        }
    }
    let mut out = Vec::with_capacity(layout.file_len as usize);
    layout
        .write_to(&mut out, 1 << 20, |i, off, buf| {
            let off = off as usize;
            buf.copy_from_slice(&tensors[i].1[off..off + buf.len()]);
            Ok(())
        })
        .map_err(ErrorKind::Write)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(json: &str) -> Vec<u8> {
        json.as_bytes().to_vec()
    }

    #[test]
    fn parses_and_orders_by_offset() {
        let h = header(
            r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"__metadata__":{"k":"v"}}"#,
        );
        let (t, m) = parse_header(&h, 12).unwrap();
        assert_eq!(t.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(m.get("k").map(String::as_str), Some("v"));
    }

    #[test]
    fn rejects_duplicates_even_though_json_maps_would_merge_them() {
        let h = header(
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
        );
        assert!(matches!(parse_header(&h, 2), Err(ErrorKind::DuplicateName { .. })));
    }

    #[test]
    fn aligned_layout_round_trips_and_hides_padding() {
        let specs = vec![
            TensorSpec::new("x", DType::F32, vec![3]),
            TensorSpec::new("empty", DType::F16, vec![0]),
            TensorSpec::new("y", DType::BF16, vec![5, 7]),
        ];
        let lay = layout(&specs, &BTreeMap::new(), 4096).unwrap();
        for t in &lay.tensors {
            assert!(t.nbytes == 0 || t.offset % 4096 == 0, "{t:?}");
        }
        let data_start = lay.header.len() as u64;
        assert_eq!(data_start % 4096, 0);
        let json = &lay.header[8..];
        let (parsed, meta) = parse_header(json, lay.file_len - data_start).unwrap();
        assert_eq!(meta.get(ALIGN_KEY).map(String::as_str), Some("4096"));
        let names: Vec<_> = parsed.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["x", "empty", "y"]);
    }
}
