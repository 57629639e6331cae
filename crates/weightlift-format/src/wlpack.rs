//! `.wlpack`: a checkpoint whose tensors are split into byte planes and compressed chunk by chunk, so that the
//! compressed bytes can be streamed to a GPU and decompressed there (weightlift's own kernel reads its Huffman
//! streams; nvCOMP's batched decoders read the same standard zstd, LZ4 and raw-deflate streams the CPU codecs write),
//! and which gives back the original files byte for byte.
//!
//! ```text
//! 0        magic "WLPACK\0\x01" | u64 LE header length | u64 LE tables length | u64 LE xxh3-64 of (header ‖ tables)
//! 32       JSON header, padded with spaces to a multiple of 16 bytes
//!          chunk table: `chunks` records of 32 bytes  (raw offset in item, raw length, xxh3-64 of raw bytes,
//!                                                       first stream)
//!          stream table: `streams` records of 32 bytes (file offset, stored length, plane length, codec, plane)
//! align 16 stream data: every stream starts at a multiple of 16, in table order, up to the end of the file
//! ```
//!
//! The header names the original files and lists *items*: every tensor (name, dtype, shape, where it sat in its
//! file) and every gap between tensors (the original header, padding, GGUF metadata). Items tile each original file
//! exactly, so unpacking rebuilds it byte for byte. Each item is cut into chunks of whole elements; a chunk of an
//! item with `planes = k` is stored as k streams, stream j holding byte j of every k-byte group (the exponent bytes
//! of bf16 weights land in one stream, the mantissa bytes in another). Each chunk carries the xxh3-64 of its raw
//! bytes, checked after decoding.
//!
//! The reader validates like the safetensors reader: bounded header read, checked arithmetic, the tables' size
//! checked against the file before they are read, full coverage of every original file and of the data section.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::path::Path;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use crate::dtype::DType;
use crate::dtype::expected_size;
use crate::error::{ErrorKind, FormatError};
use crate::input::Input;
use crate::safetensors::MAX_HEADER_BYTES;

/// The first 8 bytes of a pack; the last byte is the major version.
pub const MAGIC: [u8; 8] = *b"WLPACK\0\x01";
/// Bytes before the JSON header.
pub const PREAMBLE_BYTES: u64 = 32;
/// Bytes per chunk or stream record.
pub const RECORD_BYTES: u64 = 32;
/// Every stream starts at a multiple of this (nvCOMP's decoders need up to 16-byte aligned inputs).
pub const STREAM_ALIGN: u64 = 16;
/// Largest raw chunk (nvCOMP's LZ4 and ANS compressors take at most 16 MiB per chunk).
pub const MAX_CHUNK_BYTES: u64 = 16 << 20;
/// The only checksum this version writes.
pub const CHECKSUM: &str = "xxh3-64";

/// How a stream's bytes are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Codec {
    /// The plane's bytes as they are.
    Raw,
    /// One zstd frame (RFC 8878), no dictionary.
    Zstd,
    /// One LZ4 block (no frame), as `LZ4_compress_default` writes.
    Lz4,
    /// Raw deflate (RFC 1951), no zlib or gzip wrapper.
    Deflate,
    /// weightlift's canonical Huffman stream (`weightlift_pack::huffman`): byte symbols, codes of at most 11 bits,
    /// the plane cut into independent 1 KiB segments so that a GPU decodes them in parallel with no library
    /// (weightlift's own kernel, not nvCOMP).
    Huffman,
}

impl Codec {
    /// Every codec, in id order.
    pub const ALL: [Codec; 5] = [Codec::Raw, Codec::Zstd, Codec::Lz4, Codec::Deflate, Codec::Huffman];

    /// The codec's id in the pack's stream table.
    pub fn id(self) -> u8 {
        match self {
            Codec::Raw => 0,
            Codec::Zstd => 1,
            Codec::Lz4 => 2,
            Codec::Deflate => 3,
            Codec::Huffman => 4,
        }
    }

