//! The README's Rust quickstart, runnable: `cargo run --release -p weightlift --example quickstart [-- FILE]`.
//! Loads a checkpoint (FILE, or a small synthetic one written for the run) into host memory, then onto `cuda:0`
//! where CUDA is usable (else says why), and checks every loaded byte against `std::fs::read` of the file.

mod common;

use weightlift::{Device, Engine, LoadOpts, Settings, TensorData};

fn main() -> common::Result<()> {
    let checkpoint = common::checkpoint(16 << 20)?;
    // Headers parsed and validated: a safetensors file, shards or their index.json, or a GGUF file.
    let index = weightlift::format::open(std::slice::from_ref(&checkpoint.path), None)?;
    // Defaults, then the WEIGHTLIFT_* variables, then what is set here.
    let engine = Engine::new(Settings::from_env()?.threads(8))?;
    let plain = common::Plain::read(&index)?;

    let host = engine.load(&index, Device::Cpu, &LoadOpts::default())?;
    for t in host.tensors.iter().take(5) {
        if let TensorData::Host(bytes) = &t.data {
            println!("{} {} {:?}: {} bytes", t.name, t.dtype, t.shape, bytes.len());
        }
    }
    for (t, entry) in host.tensors.iter().zip(&index.tensors) {
        plain.check(entry, &t.data)?;
    }
    println!("host: {} tensors, every byte equal to std::fs::read", host.tensors.len());
    println!("{}", host.report.summary());

    match weightlift::cuda::available() {
        Ok(_) => {
            let gpu = engine.load(&index, Device::Cuda(0), &LoadOpts::default())?;
            // Each tensor's data is TensorData::Device(d): on the GPU at d.device_ptr() until dropped.
            for (t, entry) in gpu.tensors.iter().zip(&index.tensors) {
                plain.check(entry, &t.data)?; // copies it back to compare
            }
            println!("cuda:0: {} tensors, every byte equal to std::fs::read", gpu.tensors.len());
            println!("{}", gpu.report.summary()); // the data path taken and why, bytes, time in each stage
        }
        Err(why) => println!("no GPU load: CUDA is not usable here ({why})"),
    }
    Ok(())
}
