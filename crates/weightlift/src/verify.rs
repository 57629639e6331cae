//! Independent checks of loaded bytes: a second read of each tensor through plain `pread`, and a fast checksum.

use std::fs::File;
use std::os::unix::fs::FileExt;

use weightlift_format::TensorIndex;

use crate::error::{Error, Result};

/// Bytes compared per read when re-reading a tensor.
const CHUNK: usize = 8 << 20;

/// Re-reads every tensor of `index` with plain `pread` and compares it with `get(i)`, the loaded bytes of tensor `i`
/// (which may copy device memory back). Fails naming the first tensor and byte that differ.
pub fn compare_with_file(index: &TensorIndex, mut get: impl FnMut(usize, u64, &mut [u8]) -> Result<()>) -> Result<()> {
    let files: Vec<File> = index
        .files
        .iter()
        .map(|f| File::open(&f.path).map_err(|e| Error::Verify(format!("{}: cannot reopen: {e}", f.path.display()))))
        .collect::<Result<_>>()?;
    let mut want = vec![0u8; CHUNK];
    let mut got = vec![0u8; CHUNK];
    for (i, t) in index.tensors.iter().enumerate() {
        let mut done = 0u64;
        while done < t.nbytes {
            let n = (t.nbytes - done).min(CHUNK as u64) as usize;
            files[t.file].read_exact_at(&mut want[..n], t.offset + done).map_err(|e| {
                Error::Verify(format!("{}: re-reading {:?}: {e}", index.files[t.file].path.display(), t.name))
            })?;
            get(i, done, &mut got[..n])?;
            if want[..n] != got[..n] {
                let at = want[..n].iter().zip(&got[..n]).position(|(a, b)| a != b).unwrap_or(0) as u64 + done;
                return Err(Error::Verify(format!(
                    "tensor {:?} of {} differs from the file at byte {at} of {}",
                    t.name,
                    index.files[t.file].path.display(),
                    t.nbytes
                )));
            }
            done += n as u64;
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
