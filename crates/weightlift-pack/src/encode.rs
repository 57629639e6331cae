//! Packing a checkpoint: every tensor cut into chunks, each chunk split into byte planes and compressed on a pool
//! of threads, the streams written in table order, the header and tables written last at offset 0.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use weightlift_format::output::Output;
use weightlift_format::wlpack::{
    Codec, ItemKind, ItemSpec, MAX_CHUNK_BYTES, PackLayout, PackedFile, STREAM_ALIGN, Stream, planes_for,
};
use weightlift_format::{DType, Detected, Metadata, TensorIndex};

use crate::codec::{self, Level};
use crate::error::PackError;
use crate::planes;

/// How to pack.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// Codec for every plane that shrinks enough with it; the others are stored raw.
    pub codec: Codec,
    /// Compression effort (see [`Level`]); [`PackOptions::validate`] checks its range for the codec.
    pub level: Level,
    /// Bytes per plane per chunk (nvCOMP's batched decoders do best with about 64 KiB).
    pub plane_chunk: u64,
    /// A stream is kept compressed only if it is at most this fraction of its raw size.
    pub max_ratio: f64,
    /// Encoder threads (0: one per CPU).
    pub threads: usize,
}

/// The smallest plane chunk: below it the tables outweigh the data (a 1-byte chunk turns 7 MiB into 431 MiB).
pub const MIN_PLANE_CHUNK: u64 = 512;
/// The largest plane chunk: eight planes of it make the largest chunk a pack may hold.
pub const MAX_PLANE_CHUNK: u64 = MAX_CHUNK_BYTES / 8;

impl PackOptions {
    /// Refuses what cannot be honoured as asked, rather than clamping it without a word.
    pub fn validate(&self) -> Result<(), PackError> {
        if !(MIN_PLANE_CHUNK..=MAX_PLANE_CHUNK).contains(&self.plane_chunk) {
            return Err(PackError::Invalid(format!(
                "plane chunk {} bytes: must be {MIN_PLANE_CHUNK} to {MAX_PLANE_CHUNK} bytes",
                self.plane_chunk
            )));
        }
        let levels = match self.codec {
            Codec::Deflate => 1..=9,
            _ => 1..=22,
        };
        if !levels.contains(&self.level.0) {
            return Err(PackError::Invalid(format!(
                "level {} for {}: must be {} to {}",
                self.level.0,
                self.codec.name(),
                levels.start(),
                levels.end()
            )));
        }
        if !(self.max_ratio > 0.0 && self.max_ratio <= 1.0) {
            return Err(PackError::Invalid(format!("max ratio {}: must be in (0, 1]", self.max_ratio)));
        }
        Ok(())
    }
}

impl Default for PackOptions {
    fn default() -> PackOptions {
        PackOptions {
            codec: Codec::Huffman,
            level: Level::default(),
            plane_chunk: 64 << 10,
            max_ratio: 0.95,
            threads: 0,
        }
    }
}

/// What was packed.
#[derive(Clone, Debug)]
pub struct PackSummary {
    /// Original files the pack holds (a shard index counts as one).
    pub files: usize,
    /// Tensors packed.
    pub tensors: usize,
    /// Chunks written, over all tensors and files.
    pub chunks: usize,
    /// Bytes of the original files.
    pub raw_bytes: u64,
    /// Bytes of the pack written (header, tables and streams).
    pub pack_bytes: u64,
}

/// A checkpoint to pack: the parsed index and the original files, in index order, with the names they get.
struct Source {
    kind: &'static str,
    index: TensorIndex,
    /// Files that hold no tensors but belong to the checkpoint (a shard index).
    extra: Vec<PathBuf>,
}

fn open_source(input: &Path) -> Result<Source, PackError> {
    Ok(match weightlift_format::detect(input)? {
        Detected::Safetensors => {
            Source { kind: "safetensors", index: weightlift_format::safetensors::read(input)?, extra: vec![] }
        }
        Detected::ShardIndex => Source {
            kind: "safetensors-sharded",
            index: weightlift_format::sharded::read(input)?,
            extra: vec![input.to_path_buf()],
        },
        Detected::Gguf => Source { kind: "gguf", index: weightlift_format::gguf::read(input)?, extra: vec![] },
    })
}

