//! A checkpoint in several files, opened through its `model.safetensors.index.json` as `transformers` writes it:
//! `cargo run --release -p weightlift --example shards [-- INDEX_JSON]`.
//!
//! Without a path, writes three shards of weight-like bf16 values and their index. The index names each tensor's
//! file; `weightlift::format::open` reads every shard's header and checks that each tensor the index names is in its shard.
//! One load then reads all the files at once, into host memory (onto `cuda:0` where CUDA is usable), and every
//! tensor is checked against `std::fs::read` of its shard.

mod common;

use weightlift::{Device, Engine, LoadOpts, Settings};

fn main() -> common::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = match std::env::args().nth(1) {
        Some(p) => p.into(),
        None => common::weights(dir.path(), 6, 256, 3)?,
    };
    let index = weightlift::format::open(&[path], None)?;
    for f in &index.files {
        let n = index.tensors.iter().filter(|t| index.files[t.file].path == f.path).count();
        println!("{}: {n} tensors, {} bytes", f.path.display(), f.len);
    }
    let plain = common::Plain::read(&index)?;

    let engine = Engine::new(Settings::from_env()?)?;
    let mut devices = vec![Device::Cpu];
    match weightlift::cuda::available() {
        Ok(_) => devices.push(Device::Cuda(0)),
        Err(why) => println!("no GPU load: CUDA is not usable here ({why})"),
    }
    for device in devices {
        let loaded = engine.load(&index, device, &LoadOpts::default())?;
        for (t, entry) in loaded.tensors.iter().zip(&index.tensors) {
            plain.check(entry, &t.data)?;
        }
        println!(
            "{device}: {} tensors from {} files, every byte equal to std::fs::read",
            loaded.tensors.len(),
            index.files.len()
        );
        println!("{}", loaded.report.summary());
    }
    Ok(())
}
