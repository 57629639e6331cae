#![no_main]
//! A raw-file read as the command line and the dstorage-style API ask for it: a dtype name and an optional
//! element count (the input's first line, `DTYPE[:COUNT]`), then the file (the rest). Either the file holds the
//! tensor that spec describes, exactly, or the spec or the file is rejected.

use libfuzzer_sys::fuzz_target;
use weightlift_format::{DType, RawSpec};

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let (line, body) = (&data[..split], data.get(split + 1..).unwrap_or_default());
    let Ok(line) = std::str::from_utf8(line) else { return };
    let (name, count) = match line.split_once(':') {
        Some((name, count)) => match count.parse::<u64>() {
            Ok(c) => (name, Some(c)),
            Err(_) => return,
        },
        None => (line, None),
    };
    let Some(dtype) = DType::parse(name) else { return };
    assert_eq!(DType::parse(dtype.name()), Some(dtype), "{name:?} does not round-trip through its name");
    let path = common::scratch("input.bin", body);
    if let Ok(index) = weightlift_format::raw::read(&path, RawSpec { dtype, count }) {
        common::check_index(&index);
        let t = &index.tensors[0];
        assert_eq!(t.offset, 0);
        if count.is_none() {
            assert_eq!(t.nbytes, body.len() as u64, "a whole-file read must take the whole file");
        }
    }
});
