//! The file writer shared by the safetensors and GGUF writers.

use std::io::{self, Read, Write};

use crate::index::TensorEntry;

/// Writes `header`, then each tensor's bytes at its offset (zeros in between and up to `file_len`), the bytes coming
/// from `fill` in pieces of at most `piece` bytes.
pub(crate) fn write_file<W: Write>(
    out: &mut W,
    header: &[u8],
    tensors: &[TensorEntry],
    file_len: u64,
    piece: usize,
    mut fill: impl FnMut(usize, u64, &mut [u8]) -> io::Result<()>,
) -> io::Result<()> {
    out.write_all(header)?;
    let mut pos = header.len() as u64;
    let mut buf = vec![0u8; piece.max(1)];
    for (i, t) in tensors.iter().enumerate() {
        io::copy(&mut io::repeat(0).take(t.offset.saturating_sub(pos)), out)?;
        let mut done = 0u64;
        while done < t.nbytes {
            let n = (t.nbytes - done).min(buf.len() as u64) as usize;
            fill(i, done, &mut buf[..n])?;
            out.write_all(&buf[..n])?;
            done += n as u64;
        }
        pos = t.end();
    }
    io::copy(&mut io::repeat(0).take(file_len.saturating_sub(pos)), out)?;
    Ok(())
}
