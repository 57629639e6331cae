//! A packed checkpoint (`.wlpack`): `cargo run --release -p weightlift --example packed [-- FILE]`.
//!
//! Packs a safetensors checkpoint (FILE, or a small one of weight-like bf16 values written for the run) with the
//! default options (byte planes, weightlift's Huffman codec), then loads the pack: decoded on the GPU onto `cuda:0`
//! where CUDA is usable, on the CPU into host memory otherwise (`Decoder::Auto`). Every tensor is checked against
//! `std::fs::read` of the original file.

mod common;

use weightlift::{Decoder, Device, Engine, LoadOpts, Settings};
use weightlift_pack::PackOptions;

fn main() -> common::Result<()> {
    let dir = tempfile::tempdir()?;
    let original = match std::env::args().nth(1) {
        Some(p) => p.into(),
        None => common::weights(dir.path(), 8, 512, 1)?,
    };
    let index = weightlift::format::open(std::slice::from_ref(&original), None)?;
    let plain = common::Plain::read(&index)?;

    let pack = dir.path().join("model.wlpack");
    let s = weightlift_pack::pack(&original, &pack, &PackOptions::default(), &|_, _| {})?;
    println!(
        "packed {} tensors: {} bytes into {} ({:.3} of the original)",
        s.tensors,
        s.raw_bytes,
        s.pack_bytes,
        s.pack_bytes as f64 / s.raw_bytes.max(1) as f64
    );

    let engine = Engine::new(Settings::from_env()?)?;
    let device = match weightlift::cuda::available() {
        Ok(_) => Device::Cuda(0),
        Err(why) => {
            println!("decoding on the CPU into host memory: CUDA is not usable here ({why})");
            Device::Cpu
        }
    };
    let loaded = engine.load_pack(&pack, None, device, Decoder::Auto, &LoadOpts::default())?;
    for t in &loaded.tensors {
        let entry = index.get(&t.name).ok_or_else(|| format!("{} is not in the original", t.name))?;
        plain.check(entry, &t.data)?;
    }
    println!("{device}: {} tensors, every byte equal to the original file", loaded.tensors.len());
    println!("{}", loaded.report.summary());
    Ok(())
}
