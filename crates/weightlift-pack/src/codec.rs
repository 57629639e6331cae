//! The CPU side of each codec, writing exactly the stream formats the GPU decoders read: a zstd frame, an LZ4 block,
//! raw deflate (nvCOMP's batched decoders), weightlift's Huffman stream (its own kernel, see [`crate::huffman`]).

use std::cell::RefCell;
use std::io::Write;

use weightlift_format::wlpack::Codec;

/// Compression effort: a zstd level (1–22), mapped onto deflate's 1–9; LZ4 and Huffman have one level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Level(pub i32);

impl Default for Level {
    fn default() -> Level {
        Level(3)
    }
}

thread_local! {
    static ZSTD_C: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static ZSTD_D: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Compresses `raw` with `codec`; `Raw` returns the bytes unchanged.
pub fn compress(codec: Codec, level: Level, raw: &[u8]) -> Result<Vec<u8>, String> {
    match codec {
        Codec::Raw => Ok(raw.to_vec()),
        Codec::Zstd => ZSTD_C.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.as_ref().is_none_or(|(l, _)| *l != level.0) {
                let c = zstd::bulk::Compressor::new(level.0).map_err(|e| format!("zstd: {e}"))?;
                *slot = Some((level.0, c));
            }
            let (_, c) = slot.as_mut().ok_or("zstd: no compressor")?;
            c.compress(raw).map_err(|e| format!("zstd: {e}"))
        }),
        Codec::Lz4 => Ok(lz4_flex::block::compress(raw)),
        Codec::Huffman => Ok(crate::huffman::encode(raw)),
        Codec::Deflate => {
            let level = flate2::Compression::new(level.0.clamp(1, 9) as u32);
            let mut enc = flate2::write::DeflateEncoder::new(Vec::with_capacity(raw.len() / 2), level);
            enc.write_all(raw).map_err(|e| format!("deflate: {e}"))?;
            enc.finish().map_err(|e| format!("deflate: {e}"))
        }
    }
}

/// Decodes `stored` into `out`, which must be filled exactly.
pub fn decompress(codec: Codec, stored: &[u8], out: &mut [u8]) -> Result<(), String> {
    let n = match codec {
        Codec::Raw => {
            if stored.len() != out.len() {
                return Err(format!("{} stored bytes for {} raw bytes", stored.len(), out.len()));
            }
            out.copy_from_slice(stored);
            out.len()
        }
        Codec::Zstd => ZSTD_D.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.is_none() {
                *slot = Some(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?);
            }
            let d = slot.as_mut().ok_or("no decompressor")?;
            d.decompress_to_buffer(stored, out).map_err(|e| e.to_string())
        })?,
        Codec::Lz4 => lz4_flex::block::decompress_into(stored, out).map_err(|e| e.to_string())?,
        Codec::Huffman => {
            crate::huffman::decode(stored, out)?;
            out.len()
        }
        Codec::Deflate => {
            let mut d = flate2::Decompress::new(false);
            let status = d.decompress(stored, out, flate2::FlushDecompress::Finish).map_err(|e| e.to_string())?;
            if status != flate2::Status::StreamEnd {
                return Err(format!("stream did not end after {} bytes", d.total_out()));
            }
            d.total_out() as usize
        }
    };
    if n != out.len() {
        return Err(format!("decoded {n} bytes, expected {}", out.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips_and_rejects_a_wrong_length() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 7 + (i / 1000) % 3) as u8).collect();
        for codec in Codec::ALL {
            let stored = compress(codec, Level::default(), &data).unwrap();
            // Huffman codes each byte alone (about 3 bits for these 9 values); the others find the repeats.
            let bound = if codec == Codec::Huffman { data.len() / 2 } else { data.len() / 4 };
            if codec != Codec::Raw {
                assert!(stored.len() < bound, "{codec:?} did not shrink repetitive data");
            }
            let mut out = vec![0u8; data.len()];
            decompress(codec, &stored, &mut out).unwrap();
            assert_eq!(out, data, "{codec:?}");
            let mut short = vec![0u8; data.len() + 1];
            assert!(decompress(codec, &stored, &mut short).is_err(), "{codec:?} accepted a wrong length");
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let garbage: Vec<u8> = (0..999u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for codec in [Codec::Zstd, Codec::Lz4, Codec::Deflate, Codec::Huffman] {
            let mut out = vec![0u8; 4096];
            assert!(decompress(codec, &garbage, &mut out).is_err(), "{codec:?}");
        }
    }
}
