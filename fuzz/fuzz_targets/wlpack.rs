#![no_main]
//! Any byte string given to the pack reader yields an index whose streams lie inside the file and whose items tile
//! their original files, or an error.

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

/// The index checksum (bytes 24..32) recomputed over the header and tables the preamble claims, when they lie in
/// the input: without it nearly every mutation stops at the checksum and the JSON and table parsers are never
/// reached. (A wrong checksum is covered by the hostile corpus and the unit tests.)
fn resealed(data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    if data.len() >= 32 {
        let word = |i: usize| u64::from_le_bytes(data[i..i + 8].try_into().unwrap());
        let (h, t) = (word(8), word(16));
        if let Some(end) = h.checked_add(t).and_then(|n| n.checked_add(32)).filter(|&e| e <= data.len() as u64) {
            let sum = xxhash_rust::xxh3::xxh3_64(&data[32..end as usize]);
            out[24..32].copy_from_slice(&sum.to_le_bytes());
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let data = &resealed(data)[..];
    let path = common::scratch("input.wlpack", data);
    if let Ok(index) = weightlift_format::wlpack::read(&path) {
        for s in &index.streams {
            assert!(s.end() <= data.len() as u64);
        }
        for item in &index.items {
            assert!(item.offset + item.nbytes <= index.files[item.file].len);
        }
    }
});
