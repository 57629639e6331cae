#![no_main]
//! Any shard index (with one small valid shard, `s.safetensors`, beside it) is read into a consistent index or
//! rejected, and never names a shard outside its folder.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use weightlift_format::safetensors::{TensorSpec, serialize};

#[path = "common.rs"]
mod common;

/// The shard every index may name, written once per process (inputs cannot change it).
fn shard_path() -> &'static Path {
    static SHARD: OnceLock<PathBuf> = OnceLock::new();
    SHARD.get_or_init(|| {
        let spec = TensorSpec::new("w", weightlift_format::DType::U8, vec![2]);
        let shard = serialize(&[(spec, &[1u8, 2][..])], &Default::default(), 8).expect("valid shard");
        common::scratch("s.safetensors", &shard)
    })
}

fuzz_target!(|data: &[u8]| {
    let shard_path = shard_path();
    let path = common::scratch("model.safetensors.index.json", data);
    if let Ok(index) = weightlift_format::sharded::read(&path) {
        common::check_index(&index);
        assert!(index.files.iter().all(|f| f.path.parent() == shard_path.parent()), "a shard outside the folder");
    }
});
