//! Checksum manifests for plain checkpoints: every tensor cut into chunks of [`CHUNK_BYTES`] (counted from the
//! tensor's start, so a loader can check a tensor wherever it lands), each chunk's xxh3-64 recorded. A loader checks
//! the bytes it delivered against them (on the GPU, with the same kernels that check pack chunks).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::OnceLock;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PackError;

/// Bytes per checksummed chunk of a tensor.
pub const CHUNK_BYTES: u64 = 1 << 20;
/// The manifest a checkpoint's checksums go to by default: `PATH.xxh3.json`.
pub const SUFFIX: &str = ".xxh3.json";

/// The checksums of one checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always `xxh3-64`.
    pub checksum: String,
    /// Bytes per checksummed chunk ([`CHUNK_BYTES`] when written by [`create`]); the last chunk of a tensor may
    /// be shorter.
    pub chunk_bytes: u64,
    /// Every tensor of the checkpoint, in the order its index lists them.
    pub tensors: Vec<TensorSums>,
    /// Position of each tensor by name, built on the first lookup (a manifest of a MoE model has 100 k tensors).
    #[serde(skip)]
    by_name: NameIndex,
}

/// A cache, not part of what a manifest is: equal whatever it holds.
#[derive(Clone, Debug, Default)]
struct NameIndex(OnceLock<HashMap<String, usize>>);

impl PartialEq for NameIndex {
    fn eq(&self, _: &NameIndex) -> bool {
        true
    }
}

impl Eq for NameIndex {}

/// One tensor's chunk checksums.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSums {
    /// The tensor's name in the checkpoint.
    pub name: String,
    /// The file (plain name) and offset the tensor was read from.
    pub file: String,
    /// Byte offset of the tensor's data in `file`.
    pub offset: u64,
    /// The tensor's length in bytes.
    pub nbytes: u64,
    /// xxh3-64 of each chunk, as 16 hex digits.
    pub chunks: Vec<String>,
}

impl TensorSums {
    /// `(offset in tensor, length, checksum)` of every chunk.
    pub fn chunk_ranges(&self, chunk_bytes: u64) -> Result<Vec<(u64, u64, u64)>, PackError> {
        let expected = self.nbytes.div_ceil(chunk_bytes.max(1));
        if chunk_bytes == 0 || self.chunks.len() as u64 != expected {
            return Err(PackError::Invalid(format!(
                "manifest: tensor {:?} lists {} chunk checksums, {expected} expected",
                self.name,
                self.chunks.len()
            )));
        }
        self.chunks
            .iter()
            .enumerate()
            .map(|(i, hex)| {
                let sum = u64::from_str_radix(hex, 16).map_err(|_| {
                    PackError::Invalid(format!("manifest: tensor {:?}: {hex:?} is not a checksum", self.name))
                })?;
                let start = i as u64 * chunk_bytes;
                Ok((start, chunk_bytes.min(self.nbytes - start), sum))
            })
            .collect()
    }

    /// Checks a whole tensor's bytes, read from `read_from` (the file the error names: a copy of a checkpoint is
    /// checked under its own name, not the one the manifest recorded); the error names the first chunk that differs.
    pub fn check(&self, chunk_bytes: u64, bytes: &[u8], read_from: &Path) -> Result<(), PackError> {
        if bytes.len() as u64 != self.nbytes {
            return Err(PackError::Invalid(format!(
                "tensor {:?}: {} bytes given, the manifest has {}",
                self.name,
                bytes.len(),
                self.nbytes
            )));
        }
        for (i, (start, len, expected)) in self.chunk_ranges(chunk_bytes)?.into_iter().enumerate() {
            let actual = crate::checksum(&bytes[start as usize..(start + len) as usize]);
            if actual != expected {
                return Err(PackError::Checksum {
                    path: read_from.to_path_buf(),
                    item: self.name.clone(),
                    chunk: i as u64,
                    start,
                    end: start + len,
                    expected,
                    actual,
                });
            }
        }
        Ok(())
    }
}

impl Manifest {
    /// An xxh3-64 manifest of `tensors`, checksummed in chunks of `chunk_bytes`.
    pub fn new(chunk_bytes: u64, tensors: Vec<TensorSums>) -> Manifest {
        Manifest { checksum: "xxh3-64".into(), chunk_bytes, tensors, by_name: NameIndex::default() }
    }

