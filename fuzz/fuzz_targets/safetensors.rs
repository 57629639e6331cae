#![no_main]
//! Any byte string given to the safetensors reader yields an index whose tensors lie inside the file, or an error.

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::scratch("input.safetensors", data);
    if let Ok(index) = weightlift_format::safetensors::read(&path) {
        for t in &index.tensors {
            assert!(t.end() <= data.len() as u64);
        }
    }
});