    /// The codec of a stream-table id, if known.
    pub fn from_id(id: u8) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.id() == id)
    }

    /// The lowercase name the CLI and reports use.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Zstd => "zstd",
            Codec::Lz4 => "lz4",
            Codec::Deflate => "deflate",
            Codec::Huffman => "huffman",
        }
    }

    /// Whether the GPU decodes this codec with nvCOMP (the others: stored raw, or weightlift's own kernel).
    pub fn needs_nvcomp(self) -> bool {
        match self {
            Codec::Zstd | Codec::Lz4 | Codec::Deflate => true,
            Codec::Raw | Codec::Huffman => false,
        }
    }

    /// The codec called `name` (any case).
    pub fn parse(name: &str) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.name().eq_ignore_ascii_case(name))
    }
}

/// One original file the pack rebuilds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackedFile {
    /// Plain file name (no directory part).
    pub name: String,
    /// Its length in bytes.
    pub len: u64,
}

/// What an item is: a tensor, or the bytes between tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemKind {
    /// A tensor of the original checkpoint.
    Tensor {
        /// Its name.
        name: String,
        /// Its element type, which decides how its bytes are split into planes.
        dtype: DType,
        /// Its shape, row-major.
        shape: Vec<u64>,
    },
    /// Bytes between or around tensors (headers, padding), kept so the original files can be rebuilt.
    Gap,
}

/// A byte range of an original file and the chunks that hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// A tensor or a gap.
    pub kind: ItemKind,
    /// Index into [`PackIndex::files`].
    pub file: usize,
    /// Offset in the original file.
    pub offset: u64,
    /// Bytes of the range.
    pub nbytes: u64,
    /// Byte planes per element group (1, 2, 4 or 8).
    pub planes: u8,
    /// Indices into [`PackIndex::chunks`].
    pub chunks: Range<usize>,
}

impl Item {
    /// The tensor's name, or a description of the gap.
    pub fn label(&self, files: &[PackedFile]) -> String {
        match &self.kind {
            ItemKind::Tensor { name, .. } => name.clone(),
            ItemKind::Gap => {
                let file = files.get(self.file).map_or("?", |f| f.name.as_str());
                format!("bytes {}..{} of {file}", self.offset, self.offset + self.nbytes)
            }
        }
    }

    /// The tensor's name; `None` for a gap.
    pub fn tensor_name(&self) -> Option<&str> {
        match &self.kind {
            ItemKind::Tensor { name, .. } => Some(name),
            ItemKind::Gap => None,
        }
    }
}

/// A run of an item's raw bytes, stored as one stream per plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Offset within the item.
    pub raw_offset: u64,
    /// Bytes of the chunk before splitting into planes.
    pub raw_len: u64,
    /// xxh3-64 (seed 0) of the chunk's raw bytes.
    pub checksum: u64,
    /// Index of the chunk's first stream; its `planes` streams follow in plane order.
    pub first_stream: u64,
}

/// One plane of one chunk, as stored in the pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream {
    /// Absolute offset in the pack file.
    pub offset: u64,
    /// Bytes stored in the pack (compressed, or raw).
    pub stored_len: u64,
    /// Length of the plane once decoded (`chunk.raw_len / planes`).
    pub raw_len: u64,
    /// How the stored bytes are encoded.
    pub codec: Codec,
    /// Which byte plane of the chunk it holds.
    pub plane: u8,
}

impl Stream {
    /// Absolute offset one past its stored bytes.
    pub fn end(&self) -> u64 {
        self.offset + self.stored_len
    }
}