fn file_name(path: &Path) -> Result<String, PackError> {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| PackError::Invalid(format!("{}: not a file name", path.display())))
}

/// The items of a source: its tensors in index order, then every byte range between them as gaps.
fn items(source: &Source, lens: &[u64]) -> Vec<ItemSpec> {
    let mut items: Vec<ItemSpec> = source
        .index
        .tensors
        .iter()
        .map(|t| ItemSpec {
            kind: ItemKind::Tensor { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone() },
            file: t.file,
            offset: t.offset,
            nbytes: t.nbytes,
            planes: planes_for(t.dtype),
        })
        .collect();
    for (file, &len) in lens.iter().enumerate() {
        let mut ranges: Vec<(u64, u64)> = source
            .index
            .tensors
            .iter()
            .filter(|t| t.file == file && t.nbytes > 0)
            .map(|t| (t.offset, t.end()))
            .collect();
        ranges.sort_unstable();
        let mut at = 0;
        for (start, end) in ranges.into_iter().chain([(len, len)]) {
            if start > at {
                items.push(ItemSpec { kind: ItemKind::Gap, file, offset: at, nbytes: start - at, planes: 1 });
            }
            at = at.max(end);
        }
    }
    items
}

/// One compressed chunk, ready to be written.
struct Encoded {
    checksum: u64,
    streams: Vec<(Codec, Vec<u8>, u64)>,
}

fn encode_chunk(
    file: &File,
    path: &Path,
    offset: u64,
    len: u64,
    planes: u8,
    compressible: bool,
    opts: &PackOptions,
) -> Result<Encoded, PackError> {
    let mut raw = vec![0u8; len as usize];
    file.read_exact_at(&mut raw, offset).map_err(PackError::io(path))?;
    let checksum = xxhash_rust::xxh3::xxh3_64(&raw);
    let k = usize::from(planes);
    let plane_len = raw.len() / k;
    let mut split = vec![0u8; raw.len()];
    {
        let mut refs: Vec<&mut [u8]> = split.chunks_exact_mut(plane_len.max(1)).take(k).collect();
        if plane_len == 0 {
            refs.clear();
        }
        planes::split(&raw, &mut refs);
    }
    let mut streams = Vec::with_capacity(k);
    for plane in split.chunks_exact(plane_len) {
        let kept = if compressible && opts.codec != Codec::Raw {
            let stored = codec::compress(opts.codec, opts.level, plane)
                .map_err(|e| PackError::Invalid(format!("{}: compressing bytes at {offset}: {e}", path.display())))?;
            ((stored.len() as f64) <= opts.max_ratio * plane.len() as f64).then_some(stored)
        } else {
            None
        };
        streams.push(match kept {
            Some(stored) => (opts.codec, stored, plane.len() as u64),
            None => (Codec::Raw, plane.to_vec(), plane.len() as u64),
        });
    }
    Ok(Encoded { checksum, streams })
}

