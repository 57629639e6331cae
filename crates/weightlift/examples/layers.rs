//! The layer streamer: a model run one layer at a time through two fixed slots, the next layer read while the
//! current one is used: `cargo run --release -p weightlift --example layers [-- FILE]`.
//!
//! Groups a llama-style checkpoint's tensors by layer (`model.layers.N.`; without a path, a checkpoint of six
//! layers of weight-like bf16 values is written for the run), streams the layers twice round, as a token-by-token
//! loop would, and checks each layer's bytes in its slot against `std::fs::read`. The slots here are
//! host memory, so that the check can read them in place; `Device::Cuda(n)` puts them on a GPU instead, and
//! `LayerStreamer::with_slots` fills memory the caller owns (a framework's tensors).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use weightlift::{Device, Engine, LayerStreamer, Settings};

fn main() -> common::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = match std::env::args().nth(1) {
        Some(p) => p.into(),
        None => common::weights(dir.path(), 6, 512, 1)?,
    };
    let index = weightlift::format::open(&[path], None)?;
    let plain = common::Plain::read(&index)?;

    let mut by_layer: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, t) in index.tensors.iter().enumerate() {
        let layer = t.name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()?.parse().ok());
        if let Some(l) = layer {
            by_layer.entry(l).or_default().push(i);
        }
    }
    let layers: Vec<Vec<usize>> = by_layer.into_values().collect();
    if layers.is_empty() {
        return Err("no model.layers.N.* tensors in this checkpoint".into());
    }

    let engine = Arc::new(Engine::new(Settings::from_env()?)?);
    let mut streamer = LayerStreamer::new(engine, &index, layers.clone(), Device::Cpu, 2)?;
    println!("{} layers through {} slots of {} bytes", streamer.layers(), streamer.slot_count(), streamer.slot_bytes());
    for round in 0..2 {
        for (l, tensors) in layers.iter().enumerate() {
            let view = streamer.load_layer(l)?; // valid until the next load_layer; the next layer is being read
            for (k, &i) in tensors.iter().enumerate() {
                let entry = &index.tensors[i];
                let ptr = view.tensor_ptr(k).ok_or("a layer tensor has no address")?;
                // SAFETY: the slot is host memory owned by the streamer, holding this layer until the next
                // `load_layer` call; tensor k lies at `ptr` for `entry.nbytes` bytes inside it.
                let got = unsafe { std::slice::from_raw_parts(ptr as *const u8, entry.nbytes as usize) };
                common::same(&entry.name, plain.bytes(entry), got)?;
            }
        }
        println!("round {round}: every layer's bytes equal to std::fs::read");
    }
    println!("{:?}", streamer.stats());
    Ok(())
}
