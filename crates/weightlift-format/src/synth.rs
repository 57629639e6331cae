//! Synthetic checkpoints for tests and benchmarks: realistic layouts filled with seeded random bytes.
//!
//! The bytes of tensor `i` at offset `o` are a pure function of `(seed, i, o)` ([`tensor_bytes`]), so a reader can
//! check a loaded tensor without keeping the file's contents around.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::dtype::{DType, GgmlType};
use crate::error::FormatError;
use crate::gguf::{self, GgufArray, GgufTensorSpec, GgufValue};
use crate::safetensors::{self, TensorSpec};

/// Which tensors a synthetic checkpoint holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// A llama-style decoder: embeddings, attention and MLP weights per layer, norms, output head (BF16 in
    /// safetensors; a Q4_K_M-like mix of quantized types in GGUF).
    Llama,
    /// Many small tensors of 4 KiB–1 MiB (log-uniform), mixed dtypes and odd shapes; `tensors` fixes their count.
    ManySmall {
        /// How many tensors (`None`: as many as the size asks for).
        tensors: Option<u64>,
    },
    /// One tensor holding everything.
    SingleHuge,
}

/// The container to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Container {
    /// A safetensors file.
    Safetensors,
    /// A GGUF (v3) file.
    Gguf,
    /// Random bytes and nothing else; the layout is ignored.
    Raw,
}

/// What to generate.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Which tensors.
    pub layout: Layout,
    /// Which file format.
    pub container: Container,
    /// Target tensor bytes (the result is within one tensor of it, or one layer for `Llama`).
    pub size: u64,
    /// Seed of every byte: the same seed gives the same file.
    pub seed: u64,
    /// Start every tensor at a multiple of this (safetensors: adds padding tensors beyond 8; GGUF: the file's
    /// `general.alignment`). `None` is the format's own default.
    pub align: Option<u64>,
}

/// What was generated.
#[derive(Clone, Debug)]
pub struct Summary {
    /// The file written.
    pub path: PathBuf,
    /// Tensors in it.
    pub tensors: usize,
    /// Bytes of tensor data.
    pub tensor_bytes: u64,
    /// Bytes of the whole file.
    pub file_len: u64,
}

/// `n` weight-like bf16 values, little-endian: N(0, 0.02), the spread of initialised transformer weights, so that
/// their exponent bytes compress as real weights' do (random bytes would not). A small LCG and Box-Muller: tests
/// and benches of packed checkpoints use it.
pub fn bf16_weights(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut out = Vec::with_capacity(n * 2);
    for _ in 0..n {
        let v = 0.02 * (-2.0 * next().ln()).sqrt() * (std::f64::consts::TAU * next()).cos();
        out.extend_from_slice(&(((v as f32).to_bits() >> 16) as u16).to_le_bytes());
    }
    out
}