    /// The tensor named `name` (the first of that name), found through a map built once.
    pub fn tensor(&self, name: &str) -> Option<&TensorSums> {
        let index = self.by_name.0.get_or_init(|| {
            let mut map = HashMap::with_capacity(self.tensors.len());
            for (i, t) in self.tensors.iter().enumerate() {
                map.entry(t.name.clone()).or_insert(i);
            }
            map
        });
        index.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// Reads the manifest at `path`. Errors: the file cannot be read ([`PackError::Io`]), is not a manifest's
    /// JSON, or names a checksum other than xxh3-64 or zero-byte chunks ([`PackError::Invalid`]).
    pub fn read(path: &Path) -> Result<Manifest, PackError> {
        let text = std::fs::read(path).map_err(PackError::io(path))?;
        let m: Manifest = serde_json::from_slice(&text)
            .map_err(|e| PackError::Invalid(format!("{}: not a checksum manifest: {e}", path.display())))?;
        if m.checksum != "xxh3-64" || m.chunk_bytes == 0 {
            return Err(PackError::Invalid(format!(
                "{}: checksum {:?} with {}-byte chunks is not supported",
                path.display(),
                m.checksum,
                m.chunk_bytes
            )));
        }
        Ok(m)
    }

    /// Writes the manifest to `path` (as every writer does, see [`weightlift_format::output`]: never over one of
    /// `inputs`, the checkpoint's files).
    pub fn write(&self, path: &Path, inputs: &[&Path]) -> Result<(), PackError> {
        let text = serde_json::to_vec_pretty(self).map_err(|e| PackError::Invalid(e.to_string()))?;
        weightlift_format::output::write_with(path, inputs, |w| std::io::Write::write_all(w, &text))?;
        Ok(())
    }
}

/// Reads every tensor of the checkpoint at `path` (safetensors, shard index or GGUF) and records its chunk
/// checksums; `threads` hash in parallel (0: one per CPU).
pub fn create(path: &Path, threads: usize, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<Manifest, PackError> {
    let index = weightlift_format::open(&[path.to_path_buf()], None)?;
    let files: Vec<File> =
        index.files.iter().map(|f| File::open(&f.path).map_err(PackError::io(&f.path))).collect::<Result<_, _>>()?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| PackError::Invalid(format!("threads: {e}")))?;
    let total = index.total_bytes();
    let done = std::sync::atomic::AtomicU64::new(0);
    let tensors = pool.install(|| {
        index
            .tensors
            .par_iter()
            .map(|t| {
                let src = &index.files[t.file];
                let mut chunks = Vec::with_capacity(t.nbytes.div_ceil(CHUNK_BYTES) as usize);
                let mut buf = vec![0u8; CHUNK_BYTES.min(t.nbytes) as usize];
                let mut at = 0;
                while at < t.nbytes {
                    let len = CHUNK_BYTES.min(t.nbytes - at) as usize;
                    files[t.file].read_exact_at(&mut buf[..len], t.offset + at).map_err(PackError::io(&src.path))?;
                    chunks.push(format!("{:016x}", crate::checksum(&buf[..len])));
                    at += len as u64;
                    let d = done.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed) + len as u64;
                    progress(d, total);
                }
                let file = src.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                Ok(TensorSums { name: t.name.clone(), file, offset: t.offset, nbytes: t.nbytes, chunks })
            })
            .collect::<Result<Vec<_>, PackError>>()
    })?;
    Ok(Manifest::new(CHUNK_BYTES, tensors))
}

/// Re-reads the checkpoint at `path` and checks it against `manifest`; the error names the first tensor and chunk
/// that differ.
pub fn verify(path: &Path, manifest: &Manifest, threads: usize) -> Result<(), PackError> {
    let index = weightlift_format::open(&[path.to_path_buf()], None)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| PackError::Invalid(format!("threads: {e}")))?;
    pool.install(|| {
        index.tensors.par_iter().try_for_each(|t| {
            let sums = manifest.tensor(&t.name).ok_or_else(|| {
                PackError::Invalid(format!("{}: tensor {:?} is not in the manifest", path.display(), t.name))
            })?;
            let src = &index.files[t.file].path;
            let file = File::open(src).map_err(PackError::io(src))?;
            let mut bytes = vec![0u8; t.nbytes as usize];
            file.read_exact_at(&mut bytes, t.offset).map_err(PackError::io(src))?;
            sums.check(manifest.chunk_bytes, &bytes, src)
        })
    })
}
