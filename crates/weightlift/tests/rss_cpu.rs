//! Repeated loads into host memory keep a bounded footprint: freed buffers are reused (up to the host cache bound),
//! nothing else accumulates. In its own test binary so that no other test's memory moves the figures.

use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::{Device, Engine, LoadOpts, Settings};

#[test]
fn repeated_host_loads_do_not_grow_rss() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.safetensors");
    synth::generate(
        &path,
        &Spec { layout: Layout::Llama, container: Container::Safetensors, size: 5 << 20, seed: 42, align: None },
    )
    .unwrap();
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    let rss = || {
        std::fs::read_to_string("/proc/self/statm").unwrap().split_whitespace().nth(1).unwrap().parse::<u64>().unwrap()
            * 4096
    };
    let mut marks = Vec::new();
    for i in 1..=60 {
        drop(engine.load(&index, Device::Cpu, &LoadOpts::default()).unwrap());
        if i % 20 == 0 {
            marks.push(rss());
        }
    }
    assert!(marks[2] <= marks[0] + (8 << 20), "host RSS keeps growing: {marks:?}");
    let cache = engine.host_cache();
    assert!(cache.cached_bytes() <= cache.limit());
}