/// Everything a pack's header and tables say, validated.
#[derive(Clone, Debug)]
pub struct PackIndex {
    /// What the original checkpoint was: `safetensors`, `safetensors-sharded` or `gguf`.
    pub source: String,
    /// The original files, in order.
    pub files: Vec<PackedFile>,
    /// Tensors first (in the original file order), then gaps.
    pub items: Vec<Item>,
    /// Every chunk, items in order.
    pub chunks: Vec<Chunk>,
    /// Every stored stream, chunks in order.
    pub streams: Vec<Stream>,
    /// The original safetensors `__metadata__` (informational; the original bytes are in a gap).
    pub metadata: BTreeMap<String, String>,
    /// Where stream data starts.
    pub data_start: u64,
    /// Length of the pack file.
    pub len: u64,
    /// For a pack read from an object (a URL): the ETag it had when its tables were read.
    pub etag: Option<String>,
    /// For a pack read from an object: the object as it was opened (a load reads it without opening it again).
    pub object: Option<std::sync::Arc<weightlift_remote::Object>>,
}

impl PackIndex {
    /// The items that are tensors, in the original file order.
    pub fn tensors(&self) -> impl Iterator<Item = &Item> {
        self.items.iter().filter(|i| matches!(i.kind, ItemKind::Tensor { .. }))
    }

    /// The streams of chunk `c`.
    pub fn chunk_streams(&self, c: usize, planes: u8) -> &[Stream] {
        let first = self.chunks[c].first_stream as usize;
        &self.streams[first..first + planes as usize]
    }

    /// Total stored bytes of stream data.
    pub fn stored_bytes(&self) -> u64 {
        self.streams.iter().map(|s| s.stored_len).sum()
    }

