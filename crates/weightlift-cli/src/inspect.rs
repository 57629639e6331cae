//! `weightlift inspect`: what a checkpoint holds, read from its headers alone.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use serde_json::{Value, json};
use weightlift::format::{DType, Metadata, RawSpec, TensorIndex};

use crate::units;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint files: safetensors, model.safetensors.index.json, GGUF, a .wlpack, or raw with --raw.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Read the files as raw tensors of this dtype (F32, BF16, U8, ...).
    #[arg(long, value_name = "DTYPE", value_parser = parse_dtype)]
    pub raw: Option<DType>,
    /// With --raw: the number of elements to take (default: the whole file).
    #[arg(long, requires = "raw")]
    pub count: Option<u64>,
    /// How many of the largest tensors to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// With --json: every element of GGUF metadata arrays (by default an array of more than 16 elements shows as
    /// its type, length and first 16 elements; a tokenizer's vocabulary can hold 150,000).
    #[arg(long)]
    pub all_metadata: bool,
}

/// Elements of a metadata array shown before it is summarized.
const ARRAY_ITEMS_SHOWN: usize = 16;

pub fn parse_dtype(s: &str) -> Result<DType, String> {
    DType::parse(s).ok_or_else(|| format!("unknown dtype {s:?} (try F32, BF16, F16, U8, I64, Q4_K)"))
}

pub fn run(args: &Args) -> Result<()> {
    if let [path] = args.paths.as_slice()
        && args.raw.is_none()
        && weightlift::is_pack_file(path)
    {
        return crate::packing::inspect(path, args.json, args.top);
    }
    let raw = args.raw.map(|dtype| RawSpec { dtype, count: args.count });
    let index = weightlift::format::open(&args.paths, raw)?;
    if args.json {
        let arrays = if args.all_metadata { None } else { Some(ARRAY_ITEMS_SHOWN) };
        println!("{}", serde_json::to_string(&to_json(&index, arrays))?);
    } else {
        print_summary(&index, args.top);
    }
    Ok(())
}

const ALIGN: u64 = 4096;

pub fn format_name(index: &TensorIndex) -> &'static str {
    index.format().map_or("mixed", |f| f.name())
}

/// The index as JSON; GGUF metadata arrays longer than `arrays` elements summarized (all of them with `None`).
pub fn to_json(index: &TensorIndex, arrays: Option<usize>) -> Value {
    let files: Vec<Value> = index
        .files
        .iter()
        .map(|f| {
            json!({
                "path": f.path, "format": f.format.name(), "len": f.len, "data_start": f.data_start,
                "gguf_version": f.gguf_version, "metadata": metadata_json(&f.metadata, arrays),
            })
        })
        .collect();
    let tensors: Vec<Value> = index
        .tensors
        .iter()
        .map(|t| {
            json!({
                "name": t.name, "dtype": t.dtype.name(), "shape": t.shape, "offset": t.offset,
                "nbytes": t.nbytes, "file": t.file,
            })
        })
        .collect();
    let dtypes: BTreeMap<&str, Value> = dtype_histogram(index)
        .into_iter()
        .map(|(d, (count, bytes))| (d.name(), json!({"tensors": count, "bytes": bytes})))
        .collect();
    json!({
        "format": format_name(index),
        "files": files,
        "tensor_count": index.tensors.len(),
        "total_bytes": index.total_bytes(),
        "aligned_4k": aligned(index),
        "dtypes": dtypes,
        "tensors": tensors,
    })
}

fn metadata_json(m: &Metadata, arrays: Option<usize>) -> Value {
    let value = |v: &weightlift::format::gguf::GgufValue| arrays.map_or_else(|| v.to_json(), |n| v.to_json_summary(n));
    match m {
        Metadata::None => Value::Null,
        Metadata::Safetensors(map) => json!(map),
        Metadata::Gguf(kv) => Value::Object(kv.iter().map(|(k, v)| (k.clone(), value(v))).collect()),
    }
}

fn dtype_histogram(index: &TensorIndex) -> BTreeMap<DType, (u64, u64)> {
    let mut h: BTreeMap<DType, (u64, u64)> = BTreeMap::new();
    for t in &index.tensors {
        let e = h.entry(t.dtype).or_default();
        e.0 += 1;
        e.1 += t.nbytes;
    }
    h
}

fn aligned(index: &TensorIndex) -> usize {
    index.tensors.iter().filter(|t| t.offset % ALIGN == 0).count()
}

fn print_summary(index: &TensorIndex, top: usize) {
    for f in &index.files {
        let version = f.gguf_version.map(|v| format!(" v{v}")).unwrap_or_default();
        let meta = match &f.metadata {
            Metadata::None => String::new(),
            Metadata::Safetensors(m) => format!(", {} metadata entries", m.len()),
            Metadata::Gguf(kv) => format!(", {} metadata keys", kv.len()),
        };
        println!(
            "{}: {}{version}, {} file, data from byte {}{meta}",
            f.path.display(),
            f.format.name(),
            units::bytes(f.len),
            f.data_start
        );
    }
    println!(
        "{} tensors, {} ({} bytes); {}/{} start on a 4 KiB boundary",
        index.tensors.len(),
        units::bytes(index.total_bytes()),
        index.total_bytes(),
        aligned(index),
        index.tensors.len()
    );
    let hist: Vec<String> =
        dtype_histogram(index).into_iter().map(|(d, (n, b))| format!("{d} ×{n} ({})", units::bytes(b))).collect();
    println!("dtypes: {}", hist.join(", "));
    let mut largest: Vec<_> = index.tensors.iter().collect();
    largest.sort_by(|a, b| b.nbytes.cmp(&a.nbytes).then_with(|| a.name.cmp(&b.name)));
    if !largest.is_empty() && top > 0 {
        println!("largest:");
        let width = largest.iter().take(top).map(|t| t.name.len()).max().unwrap_or(0);
        for t in largest.iter().take(top) {
            println!(
                "  {:width$}  {:7}  {:20}  {:>10}  @{}",
                t.name,
                t.dtype.name(),
                format!("{:?}", t.shape),
                units::bytes(t.nbytes),
                t.offset
            );
        }
    }
}
