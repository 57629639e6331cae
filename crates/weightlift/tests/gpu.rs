//! GPU tests: every loaded byte read back from the device and compared with the file and with the generator;
//! running out of device memory mid-load is a clean error that leaves nothing allocated; a hundred loads in a row do
//! not grow device memory or host RSS. Each test prints why it skips where no CUDA device is usable.

mod common;
use common::gpu_or_skip;
use std::path::{Path, PathBuf};

use weightlift::Backend;
use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::format::{DType, RawSpec, TensorIndex};
use weightlift::io::DirectMode;
use weightlift::io::fault::{Fault, FaultPlan};
use weightlift::{Device, Engine, Error, LoadOpts, Settings};

fn generate(dir: &Path, name: &str, layout: Layout, container: Container, size: u64, align: Option<u64>) -> PathBuf {
    let path = dir.join(name);
    synth::generate(&path, &Spec { layout, container, size, seed: 99, align }).unwrap();
    path
}

fn check_against_file_and_generator(index: &TensorIndex, loaded: &weightlift::Loaded, generated: bool) {
    weightlift::verify::compare_with_file(index, |i, off, out| loaded.tensors[i].data.read_back(off, out)).unwrap();
    if generated {
        for (i, t) in loaded.tensors.iter().enumerate() {
            assert_generated(i, &t.data, &t.name);
        }
    }
}

/// Tensor `i`'s bytes as loaded are the generator's (seed 99) for that tensor.
fn assert_generated(i: usize, data: &weightlift::TensorData, what: &str) {
    let mut got = vec![0u8; data.len()];
    data.read_back(0, &mut got).unwrap();
    let mut want = vec![0u8; got.len()];
    synth::tensor_bytes(99, i as u64, 0, &mut want);
    assert!(got == want, "tensor {what} differs from the generator");
}

#[test]
fn every_format_loads_onto_the_gpu_byte_exact() {
    if !gpu_or_skip("every_format_loads_onto_the_gpu_byte_exact") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files = [
        generate(dir.path(), "llama.safetensors", Layout::Llama, Container::Safetensors, 48 << 20, None),
        generate(
            dir.path(),
            "small.safetensors",
            Layout::ManySmall { tensors: Some(700) },
            Container::Safetensors,
            0,
            None,
        ),
        generate(
            dir.path(),
            "aligned.safetensors",
            Layout::ManySmall { tensors: Some(90) },
            Container::Safetensors,
            0,
            Some(4096),
        ),
        generate(dir.path(), "llama.gguf", Layout::Llama, Container::Gguf, 24 << 20, None),
        generate(dir.path(), "small.gguf", Layout::ManySmall { tensors: Some(200) }, Container::Gguf, 0, None),
        generate(dir.path(), "huge.safetensors", Layout::SingleHuge, Container::Safetensors, (40 << 20) + 12, None),
    ];
    let configs = [
        ("defaults", Settings::default()),
        ("pread", Settings::default().backend(Backend::Pread)),
        (
            "direct, small staging",
            Settings::default().direct(DirectMode::Always).chunk_bytes(256 << 10).staging_bytes(2 << 20),
        ),
        ("buffered, 1 thread", Settings::default().direct(DirectMode::Never).threads(1).queue_depth(1)),
    ];
    for (name, config) in configs {
        let engine = Engine::new(config).unwrap();
        for f in &files {
            let index = weightlift::format::open(std::slice::from_ref(f), None).unwrap();
            let loaded = engine
                .load(&index, Device::Cuda(0), &LoadOpts::default())
                .unwrap_or_else(|e| panic!("{name} {}: {e}", f.display()));
            check_against_file_and_generator(&index, &loaded, true);
            assert!(loaded.report.gpu.is_some());
        }
        eprintln!("{name}: {} files byte-exact on cuda:0", files.len());
    }
}

