#![no_main]
//! A file without a telling extension goes through format detection (its first bytes) and then the reader that
//! detection picks: either a consistent index or an error, whatever the bytes.

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::scratch("checkpoint", data);
    if let Ok(index) = weightlift_format::open(std::slice::from_ref(&path), None) {
        common::check_index(&index);
    }
});
