#![no_main]
//! Any byte string given to the GGUF reader yields an index whose tensors lie inside the file, or an error.

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::scratch("input.gguf", data);
    if let Ok(index) = weightlift_format::gguf::read(&path) {
        for t in &index.tensors {
            assert!(t.end() <= data.len() as u64);
        }
    }
});