    /// Total bytes of the original files.
    pub fn raw_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderJson {
    wlpack: u64,
    checksum: String,
    source: String,
    files: Vec<PackedFile>,
    tensors: Vec<TensorJson>,
    gaps: Vec<GapJson>,
    chunks: u64,
    streams: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TensorJson {
    name: String,
    dtype: String,
    shape: Vec<u64>,
    file: u64,
    offset: u64,
    nbytes: u64,
    planes: u8,
    /// `[first, count]` in the chunk table.
    chunks: [u64; 2],
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GapJson {
    file: u64,
    offset: u64,
    nbytes: u64,
    chunks: [u64; 2],
}

/// The planes a dtype is split into: its element size for the plain types of 2, 4 or 8 bytes (a complex number as
/// two 4-byte floats), 1 for everything else (bytes, packed sub-byte floats, quantized blocks).
pub fn planes_for(dtype: DType) -> u8 {
    match dtype {
        DType::C64 => 4,
        DType::Ggml(_) => 1,
        d => match d.element_bytes() {
            Some(n @ (2 | 4 | 8)) => n as u8,
            _ => 1,
        },
    }
}

/// Cuts an item of `nbytes` into chunks of `plane_chunk` bytes per plane: `(raw_offset, raw_len)` each.
pub fn plan_chunks(nbytes: u64, planes: u8, plane_chunk: u64) -> Vec<(u64, u64)> {
    let planes = u64::from(planes.max(1));
    let step = plane_chunk.clamp(1, MAX_CHUNK_BYTES / planes) * planes;
    let mut out = Vec::with_capacity(nbytes.div_ceil(step) as usize);
    let mut at = 0;
    while at < nbytes {
        let len = step.min(nbytes - at);
        out.push((at, len));
        at += len;
    }
    out
}

fn read_record(bytes: &[u8]) -> [u64; 4] {
    let mut out = [0u64; 4];
    for (i, w) in out.iter_mut().enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
        *w = u64::from_le_bytes(b);
    }
    out
}

/// Reads and validates a pack's header and tables.
pub fn read(path: impl AsRef<Path>) -> Result<PackIndex, FormatError> {
    let input = Input::open(path.as_ref())?;
    read_input(&input)
}

/// Whether a file starts with the pack magic.
pub fn is_pack(head: &[u8]) -> bool {
    head.starts_with(&MAGIC[..7])
}

fn read_input(input: &Input) -> Result<PackIndex, FormatError> {
    let err = |kind| input.err(kind);
    if input.len < PREAMBLE_BYTES {
        return Err(err(ErrorKind::Truncated {
            what: "pack preamble",
            offset: 0,
            end: PREAMBLE_BYTES,
            file_len: input.len,
        }));
    }
    let mut pre = [0u8; PREAMBLE_BYTES as usize];
    input.read_at(0, &mut pre, "pack preamble")?;
    if pre[..7] != MAGIC[..7] {
        return Err(err(ErrorKind::PackBadMagic { found: pre[..8].to_vec() }));
    }
    if pre[7] != MAGIC[7] {
        return Err(err(ErrorKind::PackUnsupportedVersion { version: u64::from(pre[7]) }));
    }
    let [_, header_len, tables_len, stored_sum] = read_record(&pre);
    if header_len > MAX_HEADER_BYTES {
        return Err(err(ErrorKind::HeaderTooLarge { len: header_len, max: MAX_HEADER_BYTES }));
    }
    if header_len % STREAM_ALIGN != 0 || tables_len % RECORD_BYTES != 0 {
        return Err(err(ErrorKind::PackHeader {
            message: format!("header length {header_len} or tables length {tables_len} is not a multiple of 16 or 32"),
        }));
    }
    if PREAMBLE_BYTES + header_len > input.len {
        return Err(err(ErrorKind::HeaderPastEnd { header_len, file_len: input.len }));
    }
    // The tables' size is checked against the file before a byte of them is allocated.
    let tables_start = PREAMBLE_BYTES + header_len;
    let tables_end = tables_start
        .checked_add(tables_len)
        .filter(|&end| end <= input.len)
        .ok_or_else(|| err(ErrorKind::PackTablesPastEnd { tables_len, file_len: input.len }))?;
    let header = input.read_vec(PREAMBLE_BYTES, header_len, "pack header")?;
    let tables = input.read_vec(tables_start, tables_len, "pack tables")?;
    // Integrity before meaning: a flipped bit anywhere in the index is reported as such, not as whatever it broke.
    let mut hasher = Xxh3::new();
    hasher.update(&header);
    hasher.update(&tables);
    let computed = hasher.digest();
    if computed != stored_sum {
        return Err(err(ErrorKind::PackIndexChecksum { stored: stored_sum, computed }));
    }
    let json: HeaderJson =
        serde_json::from_slice(&header).map_err(|e| err(ErrorKind::PackHeader { message: e.to_string() }))?;
    if json.wlpack != 1 {
        return Err(err(ErrorKind::PackUnsupportedVersion { version: json.wlpack }));
    }
    if json.checksum != CHECKSUM {
        return Err(err(ErrorKind::PackHeader {
            message: format!("checksum {:?} is not {CHECKSUM:?}", json.checksum),
        }));
    }
    let records = json.chunks.checked_add(json.streams).and_then(|r| r.checked_mul(RECORD_BYTES));
    if records != Some(tables_len) {
        return Err(err(ErrorKind::PackHeader {
            message: format!(
                "{} chunks and {} streams do not fill {tables_len} table bytes",
                json.chunks, json.streams
            ),
        }));
    }
    let (chunk_bytes, stream_bytes) = tables.split_at((json.chunks * RECORD_BYTES) as usize);
    let data_start = tables_end.next_multiple_of(STREAM_ALIGN);
    let mut index = validate(json, chunk_bytes, stream_bytes, data_start, input.len).map_err(err)?;
    index.etag = input.etag();
    index.object = input.object();
    Ok(index)
}

fn validate(
    json: HeaderJson,
    chunk_bytes: &[u8],
    stream_bytes: &[u8],
    data_start: u64,
    len: u64,
) -> Result<PackIndex, ErrorKind> {
    let files = validate_files(json.files)?;
    let mut items = Vec::with_capacity(json.tensors.len() + json.gaps.len());
    let mut names = HashSet::new();
    let mut next_chunk = 0u64;
    for t in json.tensors {
        let item = tensor_item(t, &mut names)?;
        items.push(item);
    }
    for g in json.gaps {
        let file = g.file.min(usize::MAX as u64) as usize;
        let chunks = chunk_range(g.chunks)?;
        items.push(Item { kind: ItemKind::Gap, file, offset: g.offset, nbytes: g.nbytes, planes: 1, chunks });
    }
    for item in &items {
        let label = item.label(&files);
        if item.file >= files.len() {
            return Err(ErrorKind::PackItem {
                item: label,
                message: format!("file index {} of {}", item.file, files.len()),
            });
        }
        if item.chunks.start as u64 != next_chunk {
            return Err(ErrorKind::PackItem {
                item: label,
                message: format!(
                    "its chunks start at {} but the previous item's end at {next_chunk}",
                    item.chunks.start
                ),
            });
        }
        next_chunk = item.chunks.end as u64;
    }
    if next_chunk != json.chunks {
        return Err(ErrorKind::PackHeader {
            message: format!("items own {next_chunk} chunks but the table holds {}", json.chunks),
        });
    }
    check_file_coverage(&items, &files)?;
    let chunks = read_chunks(&items, &files, chunk_bytes, json.streams)?;
    let streams = read_streams(&items, &chunks, stream_bytes, data_start, len)?;
    Ok(PackIndex {
        source: json.source,
        files,
        items,
        chunks,
        streams,
        metadata: json.metadata,
        data_start,
        len,
        etag: None,
        object: None,
    })
}

fn validate_files(files: Vec<PackedFile>) -> Result<Vec<PackedFile>, ErrorKind> {
    let mut seen = HashSet::new();
    for f in &files {
        let plain = !f.name.is_empty() && f.name != "." && f.name != ".." && !f.name.contains(['/', '\\', '\0']);
        if !plain || !seen.insert(f.name.as_str()) {
            return Err(ErrorKind::PackFileName { name: f.name.clone() });
        }
    }
    if files.is_empty() {
        return Err(ErrorKind::PackHeader { message: "no files".into() });
    }
    Ok(files)
}

fn chunk_range(c: [u64; 2]) -> Result<Range<usize>, ErrorKind> {
    let end = c[0].checked_add(c[1]).filter(|&e| e <= usize::MAX as u64);
    match end {
        Some(end) => Ok(c[0] as usize..end as usize),
        None => Err(ErrorKind::PackHeader { message: format!("chunk range {c:?} overflows") }),
    }
}

fn tensor_item(t: TensorJson, names: &mut HashSet<String>) -> Result<Item, ErrorKind> {
    let bad = |message: String| ErrorKind::PackItem { item: t.name.clone(), message };
    let Some(dtype) = DType::parse(&t.dtype) else {
        return Err(ErrorKind::UnknownDtype { tensor: t.name.clone(), dtype: t.dtype.clone() });
    };
    let expected = expected_size(&t.name, dtype, &t.shape)?;
    if expected != t.nbytes {
        return Err(bad(format!("{dtype} × {:?} is {expected} bytes, not {}", t.shape, t.nbytes)));
    }
    if !matches!(t.planes, 1 | 2 | 4 | 8) || !t.nbytes.is_multiple_of(u64::from(t.planes)) {
        return Err(bad(format!("{} planes do not split {} bytes", t.planes, t.nbytes)));
    }
    if !names.insert(t.name.clone()) {
        return Err(ErrorKind::DuplicateName { tensor: t.name });
    }
    let chunks = chunk_range(t.chunks)?;
    Ok(Item {
        kind: ItemKind::Tensor { name: t.name, dtype, shape: t.shape },
        file: t.file.min(usize::MAX as u64) as usize,
        offset: t.offset,
        nbytes: t.nbytes,
        planes: t.planes,
        chunks,
    })
}

/// The items of each file, sorted by offset, must tile it: no gap, no overlap, nothing past its end.
fn check_file_coverage(items: &[Item], files: &[PackedFile]) -> Result<(), ErrorKind> {
    let mut order: Vec<&Item> = items.iter().collect();
    order.sort_by_key(|i| (i.file, i.offset, i.nbytes));
    let mut cursor = vec![0u64; files.len()];
    for item in order {
        let file = &files[item.file];
        let at = &mut cursor[item.file];
        let cover = |start: u64, end: u64, message: String| ErrorKind::PackCoverage {
            file: file.name.clone(),
            start,
            end,
            message,
        };
        let end = item.offset.checked_add(item.nbytes).filter(|&e| e <= file.len).ok_or_else(|| {
            cover(
                item.offset,
                item.offset.saturating_add(item.nbytes),
                format!("{} runs past the end ({} bytes)", item.label(files), file.len),
            )
        })?;
        if item.nbytes == 0 {
            continue;
        }
        if item.offset < *at {
            return Err(cover(item.offset, *at, format!("{} overlaps the item before it", item.label(files))));
        }
        if item.offset > *at {
            return Err(cover(*at, item.offset, format!("no item holds these bytes (before {})", item.label(files))));
        }
        *at = end;
    }
    for (file, &at) in files.iter().zip(&cursor) {
        if at != file.len {
            return Err(ErrorKind::PackCoverage {
                file: file.name.clone(),
                start: at,
                end: file.len,
                message: "no item holds these bytes (at the end)".into(),
            });
        }
    }
    Ok(())
}

fn read_chunks(items: &[Item], files: &[PackedFile], table: &[u8], n_streams: u64) -> Result<Vec<Chunk>, ErrorKind> {
    let mut chunks = Vec::with_capacity(table.len() / RECORD_BYTES as usize);
    let mut next_stream = 0u64;
    for item in items {
        let mut at = 0u64;
        for (k, c) in item.chunks.clone().enumerate() {
            let rec = read_record(&table[c * RECORD_BYTES as usize..(c + 1) * RECORD_BYTES as usize]);
            let chunk = Chunk { raw_offset: rec[0], raw_len: rec[1], checksum: rec[2], first_stream: rec[3] };
            let bad = |message: String| ErrorKind::PackChunk { item: item.label(files), chunk: k as u64, message };
            let planes = u64::from(item.planes);
            if chunk.raw_offset != at {
                return Err(bad(format!("starts at {} but the previous chunk ends at {at}", chunk.raw_offset)));
            }
            if chunk.raw_len == 0 || chunk.raw_len > MAX_CHUNK_BYTES || !chunk.raw_len.is_multiple_of(planes) {
                return Err(bad(format!(
                    "raw length {} is not a non-zero multiple of {planes} up to {MAX_CHUNK_BYTES}",
                    chunk.raw_len
                )));
            }
            at = at
                .checked_add(chunk.raw_len)
                .filter(|&e| e <= item.nbytes)
                .ok_or_else(|| bad(format!("ends past the item's {} bytes", item.nbytes)))?;
            if chunk.first_stream != next_stream {
                return Err(bad(format!("first stream {} (expected {next_stream})", chunk.first_stream)));
            }
            next_stream += planes;
            chunks.push(chunk);
        }
        if at != item.nbytes {
            return Err(ErrorKind::PackChunk {
                item: item.label(files),
                chunk: item.chunks.len() as u64,
                message: format!("chunks cover {at} of {} bytes", item.nbytes),
            });
        }
    }
    if next_stream != n_streams {
        return Err(ErrorKind::PackHeader {
            message: format!("chunks own {next_stream} streams but the table holds {n_streams}"),
        });
    }
    Ok(chunks)
}

fn read_streams(
    items: &[Item],
    chunks: &[Chunk],
    table: &[u8],
    data_start: u64,
    len: u64,
) -> Result<Vec<Stream>, ErrorKind> {
    let mut streams = Vec::with_capacity(table.len() / RECORD_BYTES as usize);
    let mut cursor = data_start;
    for item in items {
        for c in item.chunks.clone() {
            let chunk = &chunks[c];
            for plane in 0..item.planes {
                let index = streams.len();
                let at = index * RECORD_BYTES as usize;
                let rec = read_record(&table[at..at + RECORD_BYTES as usize]);
                let bad = |message: String| ErrorKind::PackStream { stream: index as u64, message };
                let codec =
                    Codec::from_id(rec[3] as u8).ok_or_else(|| bad(format!("unknown codec {}", rec[3] & 0xff)))?;
                let stream =
                    Stream { offset: rec[0], stored_len: rec[1], raw_len: rec[2], codec, plane: (rec[3] >> 8) as u8 };
                if rec[3] >> 16 != 0 || stream.plane != plane {
                    return Err(bad(format!(
                        "plane {} (expected {plane}) or reserved bits set ({:#x})",
                        stream.plane, rec[3]
                    )));
                }
                if stream.raw_len != chunk.raw_len / u64::from(item.planes) {
                    return Err(bad(format!(
                        "decodes to {} bytes, not {}",
                        stream.raw_len,
                        chunk.raw_len / u64::from(item.planes)
                    )));
                }
                if (codec == Codec::Raw && stream.stored_len != stream.raw_len) || stream.stored_len == 0 {
                    return Err(bad(format!(
                        "stores {} bytes for {} raw bytes with {}",
                        stream.stored_len,
                        stream.raw_len,
                        codec.name()
                    )));
                }
                let expected = cursor.next_multiple_of(STREAM_ALIGN);
                if stream.offset != expected {
                    return Err(bad(format!("starts at {} (expected {expected})", stream.offset)));
                }
                cursor = stream
                    .offset
                    .checked_add(stream.stored_len)
                    .filter(|&e| e <= len)
                    .ok_or_else(|| bad(format!("ends past the end of the {len}-byte file")))?;
                streams.push(stream);
            }
        }
    }
    if cursor != len {
        return Err(ErrorKind::PackTrailing { start: cursor, end: len });
    }
    Ok(streams)
}

/// What a pack will hold, laid out before any chunk is compressed: the header's size (and so where stream data
/// starts) depends only on the files, items and chunk counts.
#[derive(Clone, Debug)]
pub struct PackLayout {
    /// What the original checkpoint was (see `PackIndex::source`).
    pub source: String,
    /// The original files, in order.
    pub files: Vec<PackedFile>,
    /// Tensors first, then gaps.
    pub items: Vec<Item>,
    /// `(raw_offset, raw_len)` of every chunk, items in order.
    pub chunks: Vec<(u64, u64)>,
    /// The original safetensors `__metadata__`.
    pub metadata: BTreeMap<String, String>,
    header: Vec<u8>,
    /// Streams the pack will hold.
    pub n_streams: u64,
    /// Where stream data starts (just past the header).
    pub data_start: u64,
}

/// An item to lay out: what it is, where it sits in which original file, and its planes.
#[derive(Clone, Debug)]
pub struct ItemSpec {
    /// A tensor or a gap.
    pub kind: ItemKind,
    /// Index of the original file.
    pub file: usize,
    /// Offset in that file.
    pub offset: u64,
    /// Bytes of the range.
    pub nbytes: u64,
    /// Byte planes per element group (1, 2, 4 or 8).
    pub planes: u8,
}

impl PackLayout {
    /// Lays out a pack: tensors must come before gaps in `items`; each item is cut into chunks of `plane_chunk`
    /// bytes per plane.
    pub fn new(
        source: &str,
        files: Vec<PackedFile>,
        items: Vec<ItemSpec>,
        metadata: BTreeMap<String, String>,
        plane_chunk: u64,
    ) -> Result<PackLayout, ErrorKind> {
        let mut chunks = Vec::new();
        let mut laid = Vec::with_capacity(items.len());
        let mut n_streams = 0u64;
        for spec in items {
            let first = chunks.len();
            let planned = plan_chunks(spec.nbytes, spec.planes, plane_chunk);
            n_streams += planned.len() as u64 * u64::from(spec.planes);
            chunks.extend(planned);
            laid.push(Item {
                kind: spec.kind,
                file: spec.file,
                offset: spec.offset,
                nbytes: spec.nbytes,
                planes: spec.planes,
                chunks: first..chunks.len(),
            });
        }
        let json = HeaderJson {
            wlpack: 1,
            checksum: CHECKSUM.into(),
            source: source.into(),
            files: files.clone(),
            tensors: laid.iter().filter_map(tensor_json).collect(),
            gaps: laid.iter().filter_map(gap_json).collect(),
            chunks: chunks.len() as u64,
            streams: n_streams,
            metadata: metadata.clone(),
        };
        let mut header = serde_json::to_vec(&json)
            .map_err(|e| ErrorKind::Unwritable { tensor: String::new(), reason: e.to_string() })?;
        header.resize(header.len().next_multiple_of(STREAM_ALIGN as usize), b' ');
        let tables_end = PREAMBLE_BYTES + header.len() as u64 + (chunks.len() as u64 + n_streams) * RECORD_BYTES;
        let layout = PackLayout {
            source: source.into(),
            files,
            items: laid,
            chunks,
            metadata,
            header,
            n_streams,
            data_start: tables_end.next_multiple_of(STREAM_ALIGN),
        };
        Ok(layout)
    }

    /// The preamble, header and tables, to be written at offset 0 once every stream is placed. `chunks` holds each
    /// chunk's checksum and `streams` every stream in table order.
    pub fn index_bytes(&self, checksums: &[u64], streams: &[Stream]) -> Vec<u8> {
        let mut tables = Vec::with_capacity(((self.chunks.len() + streams.len()) as u64 * RECORD_BYTES) as usize);
        let mut next_stream = 0u64;
        for (item, (&(raw_offset, raw_len), &sum)) in self
            .items
            .iter()
            .flat_map(|i| std::iter::repeat_n(i.planes, i.chunks.len()))
            .zip(self.chunks.iter().zip(checksums))
        {
            for w in [raw_offset, raw_len, sum, next_stream] {
                tables.extend_from_slice(&w.to_le_bytes());
            }
            next_stream += u64::from(item);
        }
        for s in streams {
            let tag = u64::from(s.codec.id()) | u64::from(s.plane) << 8;
            for w in [s.offset, s.stored_len, s.raw_len, tag] {
                tables.extend_from_slice(&w.to_le_bytes());
            }
        }
        let mut hasher = Xxh3::new();
        hasher.update(&self.header);
        hasher.update(&tables);
        let mut out = Vec::with_capacity(PREAMBLE_BYTES as usize + self.header.len() + tables.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&(self.header.len() as u64).to_le_bytes());
        out.extend_from_slice(&(tables.len() as u64).to_le_bytes());
        out.extend_from_slice(&hasher.digest().to_le_bytes());
        out.extend_from_slice(&self.header);
        out.extend_from_slice(&tables);
        out
    }
}

fn tensor_json(item: &Item) -> Option<TensorJson> {
    let ItemKind::Tensor { name, dtype, shape } = &item.kind else { return None };
    Some(TensorJson {
        name: name.clone(),
        dtype: dtype.name().to_string(),
        shape: shape.clone(),
        file: item.file as u64,
        offset: item.offset,
        nbytes: item.nbytes,
        planes: item.planes,
        chunks: [item.chunks.start as u64, item.chunks.len() as u64],
    })
}

fn gap_json(item: &Item) -> Option<GapJson> {
    matches!(item.kind, ItemKind::Gap).then(|| GapJson {
        file: item.file as u64,
        offset: item.offset,
        nbytes: item.nbytes,
        chunks: [item.chunks.start as u64, item.chunks.len() as u64],
    })
}