#[test]
fn raw_files_and_odd_sizes_on_the_gpu() {
    if !gpu_or_skip("raw_files_and_odd_sizes_on_the_gpu") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    for len in [1u64, 4095, 4096, 4097, (64 << 20) + 13] {
        let path = generate(dir.path(), &format!("raw{len}.bin"), Layout::SingleHuge, Container::Raw, len, None);
        let index =
            weightlift::format::open(std::slice::from_ref(&path), Some(RawSpec { dtype: DType::U8, count: None }))
                .unwrap();
        let loaded = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap();
        check_against_file_and_generator(&index, &loaded, false);
    }
    // Several files in one load, tensors at odd offsets.
    let a =
        generate(dir.path(), "a.safetensors", Layout::ManySmall { tensors: Some(33) }, Container::Safetensors, 0, None);
    let b = generate(dir.path(), "b.gguf", Layout::ManySmall { tensors: Some(17) }, Container::Gguf, 0, None);
    let index = weightlift::format::open(&[a, b], None);
    // The two generated files reuse tensor names ("small.00"...), which one index cannot hold.
    assert!(index.is_err());
}

/// `Engine::prepare(cuda:0)` sets up every lane's staging pinned, the lanes' streams and the pool; a load after it
/// sets up no staging and waits for none, and every byte is the file's; asked again it sets up nothing.
#[test]
fn prepare_sets_up_what_the_first_load_would() {
    if !gpu_or_skip("prepare_sets_up_what_the_first_load_would") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = generate(dir.path(), "llama.safetensors", Layout::Llama, Container::Safetensors, 96 << 20, None);
    let engine = Engine::new(Settings::default()).unwrap();
    let p = engine.prepare(Device::Cuda(0)).unwrap();
    let Some(staging) = p.staging.clone() else {
        return eprintln!("skipping prepare_sets_up_what_the_first_load_would: the path does not use the lanes: {p:?}");
    };
    assert!(staging.pinned && staging.lanes > 0 && staging.lanes_set_up == staging.lanes, "{p:?}");
    // Faulted in first without the device, then pinned where it was.
    let host = p.staging_host.clone().expect("a GPU's staging is faulted in before it is pinned");
    assert!(!host.pinned && host.lanes == staging.lanes && host.slots_per_lane == staging.slots_per_lane, "{p:?}");
    assert_eq!(p.streams, engine.io().lanes() + 1, "{p:?}");
    assert!(p.pool_secs.is_some(), "{p:?}");
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let loaded = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap();
    check_against_file_and_generator(&index, &loaded, true);
    let io = &loaded.report.io;
    assert_eq!((io.stats.setup, io.stats.setup_wait), Default::default(), "{:?}", io.stats);
    let again = engine.prepare(Device::Cuda(0)).unwrap();
    assert_eq!(again.staging.map(|s| s.lanes_set_up), Some(0));
}

#[test]
fn pinned_host_destination() {
    if !gpu_or_skip("pinned_host_destination") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = generate(
        dir.path(),
        "p.safetensors",
        Layout::ManySmall { tensors: Some(120) },
        Container::Safetensors,
        0,
        None,
    );
    let index = weightlift::format::open(std::slice::from_ref(&f), None).unwrap();
    let loaded =
        Engine::new(Settings::default()).unwrap().load(&index, Device::PinnedCpu, &LoadOpts::default()).unwrap();
    check_against_file_and_generator(&index, &loaded, true);
}

fn device_used() -> u64 {
    let gpu = weightlift_cuda::Gpu::open(0).unwrap();
    gpu.synchronize().unwrap();
    let (free, total) = gpu.mem_info().unwrap();
    total - free
}

/// Device memory taking all but about `room` bytes of what is free.
fn fill_device_leaving(gpu: &weightlift_cuda::Gpu, room: u64) -> weightlift_cuda::DeviceBuffer {
    let (free, _) = gpu.mem_info().unwrap();
    let stream = gpu.stream(0).unwrap();
    let filler = weightlift_cuda::DeviceBuffer::alloc(gpu, free.saturating_sub(room) as usize, &stream).unwrap();
    stream.synchronize().unwrap();
    filler
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    statm.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096
}

#[test]
fn out_of_memory_mid_load_is_a_clean_error() {
    if !gpu_or_skip("out_of_memory_mid_load_is_a_clean_error") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = generate(dir.path(), "oom.safetensors", Layout::Llama, Container::Safetensors, 512 << 20, None);
    let index = weightlift::format::open(std::slice::from_ref(&f), None).unwrap();
    let gpu = weightlift_cuda::Gpu::open(0).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    // Warm the pool and staging so the baseline includes what a successful load keeps.
    drop(engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap());
    let before = device_used();
    let filler = fill_device_leaving(&gpu, index.total_bytes() / 2);
    let err = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap_err();
    assert!(matches!(err, Error::Cuda(weightlift::cuda::CudaError::OutOfMemory { .. })), "{err}");
    assert!(err.is_out_of_memory());
    eprintln!("out-of-memory error as reported: {err}");
    drop(filler);
    let after = device_used();
    assert!(after <= before + (64 << 20), "device memory grew from {before} to {after} after a failed load");
    // The engine still works.
    let loaded = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap();
    check_against_file_and_generator(&index, &loaded, true);
}