/// The contents of tensor `tensor` at byte `offset`, written into `buf`.
///
/// splitmix64 over (seed, tensor, 8-byte word index): a counter-based generator can produce any slice of any tensor
/// independently, which a stream generator (`rand`'s) cannot without replaying it from the start.
pub fn tensor_bytes(seed: u64, tensor: u64, offset: u64, buf: &mut [u8]) {
    let key = splitmix(seed ^ tensor.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut word = offset / 8;
    let mut skip = (offset % 8) as usize;
    let mut out = 0;
    while out < buf.len() {
        let bytes = splitmix(key ^ word).to_le_bytes();
        let take = (8 - skip).min(buf.len() - out);
        buf[out..out + take].copy_from_slice(&bytes[skip..skip + take]);
        out += take;
        skip = 0;
        word += 1;
    }
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A small deterministic stream of choices for shapes and dtypes.
struct Choices(u64);

impl Choices {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix(self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A tensor to generate: safetensors dtype, or ggml type for GGUF.
struct Planned {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
}

/// Generates a checkpoint at `path` (as every writer does, see [`crate::output`]: under a temporary name, then
/// renamed into place).
pub fn generate(path: &Path, spec: &Spec) -> Result<Summary, FormatError> {
    let err = |kind| FormatError::new(path, kind);
    let write = |f: &mut dyn FnMut(&mut BufWriter<File>) -> io::Result<()>| -> Result<(), FormatError> {
        crate::output::write_with(path, &[], f)
    };
    let piece = 8 << 20;
    let seed = spec.seed;
    let summary = match spec.container {
        Container::Raw => {
            write(&mut |out| {
                let mut buf = vec![0u8; piece];
                let mut done = 0u64;
                while done < spec.size {
                    let n = (spec.size - done).min(piece as u64) as usize;
                    tensor_bytes(seed, 0, done, &mut buf[..n]);
                    out.write_all(&buf[..n])?;
                    done += n as u64;
                }
                Ok(())
            })?;
            Summary { path: path.to_path_buf(), tensors: 1, tensor_bytes: spec.size, file_len: spec.size }
        }
        Container::Safetensors => {
            let planned = plan(spec.layout, spec.size, seed, false);
            let specs: Vec<TensorSpec> =
                planned.iter().map(|p| TensorSpec::new(&p.name, p.dtype, p.shape.clone())).collect();
            let mut meta = BTreeMap::new();
            meta.insert("format".to_string(), "pt".to_string());
            meta.insert("generator".to_string(), format!("weightlift {} seed {seed}", env!("CARGO_PKG_VERSION")));
            let lay = safetensors::layout(&specs, &meta, spec.align.unwrap_or(8)).map_err(err)?;
            write(&mut |out| lay.write_to(out, piece, |i, off, buf| fill(seed, i, off, buf)))?;
            let tensor_bytes = lay.tensors.iter().map(|t| t.nbytes).sum();
            Summary { path: path.to_path_buf(), tensors: lay.tensors.len(), tensor_bytes, file_len: lay.file_len }
        }
        Container::Gguf => {
            let planned = plan(spec.layout, spec.size, seed, true);
            let specs: Vec<GgufTensorSpec> = planned
                .iter()
                .map(|p| GgufTensorSpec {
                    name: p.name.clone(),
                    ggml: GgmlType::from_dtype(p.dtype).unwrap_or(GgmlType::F32),
                    shape: p.shape.clone(),
                })
                .collect();
            let kv = gguf_metadata(&planned, spec);
            let lay = gguf::layout(&kv, &specs).map_err(err)?;
            write(&mut |out| lay.write_to(out, piece, |i, off, buf| fill(seed, i, off, buf)))?;
            let tensor_bytes = lay.tensors.iter().map(|t| t.nbytes).sum();
            Summary { path: path.to_path_buf(), tensors: lay.tensors.len(), tensor_bytes, file_len: lay.file_len }
        }
    };
    Ok(summary)
}

fn fill(seed: u64, tensor: usize, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    tensor_bytes(seed, tensor as u64, offset, buf);
    Ok(())
}

fn plan(layout: Layout, size: u64, seed: u64, gguf: bool) -> Vec<Planned> {
    match layout {
        Layout::Llama => plan_llama(size, gguf),
        Layout::ManySmall { tensors } => plan_many_small(size, tensors, seed, gguf),
        Layout::SingleHuge => {
            let elements = (size / 4).max(1);
            vec![Planned { name: "huge".into(), dtype: DType::F32, shape: vec![elements] }]
        }
    }
}

fn plan_llama(size: u64, gguf: bool) -> Vec<Planned> {
    let bytes = |t: &[Planned]| t.iter().map(|p| p.dtype.byte_size(&p.shape).unwrap_or(0)).sum::<u64>();
    // The widest model of which one layer fits, then as many layers as fit.
    let mut h = 4096;
    while h > 64 && bytes(&llama_tensors(h, 1, gguf)) > size {
        h /= 2;
    }
    let one = bytes(&llama_tensors(h, 1, gguf));
    let per_layer = bytes(&llama_tensors(h, 2, gguf)) - one;
    let layers = 1 + size.saturating_sub(one) / per_layer.max(1);
    llama_tensors(h, layers, gguf)
}

fn llama_tensors(h: u64, layers: u64, gguf: bool) -> Vec<Planned> {
    let inter = (h * 11 / 4).next_multiple_of(if h >= 256 { 256 } else { 32 });
    let kv = (h / 4).max(32);
    let vocab = (h * 8).min(32_000);
    let q = |inner: u64, want: GgmlType| -> DType {
        if !gguf {
            DType::BF16
        } else if inner.is_multiple_of(want.block_size()) {
            want.dtype()
        } else {
            DType::F16
        }
    };
    let norm = if gguf { DType::F32 } else { DType::BF16 };
    let mut t = Vec::new();
    let mut push = |name: String, dtype: DType, shape: Vec<u64>| t.push(Planned { name, dtype, shape });
    if gguf {
        push("token_embd.weight".into(), q(h, GgmlType::Q6_K), vec![vocab, h]);
        for i in 0..layers {
            push(format!("blk.{i}.attn_norm.weight"), norm, vec![h]);
            push(format!("blk.{i}.attn_q.weight"), q(h, GgmlType::Q4_K), vec![h, h]);
            push(format!("blk.{i}.attn_k.weight"), q(h, GgmlType::Q4_K), vec![kv, h]);
            push(format!("blk.{i}.attn_v.weight"), q(h, GgmlType::Q6_K), vec![kv, h]);
            push(format!("blk.{i}.attn_output.weight"), q(h, GgmlType::Q4_K), vec![h, h]);
            push(format!("blk.{i}.ffn_norm.weight"), norm, vec![h]);
            push(format!("blk.{i}.ffn_gate.weight"), q(h, GgmlType::Q4_K), vec![inter, h]);
            push(format!("blk.{i}.ffn_up.weight"), q(h, GgmlType::Q4_K), vec![inter, h]);
            push(format!("blk.{i}.ffn_down.weight"), q(inter, GgmlType::Q6_K), vec![h, inter]);
        }
        push("output_norm.weight".into(), norm, vec![h]);
        push("output.weight".into(), q(h, GgmlType::Q8_0), vec![vocab, h]);
    } else {
        push("model.embed_tokens.weight".into(), DType::BF16, vec![vocab, h]);
        for i in 0..layers {
            let p = format!("model.layers.{i}");
            push(format!("{p}.input_layernorm.weight"), norm, vec![h]);
            push(format!("{p}.self_attn.q_proj.weight"), DType::BF16, vec![h, h]);
            push(format!("{p}.self_attn.k_proj.weight"), DType::BF16, vec![kv, h]);
            push(format!("{p}.self_attn.v_proj.weight"), DType::BF16, vec![kv, h]);
            push(format!("{p}.self_attn.o_proj.weight"), DType::BF16, vec![h, h]);
            push(format!("{p}.post_attention_layernorm.weight"), norm, vec![h]);
            push(format!("{p}.mlp.gate_proj.weight"), DType::BF16, vec![inter, h]);
            push(format!("{p}.mlp.up_proj.weight"), DType::BF16, vec![inter, h]);
            push(format!("{p}.mlp.down_proj.weight"), DType::BF16, vec![h, inter]);
        }
        push("model.norm.weight".into(), norm, vec![h]);
        push("lm_head.weight".into(), DType::BF16, vec![vocab, h]);
    }
    t
}

fn plan_many_small(size: u64, count: Option<u64>, seed: u64, gguf: bool) -> Vec<Planned> {
    let st_dtypes = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::F8E4M3,
        DType::F64,
        DType::U16,
        DType::F8E5M2,
    ];
    let gguf_dtypes = [DType::F32, DType::F16, DType::BF16, DType::I8, DType::I32, DType::Ggml(GgmlType::Q8_0)];
    let mut rng = Choices(seed ^ 0x5EED);
    let mut t = Vec::new();
    let mut total = 0u64;
    let width = count.map_or(5, |c| c.max(1).to_string().len());
    loop {
        let done = match count {
            Some(c) => t.len() as u64 >= c,
            None => total >= size && !t.is_empty(),
        };
        if done {
            break;
        }
        // log-uniform between 4 KiB and 1 MiB
        let target = (4096.0 * 256f64.powf(rng.unit())) as u64;
        let dtype = if gguf {
            gguf_dtypes[rng.below(gguf_dtypes.len() as u64) as usize]
        } else {
            st_dtypes[rng.below(st_dtypes.len() as u64) as usize]
        };
        let (unit, per_unit) = match dtype {
            DType::Ggml(g) => (g.block_size(), g.type_size()),
            d => (1, d.element_bytes().unwrap_or(1)),
        };
        let units = (target / per_unit).max(1);
        let cols = (1 + rng.below(1024).min(units - 1)) * unit;
        let rows = (units * unit / cols).max(1);
        let shape = if rng.below(4) == 0 { vec![rows * cols] } else { vec![rows, cols] };
        let nbytes = dtype.byte_size(&shape).unwrap_or(0);
        total += nbytes;
        t.push(Planned { name: format!("small.{:0width$}", t.len()), dtype, shape });
    }
    // Files written by `safetensors.torch.save_file` order tensors by element size, largest first, so that every
    // tensor starts aligned to its element size; do the same.
    if !gguf {
        t.sort_by_key(|p| std::cmp::Reverse(p.dtype.element_bytes().unwrap_or(1)));
    }
    t
}

fn gguf_metadata(planned: &[Planned], spec: &Spec) -> Vec<(String, GgufValue)> {
    let s = |v: &str| GgufValue::String(v.to_string());
    let layers = planned.iter().filter(|p| p.name.ends_with("attn_q.weight")).count() as u32;
    let h = planned.iter().find(|p| p.name == "output_norm.weight").map_or(0, |p| p.shape[0]);
    let tokens = GgufArray::String((0..64).map(|i| format!("tok{i}")).collect());
    let scores = GgufArray::F32((0..64).map(|i| -(i as f32)).collect());
    let nested = GgufValue::Array(GgufArray::Array(vec![GgufArray::U32(vec![1, 2]), GgufArray::U32(vec![3])]));
    let mut kv = vec![
        ("general.architecture".to_string(), s("llama")),
        ("general.name".to_string(), s("weightlift synthetic")),
        ("general.file_type".to_string(), GgufValue::U32(15)),
        ("llama.block_count".to_string(), GgufValue::U32(layers)),
        ("llama.embedding_length".to_string(), GgufValue::U32(h as u32)),
        ("llama.rope.freq_base".to_string(), GgufValue::F32(10000.0)),
        ("weightlift.seed".to_string(), GgufValue::U64(spec.seed)),
        ("weightlift.flags".to_string(), GgufValue::Array(GgufArray::Bool(vec![true, false]))),
        ("weightlift.small".to_string(), GgufValue::Array(GgufArray::I8(vec![-1, 7]))),
        ("weightlift.i64".to_string(), GgufValue::I64(-5)),
        ("weightlift.f64".to_string(), GgufValue::F64(0.25)),
        ("weightlift.u16".to_string(), GgufValue::U16(65535)),
        ("weightlift.i16".to_string(), GgufValue::I16(-3)),
        ("weightlift.i32".to_string(), GgufValue::I32(-7)),
        ("weightlift.u8".to_string(), GgufValue::U8(200)),
        ("weightlift.nested".to_string(), nested),
        ("tokenizer.ggml.tokens".to_string(), GgufValue::Array(tokens)),
        ("tokenizer.ggml.scores".to_string(), GgufValue::Array(scores)),
    ];
    if let Some(a) = spec.align {
        kv.push(("general.alignment".to_string(), GgufValue::U32(a as u32)));
    }
    kv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_seekable_and_seeded() {
        let mut whole = vec![0u8; 100];
        tensor_bytes(7, 3, 0, &mut whole);
        for start in [0usize, 1, 7, 8, 9, 50] {
            let mut part = vec![0u8; 100 - start];
            tensor_bytes(7, 3, start as u64, &mut part);
            assert_eq!(part, whole[start..]);
        }
        let mut other = vec![0u8; 100];
        tensor_bytes(8, 3, 0, &mut other);
        assert_ne!(other, whole);
        assert!(whole.iter().any(|&b| b != 0));
    }

    #[test]
    fn llama_plan_fits_the_target() {
        for gguf in [false, true] {
            for size in [64 << 20, 1 << 30, 4 << 30] {
                let p = plan_llama(size, gguf);
                let total: u64 = p.iter().map(|t| t.dtype.byte_size(&t.shape).unwrap()).sum();
                assert!(total <= size && total > size / 2, "{size}: {total}");
            }
        }
    }

    #[test]
    fn many_small_sizes_stay_in_range() {
        let p = plan_many_small(0, Some(500), 1, false);
        assert_eq!(p.len(), 500);
        for t in &p {
            let n = t.dtype.byte_size(&t.shape).unwrap();
            assert!((1..=(1 << 20) + 8192).contains(&n), "{} {n}", t.name);
        }
    }
}
