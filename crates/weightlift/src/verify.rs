//! Independent checks of loaded bytes: a second read of each tensor through plain `pread` (an object's through
//! plain ranged GETs at the version it was loaded at), and a fast checksum.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use weightlift_format::TensorIndex;
use weightlift_remote::Object;

use crate::error::{Error, Result};

/// Bytes compared per read when re-reading a tensor.
const CHUNK: usize = 8 << 20;
/// Reads made at once: an object's GETs wait for their first byte, and a bucket gives each ~90 MB/s.
const AT_ONCE: usize = 8;

/// Where a file's bytes are read again from.
enum Source {
    File(File),
    /// The object as it was opened for the load: each GET asks for its ETag, so a replaced object is an error,
    /// never a comparison with other bytes.
    Object(Arc<Object>),
}

impl Source {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::result::Result<(), String> {
        match self {
            Source::File(f) => f.read_exact_at(buf, offset).map_err(|e| e.to_string()),
            Source::Object(o) => o.read_at(offset, buf).map_err(|e| e.to_string()),
        }
    }
}

/// Re-reads every tensor of `index` (files with plain `pread`, objects with plain ranged GETs) and compares it
/// with `get(i)`, the loaded bytes of tensor `i` (which may copy device memory back). Fails naming the first
/// tensor and byte that differ.
pub fn compare_with_file(index: &TensorIndex, mut get: impl FnMut(usize, u64, &mut [u8]) -> Result<()>) -> Result<()> {
    let sources: Vec<Source> = index
        .files
        .iter()
        .map(|f| match &f.object {
            Some(o) => Ok(Source::Object(o.clone())),
            None => File::open(&f.path)
                .map(Source::File)
                .map_err(|e| Error::Verify(format!("{}: cannot reopen: {e}", f.path.display()))),
        })
        .collect::<Result<_>>()?;
    // (tensor, offset in it, length) of every read, in order.
    let mut reads = Vec::new();
    for (i, t) in index.tensors.iter().enumerate() {
        let mut done = 0u64;
        while done < t.nbytes {
            let n = (t.nbytes - done).min(CHUNK as u64) as usize;
            reads.push((i, done, n));
            done += n as u64;
        }
    }
    let mut want: Vec<Vec<u8>> = (0..AT_ONCE.min(reads.len())).map(|_| vec![0u8; CHUNK]).collect();
    let mut got = vec![0u8; CHUNK];
    for batch in reads.chunks(AT_ONCE) {
        // The batch's reads at once (a thread each), then compared one by one with what was loaded.
        let read: Vec<std::result::Result<(), String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .iter()
                .zip(want.iter_mut())
                .map(|(&(i, off, n), buf)| {
                    let t = &index.tensors[i];
                    let source = &sources[t.file];
                    scope.spawn(move || source.read_exact_at(&mut buf[..n], t.offset + off))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("the reading thread panicked".into())))
                .collect()
        });
        for ((&(i, off, n), buf), r) in batch.iter().zip(&want).zip(read) {
            let t = &index.tensors[i];
            r.map_err(|e| {
                Error::Verify(format!("{}: re-reading {:?}: {e}", index.files[t.file].path.display(), t.name))
            })?;
            get(i, off, &mut got[..n])?;
            if buf[..n] != got[..n] {
                let at = buf[..n].iter().zip(&got[..n]).position(|(a, b)| a != b).unwrap_or(0) as u64 + off;
                return Err(Error::Verify(format!(
                    "tensor {:?} of {} differs from the file at byte {at} of {}",
                    t.name,
                    index.files[t.file].path.display(),
                    t.nbytes
                )));
            }
        }
    }
    Ok(())
}

/// An order-dependent 64-bit checksum of a byte string, fast enough to run over gigabytes after a timed load.
pub fn checksum(data: &[u8]) -> u64 {
    let mut h = 0x243F_6A88_85A3_08D3u64 ^ data.len() as u64;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_le_bytes(w.try_into().unwrap_or_default());
        h = (h ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::checksum;

    #[test]
    fn checksum_sees_order_and_length() {
        assert_ne!(checksum(b"abcdefgh12345678"), checksum(b"12345678abcdefgh"));
        assert_ne!(checksum(b"a"), checksum(b"a\0"));
        assert_eq!(checksum(b"same bytes"), checksum(b"same bytes"));
    }
}
