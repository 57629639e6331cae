//! Decoding a pack on the CPU: one chunk into a destination (what a loader without nvCOMP or without a GPU does),
//! a whole pack back into its original files (`unpack`), or a check of every chunk.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use weightlift_format::output::Output;
use weightlift_format::wlpack::{self, Item, PackIndex};

use crate::codec;
use crate::error::PackError;
use crate::planes;

/// An open pack: its validated index and the file.
#[derive(Debug)]
pub struct Pack {
    /// Where the pack was opened from (errors name it).
    pub path: PathBuf,
    /// The pack's header and tables, validated against the file's length.
    pub index: PackIndex,
    file: File,
}

impl Pack {
    /// Opens the pack at `path` and validates its index ([`weightlift_format::wlpack::read`]); no chunk is read.
    pub fn open(path: &Path) -> Result<Pack, PackError> {
        let index = wlpack::read(path)?;
        let file = File::open(path).map_err(PackError::io(path))?;
        Ok(Pack { path: path.to_path_buf(), index, file })
    }

    /// The pack byte range holding chunk `c`'s streams (from its first stream's start to its last one's end).
    pub fn stored_range(&self, item: &Item, c: usize) -> (u64, u64) {
        let streams = self.index.chunk_streams(c, item.planes);
        let start = streams.first().map_or(0, |s| s.offset);
        let end = streams.last().map_or(start, |s| s.end());
        (start, end)
    }

    /// Reads chunk `c` of `item` from the pack and decodes it into `out` (exactly the chunk's raw length).
    pub fn read_chunk(&self, item: &Item, c: usize, out: &mut [u8]) -> Result<(), PackError> {
        let (start, end) = self.stored_range(item, c);
        let mut stored = vec![0u8; (end - start) as usize];
        self.file.read_exact_at(&mut stored, start).map_err(PackError::io(&self.path))?;
        self.decode_chunk(item, c, &stored, out)
    }

    /// Decodes chunk `c` of `item` from `stored` (the pack bytes of [`Pack::stored_range`]) into `out`, and checks
    /// its checksum.
    pub fn decode_chunk(&self, item: &Item, c: usize, stored: &[u8], out: &mut [u8]) -> Result<(), PackError> {
        decode_chunk(&self.path, &self.index, item, c, stored, out)
    }
}

/// Decodes chunk `c` of `item` of a pack (see [`Pack::decode_chunk`]); `path` names the pack in errors.
pub fn decode_chunk(
    path: &Path,
    index: &PackIndex,
    item: &Item,
    c: usize,
    stored: &[u8],
    out: &mut [u8],
) -> Result<(), PackError> {
    let chunk = index.chunks[c];
    let streams = index.chunk_streams(c, item.planes);
    let base = streams.first().map_or(0, |s| s.offset);
    let k = c - item.chunks.start;
    let label = || item.label(&index.files);
    if out.len() as u64 != chunk.raw_len || stored.len() as u64 != streams.last().map_or(base, |s| s.end()) - base {
        return Err(PackError::Invalid(format!(
            "{}: {:?}, chunk {k}: {} stored and {} output bytes given for a {}-byte chunk",
            path.display(),
            label(),
            stored.len(),
            out.len(),
            chunk.raw_len
        )));
    }
    let plane_len = (chunk.raw_len / u64::from(item.planes)) as usize;
    let mut scratch = if item.planes > 1 { vec![0u8; out.len()] } else { Vec::new() };
    {
        let dests: Vec<&mut [u8]> =
            if item.planes > 1 { scratch.chunks_exact_mut(plane_len).collect() } else { vec![&mut out[..]] };
        for (s, dest) in streams.iter().zip(dests) {
            let at = (s.offset - base) as usize;
            codec::decompress(s.codec, &stored[at..at + s.stored_len as usize], dest).map_err(|reason| {
                PackError::Codec {
                    path: path.to_path_buf(),
                    item: label(),
                    chunk: k as u64,
                    plane: s.plane,
                    codec: s.codec.name(),
                    reason,
                }
            })?;
        }
    }
    if item.planes > 1 {
        let planes: Vec<&[u8]> = scratch.chunks_exact(plane_len).collect();
        planes::merge(&planes, out);
    }
    let actual = xxhash_rust::xxh3::xxh3_64(out);
    if actual != chunk.checksum {
        return Err(PackError::Checksum {
            path: path.to_path_buf(),
            item: label(),
            chunk: k as u64,
            start: chunk.raw_offset,
            end: chunk.raw_offset + chunk.raw_len,
            expected: chunk.checksum,
            actual,
        });
    }
    Ok(())
}

