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

/// The cancel flag under load: set while other threads load through the same engine, it ends that load with a
/// cancellation error soon after, the others get every byte, and the engine loads correctly afterwards.
#[test]
fn cancel_under_concurrent_load_stops_only_that_load() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    // A long load: 1 GiB of holes read in 4 KiB pieces by one lane.
    let big = dir.path().join("sparse.bin");
    std::fs::File::create(&big).unwrap().set_len(1 << 30).unwrap();
    let real = generate(dir.path(), "real.safetensors", Layout::Llama, Container::Safetensors, None);
    let file = std::fs::read(&real).unwrap();
    let engine = Engine::new(Settings::default().threads(2).chunk_bytes(4096)).unwrap();
    let big_index = weightlift::format::open(&[big], Some(RawSpec { dtype: DType::U8, count: None })).unwrap();
    let real_index = weightlift::format::open(std::slice::from_ref(&real), None).unwrap();
    let check = |loaded: &weightlift::Loaded| {
        for (t, e) in loaded.tensors.iter().zip(&real_index.tensors) {
            let mut buf = vec![0u8; t.data.len()];
            t.data.read_back(0, &mut buf).unwrap();
            assert!(buf[..] == file[e.offset as usize..(e.offset + e.nbytes) as usize], "{} differs", e.name);
        }
    };
    let cancel = AtomicBool::new(false);
    std::thread::scope(|s| {
        let cancelled = s.spawn(|| {
            let t = std::time::Instant::now();
            let r = engine.load(&big_index, Device::Cpu, &LoadOpts { cancel: Some(&cancel), ..LoadOpts::default() });
            (r.map(|_| ()), t.elapsed())
        });
        let others: Vec<_> =
            (0..2).map(|_| s.spawn(|| engine.load(&real_index, Device::Cpu, &LoadOpts::default()).unwrap())).collect();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let set = std::time::Instant::now();
        cancel.store(true, Ordering::Relaxed);
        let (r, total) = cancelled.join().unwrap();
        let after = set.elapsed();
        let e = r.expect_err("the cancelled load must fail");
        assert!(e.is_cancelled(), "{e}");
        println!(
            "cancelled {:.0} ms after the flag (load ran {:.0} ms)",
            after.as_secs_f64() * 1e3,
            total.as_secs_f64() * 1e3
        );
        assert!(after < std::time::Duration::from_secs(2), "{after:?}");
        for o in others {
            check(&o.join().unwrap());
        }
    });
    check(&engine.load(&real_index, Device::Cpu, &LoadOpts::default()).unwrap());
}

/// Preparing for a device that is not there (none here, or no CUDA at all) is an error that sets nothing up: the
/// lanes hold no staging afterwards (a host-shaped request then sets up every lane).
#[test]
fn prepare_for_a_missing_device_fails_and_sets_up_nothing() {
    let engine = weightlift::Engine::new(weightlift::Settings::default()).unwrap();
    let err = engine.prepare(weightlift::Device::Cuda(999)).unwrap_err();
    assert!(matches!(err, weightlift::Error::Cuda(_)), "{err}");
    let host = engine.io().prepare_staging(false, None, None).unwrap();
    assert_eq!(host.lanes_set_up, host.lanes, "{host:?}");
}

/// `tensor_align` must be a power of two up to 256 (what device allocations guarantee): anything else is refused
/// before a file or a device is touched, whatever the destination; a valid one leaves host loads as they were.
#[test]
fn a_tensor_alignment_that_is_not_a_power_of_two_up_to_256_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = generate(dir.path(), "a.safetensors", Layout::Llama, Container::Safetensors, None);
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    for device in [Device::Cpu, Device::Cuda(0)] {
        for bad in [0u64, 3, 96, 512, 1 << 40] {
            let opts = LoadOpts { tensor_align: Some(bad), ..LoadOpts::default() };
            match engine.load(&index, device, &opts) {
                Err(weightlift::Error::InvalidArgument(m)) => assert!(m.contains("tensor_align"), "{m}"),
                other => panic!("tensor_align {bad} on {device}: {:?}", other.map(|l| l.tensors.len())),
            }
        }
    }
    let file = std::fs::read(&path).unwrap();
    let loaded =
        engine.load(&index, Device::Cpu, &LoadOpts { tensor_align: Some(256), ..LoadOpts::default() }).unwrap();
    for (t, e) in loaded.tensors.iter().zip(&index.tensors) {
        let mut got = vec![0u8; t.data.len()];
        t.data.read_back(0, &mut got).unwrap();
        assert!(got == file[e.offset as usize..e.end() as usize], "{}", t.name);
    }
}