/// A stream whose read-ahead finds the device short of memory reads ahead less instead of failing: with room for
/// half of the checkpoint, tensors taken in file order and dropped one by one all arrive byte-exact; kept, the take
/// that finds no room fails as out of memory, and the device's memory goes back.
#[test]
fn a_stream_short_of_device_memory_reads_ahead_less() {
    if !gpu_or_skip("a_stream_short_of_device_memory_reads_ahead_less") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = generate(dir.path(), "short.safetensors", Layout::Llama, Container::Safetensors, 512 << 20, None);
    let index = weightlift::format::open(std::slice::from_ref(&f), None).unwrap();
    let all: Vec<usize> = (0..index.tensors.len()).collect();
    let gpu = weightlift_cuda::Gpu::open(0).unwrap();
    // The default window (8 GiB) would read the whole checkpoint ahead.
    let engine = Engine::new(Settings::default()).unwrap();
    assert!(engine.settings().prefetch_bytes.value >= index.total_bytes());
    drop(engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap());
    let before = device_used();
    let filler = fill_device_leaving(&gpu, index.total_bytes() / 2);

    let s = engine.stream(&index, &all, Device::Cuda(0)).unwrap();
    for &t in &all {
        let data = s.take(t).unwrap_or_else(|e| panic!("take of tensor {t}: {e}"));
        assert_generated(t, &data, &format!("{t}, streamed,"));
    }
    let stats = s.close().unwrap();
    eprintln!("taken and dropped: {stats:?}");
    assert!(stats.memory_waits > 0, "the read-ahead never ran short of memory: {stats:?}");

    let s = engine.stream(&index, &all, Device::Cuda(0)).unwrap();
    let mut kept = Vec::new();
    let err = loop {
        assert!(kept.len() < all.len(), "every tensor fitted beside the filler");
        match s.take(kept.len()) {
            Ok(data) => kept.push(data),
            Err(e) => break e,
        }
    };
    assert!(err.is_out_of_memory(), "{err}");
    eprintln!("kept {} tensors, then: {err}", kept.len());
    drop(kept);
    drop(s);
    drop(filler);
    let after = device_used();
    assert!(after <= before + (64 << 20), "device memory grew from {before} to {after}");
    let loaded = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap();
    check_against_file_and_generator(&index, &loaded, true);
}

/// A caller's allocator for the test below: memory of its own stream from the device's pool, handed over as
/// external memory (its buffer is the owner), counting calls and failing from call `fail_at` on.
#[derive(Debug)]
struct Counting {
    /// The raw handle of the device's stream 0, which the memory is allocated on.
    stream: usize,
    calls: std::sync::atomic::AtomicUsize,
    live: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    fail_at: usize,
}

/// What the test's allocator hands over with each block: the memory, and a count of blocks not yet given back.
struct Owned {
    _memory: weightlift_cuda::DeviceBuffer,
    live: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl weightlift_cuda::DeviceAllocator for Counting {
    fn alloc(
        &self,
        gpu: &weightlift_cuda::Gpu,
        len: usize,
    ) -> Result<weightlift_cuda::DeviceBuffer, weightlift_cuda::CudaError> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.calls.fetch_add(1, SeqCst) >= self.fail_at {
            let why = "refused by the test".to_string();
            return Err(weightlift_cuda::CudaError::Allocator {
                device: 0,
                allocator: self.name(),
                bytes: len as u64,
                why,
            });
        }
        let memory = weightlift_cuda::DeviceBuffer::alloc(gpu, len, &*gpu.stream(0)?)?;
        let ptr = memory.device_ptr();
        self.live.fetch_add(1, SeqCst);
        let owner = Box::new(Owned { _memory: memory, live: self.live.clone() });
        // SAFETY: `ptr` is `len` bytes of this device's memory, alive while its owner (which holds it) lives.
        Ok(unsafe { weightlift_cuda::DeviceBuffer::external(gpu, ptr, len, owner) })
    }

