//! `weightlift::candle::load` onto `cuda:0` against `candle_core::safetensors::load` onto `cuda:0`, on one
//! safetensors file in the page cache: the loads alternate (which goes first alternates too), each timed to the
//! device being idle, best of `--runs`; before timing, one load of each is checked byte for byte against the file.
//! Prints one JSON object (GB/s: tensor bytes over seconds, 10^9 bytes).
//!
//! Usage: candle_cuda_bench [PATH] [--dir DIR] [--size 4GiB] [--runs 3]
//! Without PATH it writes a llama-shaped checkpoint of `--size` tensor bytes into a temporary folder under DIR
//! (default the system's), removed at the end. Built only with the `candle-cuda` feature.

use std::error::Error;
use std::path::PathBuf;
use std::time::Instant;

use weightlift::candle_core::{self, Tensor};
use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::{Engine, Settings};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

struct Args {
    path: Option<PathBuf>,
    dir: PathBuf,
    size: u64,
    runs: usize,
}

fn args() -> Result<Args> {
    let mut a = Args { path: None, dir: std::env::temp_dir(), size: 4 << 30, runs: 3 };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--dir" => a.dir = value()?.into(),
            "--size" => a.size = weightlift::io::parse_bytes(&value()?)?,
            "--runs" => a.runs = value()?.parse()?,
            _ if a.path.is_none() && !arg.starts_with("--") => a.path = Some(arg.into()),
            _ => return Err(format!("unknown argument {arg}").into()),
        }
    }
    Ok(a)
}

/// The bytes of `t`'s device storage, copied to the host as stored.
fn device_bytes(t: &Tensor) -> Result<Vec<u8>> {
    Ok(weightlift::candle::device_bytes(t)?)
}

fn main() -> Result<()> {
    let a = args()?;
    // candle appends a backtrace to its errors where RUST_BACKTRACE is set: its first line says why.
    let gpu = candle_core::Device::new_cuda(0)
        .map_err(|e| format!("candle cannot open cuda:0: {}", e.to_string().lines().next().unwrap_or("")))?;
    let _generated;
    let path = match a.path {
        Some(p) => p,
        None => {
            std::fs::create_dir_all(&a.dir)?;
            let dir = tempfile::tempdir_in(&a.dir)?;
            let path = dir.path().join("model.safetensors");
            let spec =
                Spec { layout: Layout::Llama, container: Container::Safetensors, size: a.size, seed: 43, align: None };
            let s = synth::generate(&path, &spec)?;
            eprintln!("generated {} ({} tensors, {} bytes)", path.display(), s.tensors, s.tensor_bytes);
            _generated = dir;
            path
        }
    };
    let engine = Engine::new(Settings::default())?;
    let index = weightlift::format::open(std::slice::from_ref(&path), None)?;
    let bytes = index.total_bytes();

    // Warms the page cache and checks one load of each against the file.
    let file = std::fs::read(&path)?;
    let ours = weightlift::candle::load(&engine, &index, &gpu)?;
    let theirs = candle_core::safetensors::load(&path, &gpu)?;
    for t in &index.tensors {
        let want = &file[t.offset as usize..t.end() as usize];
        let (a, b) = (&ours[&t.name], &theirs[&t.name]);
        if a.dtype() != b.dtype() || a.dims() != b.dims() {
            return Err(format!(
                "{}: {:?} {:?} against candle's {:?} {:?}",
                t.name,
                a.dtype(),
                a.dims(),
                b.dtype(),
                b.dims()
            )
            .into());
        }
        if device_bytes(a)? != want || device_bytes(b)? != want {
            return Err(format!("{}: device bytes differ from the file", t.name).into());
        }
    }
    drop((ours, theirs, file));

    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for run in 0..a.runs {
        for weightlift_turn in [run % 2 == 0, run % 2 == 1] {
            let t = Instant::now();
            let loaded = if weightlift_turn {
                weightlift::candle::load(&engine, &index, &gpu)?
            } else {
                candle_core::safetensors::load(&path, &gpu)?
            };
            gpu.synchronize()?;
            let secs = t.elapsed().as_secs_f64();
            assert_eq!(loaded.len(), index.tensors.len());
            drop(loaded); // freed outside the timing
            if weightlift_turn { ours.push(secs) } else { theirs.push(secs) }
        }
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let gbps = |secs: f64| bytes as f64 / 1e9 / secs;
    let (w, c) = (gbps(best(&ours)), gbps(best(&theirs)));
    let out = serde_json::json!({
        "file": path,
        "tensor_bytes": bytes,
        "tensors": index.tensors.len(),
        "device": "cuda:0",
        "cache": "warm",
        "checked": "every byte of one load of each equals the file",
        "weightlift_secs": ours,
        "candle_secs": theirs,
        "weightlift_gbps": w,
        "candle_gbps": c,
        "ratio": w / c,
    });
    println!("{out}");
    Ok(())
}