/// Packs the checkpoint at `input` (a safetensors file, a shard index, or a GGUF file) into `out`. `progress` is
/// called with the raw bytes done so far.
pub fn pack(
    input: &Path,
    out: &Path,
    opts: &PackOptions,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<PackSummary, PackError> {
    opts.validate()?;
    let source = open_source(input)?;
    let mut paths: Vec<PathBuf> = source.index.files.iter().map(|f| f.path.clone()).collect();
    paths.extend(source.extra.iter().cloned());
    let mut files = Vec::with_capacity(paths.len());
    let mut handles = Vec::with_capacity(paths.len());
    for p in &paths {
        let f = File::open(p).map_err(PackError::io(p))?;
        let len = f.metadata().map_err(PackError::io(p))?.len();
        files.push(PackedFile { name: file_name(p)?, len });
        handles.push(f);
    }
    let lens: Vec<u64> = files.iter().map(|f| f.len).collect();
    let metadata = match source.index.files.first().map(|f| &f.metadata) {
        Some(Metadata::Safetensors(m)) => m.clone(),
        _ => BTreeMap::new(),
    };
    let layout = PackLayout::new(source.kind, files, items(&source, &lens), metadata, opts.plane_chunk)
        .map_err(|k| weightlift_format::FormatError::new(out, k))?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .build()
        .map_err(|e| PackError::Invalid(format!("encoder threads: {e}")))?;
    let inputs: Vec<&Path> = std::iter::once(input).chain(paths.iter().map(PathBuf::as_path)).collect();
    let output = Output::create(out, &inputs)?;
    let summary = pool.install(|| write_pack(&layout, &paths, &handles, &output, opts, progress))?;
    output.commit()?;
    Ok(summary)
}

/// Chunks compressed in parallel per round; a round's output is written before the next starts.
const ROUND_CHUNKS: usize = 512;

fn write_pack(
    layout: &PackLayout,
    paths: &[PathBuf],
    handles: &[File],
    output: &Output,
    opts: &PackOptions,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<PackSummary, PackError> {
    let out = output.target();
    let file = output.file().try_clone().map_err(PackError::io(out))?;
    let mut w = BufWriter::with_capacity(8 << 20, file);
    w.seek(SeekFrom::Start(layout.data_start)).map_err(PackError::io(out))?;
    // (item index, chunk offset, chunk length) for every chunk in table order.
    let work: Vec<(usize, u64, u64)> = layout
        .items
        .iter()
        .enumerate()
        .flat_map(|(i, item)| layout.chunks[item.chunks.clone()].iter().map(move |&(o, l)| (i, o, l)))
        .collect();
    let total: u64 = work.iter().map(|w| w.2).sum();
    let mut checksums = Vec::with_capacity(work.len());
    let mut streams: Vec<Stream> = Vec::with_capacity(layout.n_streams as usize);
    let (mut pos, mut done) = (layout.data_start, 0u64);
    for round in work.chunks(ROUND_CHUNKS) {
        let encoded: Vec<Result<Encoded, PackError>> = round
            .par_iter()
            .map(|&(i, off, len)| {
                let item = &layout.items[i];
                let compressible = !matches!(item.kind, ItemKind::Tensor { dtype: DType::Ggml(_), .. });
                encode_chunk(
                    &handles[item.file],
                    &paths[item.file],
                    item.offset + off,
                    len,
                    item.planes,
                    compressible,
                    opts,
                )
            })
            .collect();
        for (enc, &(_, _, len)) in encoded.into_iter().zip(round) {
            let enc = enc?;
            checksums.push(enc.checksum);
            for (plane, (codec, bytes, raw_len)) in enc.streams.into_iter().enumerate() {
                let aligned = pos.next_multiple_of(STREAM_ALIGN);
                w.write_all(&[0u8; STREAM_ALIGN as usize][..(aligned - pos) as usize]).map_err(PackError::io(out))?;
                w.write_all(&bytes).map_err(PackError::io(out))?;
                streams.push(Stream {
                    offset: aligned,
                    stored_len: bytes.len() as u64,
                    raw_len,
                    codec,
                    plane: plane as u8,
                });
                pos = aligned + bytes.len() as u64;
            }
            done += len;
        }
        progress(done, total);
    }
    w.seek(SeekFrom::Start(0)).map_err(PackError::io(out))?;
    w.write_all(&layout.index_bytes(&checksums, &streams)).map_err(PackError::io(out))?;
    w.into_inner().map_err(|e| PackError::Io { path: out.to_path_buf(), cause: e.into_error() })?;
    Ok(PackSummary {
        files: layout.files.len(),
        tensors: layout.items.iter().filter(|i| matches!(i.kind, ItemKind::Tensor { .. })).count(),
        chunks: layout.chunks.len(),
        raw_bytes: layout.files.iter().map(|f| f.len).sum(),
        pack_bytes: pos,
    })
}