    fn ready_stream(&self) -> weightlift_cuda::CUstream {
        self.stream as weightlift_cuda::CUstream
    }

    fn name(&self) -> String {
        "counting".into()
    }
}

#[test]
fn blocks_from_the_callers_allocator() {
    use std::sync::atomic::Ordering::SeqCst;
    if !gpu_or_skip("blocks_from_the_callers_allocator") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files = [
        generate(dir.path(), "llama.safetensors", Layout::Llama, Container::Safetensors, 96 << 20, None),
        generate(
            dir.path(),
            "small.safetensors",
            Layout::ManySmall { tensors: Some(500) },
            Container::Safetensors,
            0,
            None,
        ),
    ];
    let gpu = weightlift_cuda::Gpu::open(0).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    for f in &files {
        let index = weightlift::format::open(std::slice::from_ref(f), None).unwrap();
        let live = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stream = gpu.stream(0).unwrap().cu_stream() as usize;
        let alloc = Counting { stream, calls: 0.into(), live: live.clone(), fail_at: usize::MAX };
        let opts = LoadOpts { device_alloc: Some(&alloc), ..LoadOpts::default() };
        let loaded = engine.load(&index, Device::Cuda(0), &opts).unwrap();
        check_against_file_and_generator(&index, &loaded, true);
        assert_eq!(loaded.report.device_memory.as_deref(), Some("counting"));
        let blocks = alloc.calls.load(SeqCst);
        assert!(blocks >= 1 && blocks <= index.tensors.len(), "{blocks} blocks for {} tensors", index.tensors.len());
        assert_eq!(live.load(SeqCst), blocks);
        drop(loaded);
        assert_eq!(live.load(SeqCst), 0, "every block given back to its allocator");

        // An allocator that fails part way, after it gave at least one block: the load fails with its error,
        // every block it gave is given back, and the engine loads again.
        if f.ends_with("llama.safetensors") {
            assert!(blocks >= 2, "{blocks} blocks");
        }
        if blocks >= 2 {
            let failing = Counting { fail_at: blocks / 2, calls: 0.into(), live: live.clone(), stream };
            let err = engine
                .load(&index, Device::Cuda(0), &LoadOpts { device_alloc: Some(&failing), ..LoadOpts::default() })
                .unwrap_err();
            assert!(err.to_string().contains("refused by the test"), "{err}");
            assert_eq!(failing.calls.load(SeqCst), blocks / 2 + 1);
            assert_eq!(live.load(SeqCst), 0);
        }
        let loaded = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap();
        assert_eq!(loaded.report.device_memory.as_deref(), Some("pool"));
        check_against_file_and_generator(&index, &loaded, true);
    }
}

#[test]
fn an_io_error_mid_load_leaves_nothing_behind() {
    if !gpu_or_skip("an_io_error_mid_load_leaves_nothing_behind") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = generate(dir.path(), "eio.safetensors", Layout::Llama, Container::Safetensors, 128 << 20, None);
    let index = weightlift::format::open(std::slice::from_ref(&f), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    drop(engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap());
    let before = device_used();
    let faults = FaultPlan::new(vec![Fault::Eio { file: 0, offset: index.files[0].len / 2 }]);
    let err =
        engine.load(&index, Device::Cuda(0), &LoadOpts { faults: Some(&faults), ..LoadOpts::default() }).unwrap_err();
    assert!(err.to_string().contains("eio.safetensors"), "{err}");
    assert!(device_used() <= before + (16 << 20));
}

#[test]
fn a_lane_that_panics_mid_load_fails_it_and_leaves_nothing_behind() {
    if !gpu_or_skip("a_lane_that_panics_mid_load_fails_it_and_leaves_nothing_behind") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = generate(dir.path(), "panic.safetensors", Layout::Llama, Container::Safetensors, 256 << 20, None);
    let index = std::sync::Arc::new(weightlift::format::open(std::slice::from_ref(&f), None).unwrap());
    let engine = std::sync::Arc::new(Engine::new(Settings::default()).unwrap());
    drop(engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap());
    let before = device_used();
    // On a thread of its own: a load left waiting for the dead lane (its copies may be in flight) fails the test
    // instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let (e, i) = (engine.clone(), index.clone());
    std::thread::spawn(move || {
        let faults = FaultPlan::new(vec![Fault::Panic { file: 0, offset: i.files[0].len / 2 }]);
        let r = e.load(&i, Device::Cuda(0), &LoadOpts { faults: Some(&faults), ..LoadOpts::default() });
        let _ = tx.send(r.map(drop).map_err(|e| e.to_string()));
    });
    let got = rx.recv_timeout(std::time::Duration::from_secs(120)).expect("the load still waits for the dead lane");
    let err = got.unwrap_err();
    assert!(err.contains("panicked") && err.contains("injected panic"), "{err}");
    assert!(device_used() <= before + (16 << 20));
    let later = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).map(drop).unwrap_err().to_string();
    assert!(later.contains("injected panic"), "{later}");
}

