#![no_main]
//! Any byte string given to the pack reader yields an index whose streams lie inside the file and whose items tile
//! their original files, or an error.

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::scratch("input.wlpack", data);
    if let Ok(index) = weightlift_format::pack::read(&path) {
        for s in &index.streams {
            assert!(s.end() <= data.len() as u64);
        }
        for item in &index.items {
            assert!(item.offset + item.nbytes <= index.files[item.file].len);
        }
    }
});
