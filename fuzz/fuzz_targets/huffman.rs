#![no_main]
//! weightlift's Huffman streams (`weightlift_pack::huffman`, the packs' default codec): any byte string given to
//! the decoder with any plane length is an error or a plane of exactly that length, never a panic or an access
//! outside the stream; any plane the encoder is given decodes back to itself.
//!
//! Input: a mode byte; mode even: two bytes of plane length (little-endian, so under 64 KiB: a pack's planes are
//! 64 KiB by default, at most 16 MiB), then the stream; mode odd: the plane to encode.

use libfuzzer_sys::fuzz_target;

// The codec's module uses only `std`: it is included by path so that the fuzz build does not also compile
// weightlift-pack's C codecs (zstd) under the sanitizer.
#[path = "../../crates/weightlift-pack/src/huffman.rs"]
mod huffman;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode & 1 == 0 {
        let Some((len, stream)) = rest.split_first_chunk::<2>() else { return };
        let mut out = vec![0u8; usize::from(u16::from_le_bytes(*len))];
        let _ = huffman::decode(stream, &mut out);
    } else {
        let stored = huffman::encode(rest);
        let mut out = vec![0u8; rest.len()];
        huffman::decode(&stored, &mut out).expect("a stream the encoder wrote decodes");
        assert!(out == rest, "a plane of {} bytes did not round-trip", rest.len());
    }
});