/// Receives each decoded chunk: the item, the chunk's index in the table, its raw bytes.
type ChunkSink<'a> = &'a (dyn Fn(&Item, usize, &[u8]) -> Result<(), PackError> + Sync);

/// Chunks decoded in parallel per round.
const ROUND_CHUNKS: usize = 256;

/// Decodes every chunk of `pack`, handing each to `sink(item, chunk, bytes)`; stops at the first error.
fn for_each_chunk(
    pack: &Pack,
    threads: usize,
    progress: &(dyn Fn(u64, u64) + Sync),
    sink: ChunkSink<'_>,
) -> Result<(), PackError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| PackError::Invalid(format!("decoder threads: {e}")))?;
    let work: Vec<(&Item, usize)> =
        pack.index.items.iter().flat_map(|item| item.chunks.clone().map(move |c| (item, c))).collect();
    let total: u64 = pack.index.chunks.iter().map(|c| c.raw_len).sum();
    let mut done = 0u64;
    for round in work.chunks(ROUND_CHUNKS) {
        pool.install(|| {
            round.par_iter().try_for_each(|&(item, c)| {
                let mut out = vec![0u8; pack.index.chunks[c].raw_len as usize];
                pack.read_chunk(item, c, &mut out)?;
                sink(item, c, &out)
            })
        })?;
        done += round.iter().map(|&(_, c)| pack.index.chunks[c].raw_len).sum::<u64>();
        progress(done, total);
    }
    Ok(())
}

/// Decodes every chunk and checks its checksum, writing nothing.
pub fn verify(pack: &Pack, threads: usize, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<(), PackError> {
    for_each_chunk(pack, threads, progress, &|_, _, _| Ok(()))
}

/// Where each original file of `pack` goes: `out` itself for a one-file pack (or `out/NAME` if `out` is a
/// directory), `out/NAME` for several files (the directory is created).
pub fn output_paths(pack: &Pack, out: &Path) -> Result<Vec<PathBuf>, PackError> {
    let names = pack.index.files.iter().map(|f| &f.name);
    if pack.index.files.len() == 1 && !out.is_dir() {
        return Ok(vec![out.to_path_buf()]);
    }
    std::fs::create_dir_all(out).map_err(PackError::io(out))?;
    Ok(names.map(|n| out.join(n)).collect())
}

/// Rebuilds the original files of `pack` byte for byte (see [`output_paths`] for where); each file is written
/// under a temporary name, synced, then renamed into place.
pub fn unpack(
    pack: &Pack,
    out: &Path,
    threads: usize,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Vec<PathBuf>, PackError> {
    let targets = output_paths(pack, out)?;
    let mut outputs = Vec::with_capacity(targets.len());
    for (t, f) in targets.iter().zip(&pack.index.files) {
        let output = Output::create(t, &[&pack.path])?;
        output.file().set_len(f.len).map_err(PackError::io(output.target()))?;
        outputs.push(output);
    }
    for_each_chunk(pack, threads, progress, &|item, c, bytes| {
        let at = item.offset + pack.index.chunks[c].raw_offset;
        let output = &outputs[item.file];
        output.file().write_all_at(bytes, at).map_err(PackError::io(output.target()))
    })?;
    for output in outputs {
        output.commit()?;
    }
    Ok(targets)
}
