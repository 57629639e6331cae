//! What the examples share: a checkpoint to read (the path given, or a small synthetic one written for the run) and
//! the check of loaded bytes against a plain `std::fs::read` of the files.

#![allow(dead_code)] // each example uses part of it

use std::error::Error;
use std::path::{Path, PathBuf};

use weightlift::TensorData;
use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::format::{TensorEntry, TensorIndex};

/// The examples' error type: any error, printed by `main`.
pub type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// A checkpoint for one run: the user's, or one generated into a temporary directory removed at drop.
pub struct Checkpoint {
    pub path: PathBuf,
    pub dir: Option<tempfile::TempDir>,
}

/// The path given as the first argument, else a synthetic llama-style safetensors checkpoint of `size` bytes of
/// seeded random (non-zero) data, so that the example runs from a fresh clone.
pub fn checkpoint(size: u64) -> Result<Checkpoint> {
    if let Some(p) = std::env::args().nth(1) {
        return Ok(Checkpoint { path: p.into(), dir: None });
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("model.safetensors");
    let spec = Spec { layout: Layout::Llama, container: Container::Safetensors, size, seed: 41, align: None };
    let s = synth::generate(&path, &spec)?;
    println!("no path given: generated {} ({} tensors, {} bytes)", path.display(), s.tensors, s.tensor_bytes);
    Ok(Checkpoint { path, dir: Some(dir) })
}

/// Every file of a checkpoint read with `std::fs::read`: what the loaded bytes are compared with. Whole files are
/// held in memory, which suits the small checkpoints the examples generate.
pub struct Plain(Vec<Vec<u8>>);

impl Plain {
    pub fn read(index: &TensorIndex) -> Result<Plain> {
        Ok(Plain(index.files.iter().map(|f| std::fs::read(&f.path)).collect::<std::io::Result<_>>()?))
    }

    /// The bytes `t` spans in its file.
    pub fn bytes(&self, t: &TensorEntry) -> &[u8] {
        &self.0[t.file][t.offset as usize..t.end() as usize]
    }

    /// Fails unless `data` (in host or device memory) holds exactly the bytes `t` spans in its file.
    pub fn check(&self, t: &TensorEntry, data: &TensorData) -> Result<()> {
        let mut got = vec![0u8; data.len()];
        data.read_back(0, &mut got)?;
        same(&t.name, self.bytes(t), &got)
    }
}

/// Fails with the first differing byte unless `got` equals `want`.
pub fn same(name: &str, want: &[u8], got: &[u8]) -> Result<()> {
    if want.len() != got.len() {
        return Err(format!("{name}: {} bytes loaded, {} in the file", got.len(), want.len()).into());
    }
    if let Some(i) = want.iter().zip(got).position(|(a, b)| a != b) {
        return Err(format!("{name}: byte {i} is {:#04x}, the file has {:#04x}", got[i], want[i]).into());
    }
    Ok(())
}

/// Writes a small llama-shaped checkpoint of weight-like bf16 values (N(0, 0.02), the spread of initialised
/// weights, so that it compresses as real weights do, which random bytes would not) into `shards` safetensors files
/// under `dir`, layers split evenly between them. With several shards it also writes the
/// `model.safetensors.index.json` that names each tensor's file, as `transformers` does. Returns the path to open:
/// the one file, or the index.
pub fn weights(dir: &Path, layers: usize, hidden: u64, shards: usize) -> Result<PathBuf> {
    use weightlift::format::DType;
    use weightlift::format::safetensors::{TensorSpec, serialize};

    let shards = shards.clamp(1, layers.max(1));
    let mut names: Vec<Vec<(String, Vec<u64>)>> = vec![Vec::new(); shards];
    names[0].push(("model.embed_tokens.weight".into(), vec![1024, hidden]));
    for l in 0..layers {
        let shard = &mut names[l * shards / layers];
        for (part, shape) in [
            ("input_layernorm", vec![hidden]),
            ("self_attn.q_proj", vec![hidden, hidden]),
            ("self_attn.k_proj", vec![hidden / 4, hidden]),
            ("self_attn.v_proj", vec![hidden / 4, hidden]),
            ("self_attn.o_proj", vec![hidden, hidden]),
            ("mlp.up_proj", vec![hidden * 2, hidden]),
            ("mlp.down_proj", vec![hidden, hidden * 2]),
        ] {
            shard.push((format!("model.layers.{l}.{part}.weight"), shape));
        }
    }
    names[shards - 1].push(("lm_head.weight".into(), vec![1024, hidden]));

    let mut weight_map = serde_json::Map::new();
    let (mut total, mut seed) = (0u64, 0u64);
    let mut files = Vec::new();
    for (s, tensors) in names.iter().enumerate() {
        let file = if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{shards:05}.safetensors", s + 1)
        };
        let data: Vec<(TensorSpec, Vec<u8>)> = tensors
            .iter()
            .map(|(name, shape)| {
                seed += 1;
                let n = shape.iter().product::<u64>() as usize;
                weight_map.insert(name.clone(), file.clone().into());
                total += 2 * n as u64;
                (TensorSpec::new(name.as_str(), DType::BF16, shape.clone()), synth::bf16_weights(n, seed))
            })
            .collect();
        let refs: Vec<(TensorSpec, &[u8])> = data.iter().map(|(t, d)| (t.clone(), d.as_slice())).collect();
        std::fs::write(dir.join(&file), serialize(&refs, &Default::default(), 8)?)?;
        files.push(dir.join(file));
    }
    if shards == 1 {
        return Ok(files.remove(0));
    }
    let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    let path = dir.join("model.safetensors.index.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&index)?)?;
    Ok(path)
}
