//! Whole checkpoints into host memory: every tensor byte equals the file (read back with plain `pread`) and the
//! generator's own bytes, for every format and layout.

use std::path::PathBuf;

use weightlift::Backend;
use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::format::{DType, RawSpec};
use weightlift::io::DirectMode;
use weightlift::{Device, Engine, LoadOpts, Settings, TensorData};

fn generate(dir: &std::path::Path, name: &str, layout: Layout, container: Container, align: Option<u64>) -> PathBuf {
    let path = dir.join(name);
    synth::generate(&path, &Spec { layout, container, size: 5 << 20, seed: 42, align }).unwrap();
    path
}

#[test]
fn every_layout_and_format_loads_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("a.safetensors", Layout::Llama, Container::Safetensors, None),
        ("b.safetensors", Layout::ManySmall { tensors: Some(300) }, Container::Safetensors, None),
        ("c.safetensors", Layout::ManySmall { tensors: Some(50) }, Container::Safetensors, Some(4096)),
        ("d.gguf", Layout::Llama, Container::Gguf, None),
        ("e.gguf", Layout::ManySmall { tensors: Some(100) }, Container::Gguf, None),
        ("f.safetensors", Layout::SingleHuge, Container::Safetensors, None),
    ];
    for (direct, backend) in
        [(DirectMode::Auto, Backend::Auto), (DirectMode::Always, Backend::Uring), (DirectMode::Never, Backend::Pread)]
    {
        if backend == Backend::Uring && weightlift::io::uring_available().is_err() {
            continue;
        }
        let config = Settings::default().direct(direct).backend(backend).chunk_bytes(256 << 10).staging_bytes(4 << 20);
        let engine = Engine::new(config).unwrap();
        for (name, layout, container, align) in cases {
            let path = generate(dir.path(), name, layout, container, align);
            let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
            let loaded = engine.load(&index, Device::Cpu, &LoadOpts::default()).unwrap();
            assert_eq!(loaded.tensors.len(), index.tensors.len());
            weightlift::verify::compare_with_file(&index, |i, off, out| loaded.tensors[i].data.read_back(off, out))
                .unwrap();
            // And against the generator, independently of the file: tensor i holds tensor_bytes(seed, i, ..).
            for (i, t) in loaded.tensors.iter().enumerate() {
                let TensorData::Host(buf) = &t.data else { panic!("a cpu load gave {:?}", t.data) };
                let mut want = vec![0u8; buf.len()];
                synth::tensor_bytes(42, i as u64, 0, &mut want);
                assert!(buf[..] == want[..], "{name}: tensor {} differs from the generator", t.name);
            }
            assert_eq!(loaded.report.bytes, index.total_bytes());
            assert!(loaded.report.io.peak_staging_bytes <= 4 << 20);
        }
    }
}

#[test]
fn a_raw_file_loads_as_one_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.bin");
    synth::generate(
        &path,
        &Spec { layout: Layout::SingleHuge, container: Container::Raw, size: 1_000_003, seed: 1, align: None },
    )
    .unwrap();
    let index =
        weightlift::format::open(std::slice::from_ref(&path), Some(RawSpec { dtype: DType::U8, count: None })).unwrap();
    let loaded = Engine::new(Settings::default()).unwrap().load(&index, Device::Cpu, &LoadOpts::default()).unwrap();
    let TensorData::Host(buf) = &loaded.tensors[0].data else { panic!("not host memory") };
    assert!(buf[..] == std::fs::read(&path).unwrap()[..]);
}

#[test]
fn a_file_that_changed_since_parsing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = generate(dir.path(), "g.safetensors", Layout::Llama, Container::Safetensors, None);
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(index.files[0].len - 100).unwrap();
    let err = Engine::new(Settings::default()).unwrap().load(&index, Device::Cpu, &LoadOpts::default()).unwrap_err();
    assert!(err.to_string().contains("g.safetensors"), "{err}");
}