#[test]
fn the_callers_current_context_is_left_as_found() {
    if !gpu_or_skip("the_callers_current_context_is_left_as_found") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = generate(dir.path(), "ctx.safetensors", Layout::Llama, Container::Safetensors, 16 << 20, None);
    let index = weightlift::format::open(std::slice::from_ref(&f), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    // A CUDA runtime (torch's current_device) takes a thread's device from its current context: on a fresh thread
    // none is current, and weightlift's calls there (probing, a load, freeing what it loaded) leave none.
    std::thread::scope(|s| {
        s.spawn(|| {
            let current = || weightlift::cuda::current_context().unwrap();
            assert_eq!(current(), 0);
            weightlift::probe::probe(None);
            assert_eq!(current(), 0, "after probe");
            let loaded = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap();
            assert_eq!(current(), 0, "after a load");
            check_against_file_and_generator(&index, &loaded, true);
            drop(loaded);
            assert_eq!(current(), 0, "after freeing the load's memory");
        });
    });
}

#[test]
fn a_hundred_loads_do_not_grow_memory() {
    if !gpu_or_skip("a_hundred_loads_do_not_grow_memory") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = generate(dir.path(), "loop.safetensors", Layout::Llama, Container::Safetensors, 64 << 20, None);
    let index = weightlift::format::open(std::slice::from_ref(&f), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    // Early loads warm up allocator arenas, the device pool and driver caches; what must not happen is growth
    // that keeps going, so memory is compared between load 40 and load 100.
    let mut marks = Vec::new();
    for i in 1..=100 {
        let loaded = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap();
        if i % 20 == 0 {
            marks.push((i, device_used(), rss_bytes()));
        }
        // Checked after the mark: the check's own buffers may stay in the allocator's arena.
        if i == 100 {
            check_against_file_and_generator(&index, &loaded, true);
        }
    }
    eprintln!("(load, device bytes used, host RSS bytes): {marks:?}");
    let (_, dev40, rss40) = marks[1];
    let (_, dev100, rss100) = marks[4];
    assert!(dev100 <= dev40 + (8 << 20), "device memory grew from {dev40} to {dev100} between loads 40 and 100");
    assert!(rss100 <= rss40 + (16 << 20), "host RSS grew from {rss40} to {rss100} between loads 40 and 100");
}

#[test]
fn gpu_initiated_nvme_loads_byte_exact() {
    if !gpu_or_skip("gpu_initiated_nvme_loads_byte_exact") {
        return;
    }
    if let Err(why) = weightlift_nvme::gpu::nvrtc_available() {
        eprintln!("skipping gpu_initiated_nvme_loads_byte_exact: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::new(Settings::default().backend(Backend::NvmeSim)).unwrap();
    for f in [
        generate(dir.path(), "n.safetensors", Layout::Llama, Container::Safetensors, 24 << 20, None),
        generate(
            dir.path(),
            "n-small.safetensors",
            Layout::ManySmall { tensors: Some(150) },
            Container::Safetensors,
            0,
            None,
        ),
    ] {
        let index = weightlift::format::open(std::slice::from_ref(&f), None).unwrap();
        let loaded = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap();
        assert_eq!(loaded.report.path, weightlift::PathUsed::NvmeSim);
        let n = loaded.report.nvme.expect("nvme statistics");
        assert!(n.commands > 0);
        eprintln!("{}: {} commands, {}", f.display(), n.commands, loaded.report.summary().lines().next().unwrap_or(""));
        check_against_file_and_generator(&index, &loaded, true);
    }
}

/// Streams every tensor of `index` onto cuda:0, taking them in `order`; with `check`, compares each with the
/// generator's bytes.
fn stream_in_order(engine: &Engine, index: &TensorIndex, order: &[usize], check: bool) {
    let all: Vec<usize> = (0..index.tensors.len()).collect();
    let s = engine.stream(index, &all, Device::Cuda(0)).unwrap();
    for &t in order {
        let data = s.take(t).unwrap();
        if check {
            assert_generated(t, &data, &format!("{t}, streamed,"));
        }
    }
}

/// A thousand mixed GPU loads in one engine — whole loads, streams taken in random order, loads failing on an
/// injected EIO, loads failing for lack of device memory (a filler takes all but half a checkpoint) — with device
/// memory in use and host RSS recorded every 100 loads. Flat means: between load 200 and load 1000, neither grows
/// by more than 1 % (or 16 MiB, whichever is larger). Bytes are checked in the first whole load and stream and in a
/// whole load and a stream after the thousandth, not between the marks: until 2026-11-27, with checks at loads 251
/// to 756, RSS moved in steps of up to 34 MB either way in every GPU run, each between marks enclosing a check (the
/// check's buffers kept in the allocator's heap or given back, as we read it), and grew under 0.4 MB between the
/// steps; a +16.8 MB step failed the test on an H200. Run by the GPU check (`--ignored`), which keeps the JSON
/// written to `$WEIGHTLIFT_BENCH_OUT/stability.json`.
#[test]
#[ignore = "long (about a minute on a GPU); run by scripts/gpu-check"]
fn a_thousand_mixed_loads_keep_memory_flat() {
    if !gpu_or_skip("a_thousand_mixed_loads_keep_memory_flat") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = generate(dir.path(), "mixed.safetensors", Layout::Llama, Container::Safetensors, 64 << 20, None);
    let index = weightlift::format::open(std::slice::from_ref(&f), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    let gpu = weightlift_cuda::Gpu::open(0).unwrap();
    let all: Vec<usize> = (0..index.tensors.len()).collect();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let (mut whole, mut streams, mut eio, mut oom) = (0, 0, 0, 0);
    let mut marks = Vec::new();
    let start = std::time::Instant::now();
    for i in 1..=1000u32 {
        match i % 10 {
            0..=5 => {
                let loaded = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap();
                if i == 1 {
                    check_against_file_and_generator(&index, &loaded, true);
                }
                whole += 1;
            }
            6 | 7 => {
                let mut order = all.clone();
                for k in (1..order.len()).rev() {
                    order.swap(k, next(k as u64 + 1) as usize);
                }
                stream_in_order(&engine, &index, &order, i == 6);
                streams += 1;
            }
            8 => {
                let at = next(index.files[0].len);
                let faults = FaultPlan::new(vec![Fault::Eio { file: 0, offset: at }]);
                let opts = LoadOpts { faults: Some(&faults), ..LoadOpts::default() };
                match engine.load(&index, Device::Cuda(0), &opts) {
                    Err(e) => assert!(e.to_string().contains("mixed.safetensors"), "{e}"),
                    Ok(_) => panic!("a load with an EIO at {at} succeeded"),
                }
                eio += 1;
            }
            _ => {
                // Take the device's memory in chunks, halving the chunk on each refusal down to 2 MiB, so that
                // less than a checkpoint is left (synchronising first lets the pool return freed memory).
                gpu.synchronize().unwrap();
                let stream = gpu.stream(0).unwrap();
                let mut filler = Vec::new();
                let mut chunk = 1usize << 30;
                while chunk >= 2 << 20 {
                    match weightlift_cuda::DeviceBuffer::alloc(&gpu, chunk, &stream) {
                        Ok(b) => filler.push(b),
                        Err(_) => chunk /= 2,
                    }
                }
                stream.synchronize().unwrap();
                let err = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap_err();
                assert!(err.is_out_of_memory(), "{err}");
                drop(filler);
                oom += 1;
            }
        }
        if i % 100 == 0 {
            marks.push((i, device_used(), rss_bytes()));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let loaded = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap();
    check_against_file_and_generator(&index, &loaded, true);
    drop(loaded);
    let mut order = all.clone();
    order.reverse();
    stream_in_order(&engine, &index, &order, true);
    eprintln!("(load, device bytes used, host RSS bytes): {marks:?}");
    let (_, dev200, rss200) = marks[1];
    let (_, dev1000, rss1000) = marks[9];
    let tolerance = |base: u64| (base / 100).max(16 << 20);
    let flat_device = dev1000 <= dev200 + tolerance(dev200);
    let flat_rss = rss1000 <= rss200 + tolerance(rss200);
    let json = serde_json::json!({
        "loads": 1000, "whole": whole, "streams": streams, "eio": eio, "out_of_memory": oom, "seconds": secs,
        "checkpoint_bytes": index.total_bytes(),
        "marks": marks.iter().map(|(i, d, r)| serde_json::json!({"load": i, "device_used": d, "rss": r})).collect::<Vec<_>>(),
        "device_growth_200_to_1000": dev1000 as i64 - dev200 as i64,
        "rss_growth_200_to_1000": rss1000 as i64 - rss200 as i64,
        "flat_device": flat_device, "flat_rss": flat_rss,
    });
    if let Some(out) = std::env::var_os("WEIGHTLIFT_BENCH_OUT") {
        std::fs::write(Path::new(&out).join("stability.json"), serde_json::to_string_pretty(&json).unwrap()).unwrap();
    }
    eprintln!("{json}");
    assert!(flat_device, "device memory grew from {dev200} to {dev1000} between loads 200 and 1000");
    assert!(flat_rss, "host RSS grew from {rss200} to {rss1000} between loads 200 and 1000");
}

/// With `device_cache_bytes`, device memory a load's tensors freed stays in the driver's pool after the device
/// synchronised (the next load allocates from it), and `release_memory` returns it; without, it goes back.
#[test]
fn the_device_cache_keeps_freed_memory_until_released() {
    if !gpu_or_skip("the_device_cache_keeps_freed_memory_until_released") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = generate(dir.path(), "cache.safetensors", Layout::Llama, Container::Safetensors, 256 << 20, None);
    let index = weightlift::format::open(std::slice::from_ref(&f), None).unwrap();
    let gpu = weightlift_cuda::Gpu::open(0).unwrap();
    let threshold = gpu.freed_memory_kept().unwrap();
    for keep in [1u64 << 30, 0] {
        let base = device_used();
        let engine = Engine::new(Settings::default().device_cache_bytes(keep)).unwrap();
        let loaded = engine.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap();
        check_against_file_and_generator(&index, &loaded, true);
        drop(loaded);
        let held = device_used().saturating_sub(base);
        if keep > 0 {
            assert!(held >= 200 << 20, "the pool kept {held} bytes of a 256 MiB load");
            engine.release_memory();
            let after = device_used().saturating_sub(base);
            assert!(after < 64 << 20, "{after} bytes still held after release_memory");
            assert_eq!(gpu.freed_memory_kept().unwrap(), keep);
            drop(engine);
            // The pool is the process's: the engine put its threshold back when it went.
            assert_eq!(gpu.freed_memory_kept().unwrap(), threshold);
        } else {
            assert!(held < 64 << 20, "{held} bytes held without a device cache");
        }
    }
}

/// The device pool is the process's: engines asking for different device caches leave it at the largest of those
/// alive, whichever goes first, and as it was once the last of them goes.
#[test]
fn engines_share_the_device_pool_threshold() {
    if !gpu_or_skip("engines_share_the_device_pool_threshold") {
        return;
    }
    let gpu = weightlift_cuda::Gpu::open(0).unwrap();
    let original = gpu.freed_memory_kept().unwrap();
    let (small, large) = (original.saturating_add(1 << 30), original.saturating_add(2 << 30));
    let open = |keep: u64| {
        let e = Engine::new(Settings::default().device_cache_bytes(keep)).unwrap();
        e.gpu(0).unwrap();
        e
    };
    let a = open(small);
    assert_eq!(gpu.freed_memory_kept().unwrap(), small);
    let b = open(large);
    assert_eq!(gpu.freed_memory_kept().unwrap(), large);
    drop(a);
    assert_eq!(gpu.freed_memory_kept().unwrap(), large, "the first engine's going must not undo the second's cache");
    let c = open(small);
    drop(b);
    assert_eq!(gpu.freed_memory_kept().unwrap(), small);
    drop(c);
    assert_eq!(gpu.freed_memory_kept().unwrap(), original);
}
