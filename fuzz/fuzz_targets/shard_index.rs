#![no_main]
//! Any shard index (with one small valid shard beside it) is read or rejected without a panic.

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let shard = weightlift_format::safetensors::serialize(
        &[(weightlift_format::safetensors::TensorSpec::new("w", weightlift_format::DType::U8, vec![2]), &[1u8, 2][..])],
        &Default::default(),
        8,
    )
    .expect("valid shard");
    common::scratch("s.safetensors", &shard);
    let path = common::scratch("model.safetensors.index.json", data);
    let _ = weightlift_format::sharded::read(&path);
});
