//! The README's Rust quickstart, runnable: `cargo run --release -p weightlift --example quickstart -- FILE`.
//! Loads a checkpoint into host memory, then onto `cuda:0` where CUDA is usable (else says why).

use weightlift::{Device, Engine, LoadOpts, Settings, TensorData};

fn main() -> weightlift::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "model.safetensors".into());
    // Headers parsed and validated: a safetensors file, shards or their index.json, or a GGUF file.
    let index = weightlift::format::open(&[path.into()], None)?;
    // Defaults, then the WEIGHTLIFT_* variables, then what is set here.
    let engine = Engine::new(Settings::from_env()?.threads(8))?;

    let host = engine.load(&index, Device::Cpu, &LoadOpts::default())?;
    for t in host.tensors.iter().take(5) {
        if let TensorData::Host(bytes) = &t.data {
            println!("{} {} {:?}: {} bytes", t.name, t.dtype, t.shape, bytes.len());
        }
    }
    println!("{}", host.report.summary());

    match weightlift::cuda::available() {
        Ok(_) => {
            let gpu = engine.load(&index, Device::Cuda(0), &LoadOpts::default())?;
            println!("{}", gpu.report.summary()); // the data path taken and why, bytes, time in each stage
        }
        Err(why) => println!("no GPU load: {why}"),
    }
    Ok(())
}
