//! Per-tensor access while the file streams, as `safe_open(...).get_tensor(name)` does in Python:
//! `cargo run --release -p weightlift --example stream [-- FILE]`.
//!
//! `Engine::stream` reads the checkpoint in file order in the background, at most `prefetch_bytes` ahead of what
//! was taken; `take` waits only until that tensor's bytes have landed, and reads them at once if the stream has not
//! reached them yet. Here the tensors are taken in reverse file order, the worst case for a reader in file order,
//! onto `cuda:0` where CUDA is usable (else into host memory), each checked against `std::fs::read`.

mod common;

use weightlift::{Device, Engine, Settings};

fn main() -> common::Result<()> {
    let checkpoint = common::checkpoint(16 << 20)?;
    let index = weightlift::format::open(std::slice::from_ref(&checkpoint.path), None)?;
    let engine = Engine::new(Settings::from_env()?)?;
    let plain = common::Plain::read(&index)?;

    let device = match weightlift::cuda::available() {
        Ok(_) => Device::Cuda(0),
        Err(why) => {
            println!("streaming into host memory: CUDA is not usable here ({why})");
            Device::Cpu
        }
    };
    let all: Vec<usize> = (0..index.tensors.len()).collect();
    let stream = engine.stream(&index, &all, device)?;
    for entry in index.tensors.iter().rev() {
        let i = stream.position(&entry.name).ok_or("a streamed tensor has no position")?;
        let data = stream.take(i)?; // owned by the caller from here on; the stream reads on
        plain.check(entry, &data)?;
    }
    let stats = stream.close()?;
    println!("{device}: {} tensors taken in reverse order, every byte equal to std::fs::read", index.tensors.len());
    println!("{stats:?}");
    Ok(())
}
