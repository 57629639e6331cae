//! Writes the Rust-side fuzzing seeds into `DIR/<target>/`: every hostile-corpus file, routed to the target that
//! reads its kind of file (and all of them to `detect`), plus valid files from weightlift's own writers. Files
//! written by the upstream `safetensors` and `gguf` packages come from `fuzz/seeds.py`.
//!
//! Run by `scripts/fuzz` (`cargo run -p weightlift-pack --example fuzz_seeds -- DIR`). It lives here rather than in
//! the fuzz crate so that the workspace's own build makes it: as the fuzz crate's example it was a second build of
//! every crate under weightlift-format.

use std::collections::BTreeMap;
use std::path::Path;

use weightlift_format::safetensors::{TensorSpec, serialize};
use weightlift_pack::huffman;

/// Seeds of the `huffman` target: streams the encoder wrote (mode 0, their plane length first) and planes to encode
/// (mode 1): skewed bytes like bf16 exponents, one repeated byte, all 256 values.
fn huffman_seeds(dir: &Path) -> std::io::Result<()> {
    let skewed: Vec<u8> = (0..3000u32).map(|i| 0x3c + (i.wrapping_mul(2_654_435_761) >> 29) as u8 % 5).collect();
    let planes: [Vec<u8>; 4] = [skewed, vec![0x3f; 700], (0..=255u8).collect(), vec![1, 2, 1, 1, 3]];
    for (i, plane) in planes.iter().enumerate() {
        let mut stream = vec![0u8];
        stream.extend_from_slice(&(plane.len() as u16).to_le_bytes());
        stream.extend_from_slice(&huffman::encode(plane));
        put(dir, "huffman", &format!("stream_{i}"), &stream)?;
        put(dir, "huffman", &format!("plane_{i}"), &[&[1u8][..], plane].concat())?;
    }
    Ok(())
}
use weightlift_format::{DType, corpus};

fn put(dir: &Path, target: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let sub = dir.join(target);
    std::fs::create_dir_all(&sub)?;
    std::fs::write(sub.join(name), bytes)
}

fn valid_safetensors() -> Vec<(String, Vec<u8>)> {
    let data: Vec<u8> = (0..=255u8).cycle().take(600).collect();
    let specs = [
        (TensorSpec::new("model.embed_tokens.weight", DType::BF16, vec![4, 8]), &data[..64]),
        (TensorSpec::new("model.layers.0.self_attn.q_proj.weight", DType::F32, vec![2, 3]), &data[64..88]),
        (TensorSpec::new("model.norm.weight", DType::F16, vec![5]), &data[88..98]),
        (TensorSpec::new("lm_head.bias", DType::I64, vec![2]), &data[98..114]),
        (TensorSpec::new("packed", DType::F4, vec![6]), &data[114..117]),
        (TensorSpec::new("flag", DType::Bool, vec![1]), &data[117..118]),
        (TensorSpec::new("scalar", DType::F64, vec![]), &data[118..126]),
        (TensorSpec::new("empty", DType::U8, vec![0, 3]), &data[126..126]),
    ];
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    let mut out = Vec::new();
    for (name, align) in
        [("valid_8.safetensors", 8), ("valid_aligned_64.safetensors", 64), ("valid_aligned_4096.safetensors", 4096)]
    {
        if let Ok(bytes) = serialize(&specs, &meta, align) {
            out.push((name.to_string(), bytes));
        }
    }
    if let Ok(bytes) = serialize(&[], &BTreeMap::new(), 8) {
        out.push(("valid_empty.safetensors".to_string(), bytes));
    }
    out
}

fn main() -> std::io::Result<()> {
    let dir = std::env::args_os().nth(1).ok_or_else(|| std::io::Error::other("usage: seeds DIR"))?;
    let dir = Path::new(&dir);
    huffman_seeds(dir)?;
    for case in corpus::hostile() {
        let (file, bytes) = &case.files[0];
        let name = format!("hostile_{}", case.name.replace(' ', "_"));
        let target = match Path::new(file).extension().and_then(|e| e.to_str()) {
            Some("safetensors") => Some("safetensors"),
            Some("gguf") => Some("gguf"),
            Some("json") => Some("shard_index"),
            _ => None,
        };
        if let Some(target) = target {
            put(dir, target, &name, bytes)?;
        }
        put(dir, "detect", &name, bytes)?;
    }
    for (name, bytes) in valid_safetensors() {
        put(dir, "safetensors", &name, &bytes)?;
        put(dir, "detect", &name, &bytes)?;
    }
    put(dir, "gguf", "valid.gguf", &corpus::valid_gguf())?;
    put(dir, "detect", "valid.gguf", &corpus::valid_gguf())?;
    let index = br#"{"metadata":{"total_size":2},"weight_map":{"w":"s.safetensors"}}"#;
    put(dir, "shard_index", "valid.index.json", index)?;
    let data: Vec<u8> = (1..=200u8).collect();
    for (name, spec, len) in
        [("f32", "F32", 16), ("bf16_count", "bf16:3", 8), ("q4_k", "Q4_K:256", 144), ("f4", "F4:5", 3), ("u8", "U8", 7)]
    {
        let mut input = format!("{spec}\n").into_bytes();
        input.extend_from_slice(&data[..len]);
        put(dir, "raw", name, &input)?;
    }
    Ok(())
}
