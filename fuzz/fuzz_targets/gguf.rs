#![no_main]
//! Any byte string given to the GGUF reader yields a consistent index (see `common::check_index`) or an error.

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::scratch("input.gguf", data);
    if let Ok(index) = weightlift_format::gguf::read(&path) {
        assert_eq!(index.files[0].len, data.len() as u64);
        common::check_index(&index);
    }
});
