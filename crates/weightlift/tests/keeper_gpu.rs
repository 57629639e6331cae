//! The keeper on a GPU: device memory shared as file descriptors, served to loads as copies and as read-only views,
//! every byte compared with the file; a changed file reloaded, never served stale; a keeper process killed while a
//! client holds views (the views stay valid); device memory back at its baseline once everything is gone. Each test
//! says why it skips where no CUDA device is usable; the cross-process test needs the CLI (`WEIGHTLIFT_BIN`).

mod common;
use common::{check_against, gpu_or_skip};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::keep::{Keeper, KeeperConfig, Reply};
use weightlift::{Device, Engine, KeeperMode, KeeperSocket, LoadOpts, Loaded, PathUsed, Settings};

fn generate(dir: &Path, name: &str, seed: u64, size: u64) -> PathBuf {
    let path = dir.join(name);
    synth::generate(&path, &Spec { layout: Layout::Llama, container: Container::Safetensors, size, seed, align: None })
        .unwrap();
    path
}

fn socket_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    d
}

fn engine(socket: &Path, mode: KeeperMode) -> Engine {
    Engine::new(Settings::default().keeper(KeeperSocket::Path(socket.to_path_buf())).keeper_mode(mode)).unwrap()
}

fn load(e: &Engine, path: &Path) -> (Loaded, weightlift::format::TensorIndex) {
    let index = weightlift::format::open(&[path.to_path_buf()], None).unwrap();
    let loaded = e.load(&index, Device::Cuda(0), &LoadOpts::default()).unwrap();
    (loaded, index)
}

fn check_bytes(loaded: &Loaded, index: &weightlift::format::TensorIndex) {
    weightlift::verify::compare_with_file(index, |i, off, out| loaded.tensors[i].data.read_back(off, out)).unwrap();
}

/// A keeper on cuda:0 (1 GiB budget) at `socket`, keeping `path` once started.
fn gpu_keeper(socket: &Path, path: &Path) -> Keeper {
    let k = Keeper::start(KeeperConfig {
        device: Device::Cuda(0),
        socket: Some(socket.to_path_buf()),
        budget: Some(1 << 30),
        settings: Settings::default().keeper(KeeperSocket::Off),
    })
    .unwrap();
    k.keep(&[path.to_path_buf()]).unwrap();
    k.wait_idle();
    k
}

fn free_bytes() -> u64 {
    weightlift::cuda::Gpu::open(0).unwrap().mem_info().unwrap().0
}

/// Waits up to 10 s for the device's free memory to come back within `slack` of `baseline` (the driver frees a
/// dead process's memory asynchronously).
fn back_to(baseline: u64, slack: u64) {
    let t = Instant::now();
    loop {
        let free = free_bytes();
        if free + slack >= baseline {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "device memory not back: {free} free, {baseline} before");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_keeper_serves_copies_and_read_only_views_byte_exact_and_frees_its_memory() {
    if !gpu_or_skip("a_keeper_serves_copies_and_read_only_views_byte_exact_and_frees_its_memory") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let a = generate(dir.path(), "a.safetensors", 11, 96 << 20);
    let copy = engine(&socket, KeeperMode::Copy);
    let view = engine(&socket, KeeperMode::View);
    let warm = load(&copy, &a); // the context and the pool's first use, before the baseline
    drop(warm);
    copy.release_memory();
    let baseline = free_bytes();
    let k = gpu_keeper(&socket, &a);
    let Reply::Status { entries, .. } = k.status() else { unreachable!() };
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].state, "ready", "{entries:?}");
    for e in [&copy, &view] {
        let (loaded, index) = load(e, &a);
        assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
        println!("{} in {:.4} s", loaded.report.keeper.as_deref().unwrap(), loaded.report.seconds);
        check_bytes(&loaded, &index);
    }
    // A view holds its lease until freed.
    let (held, _) = load(&view, &a);
    let Reply::Status { entries, .. } = k.status() else { unreachable!() };
    assert_eq!(entries[0].leases, 1);
    drop(held);
    let t = Instant::now();
    while matches!(k.status(), Reply::Status { ref entries, .. } if entries[0].leases > 0) {
        assert!(t.elapsed() < Duration::from_secs(5), "a freed view's lease did not end");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Changed in place: not served, then kept anew, never stale.
    {
        use std::io::{Seek, SeekFrom, Write};
        let len = std::fs::metadata(&a).unwrap().len();
        let mut f = std::fs::OpenOptions::new().write(true).open(&a).unwrap();
        f.seek(SeekFrom::Start(len - 8192)).unwrap();
        f.write_all(&[0xa5; 8192]).unwrap();
    }
    let (loaded, index) = load(&copy, &a);
    assert_ne!(loaded.report.path, PathUsed::Keeper);
    check_bytes(&loaded, &index);
    drop(loaded);
    k.wait_idle();
    let (loaded, index) = load(&copy, &a);
    assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
    check_bytes(&loaded, &index);
    drop(loaded);
    drop(k);
    copy.release_memory();
    view.release_memory();
    back_to(baseline, 64 << 20);
}

#[test]
fn a_keeper_process_killed_leaves_a_clients_views_valid_and_its_memory_is_freed() {
    if !gpu_or_skip("a_keeper_process_killed_leaves_a_clients_views_valid_and_its_memory_is_freed") {
        return;
    }
    let Some(bin) = std::env::var_os("WEIGHTLIFT_BIN") else {
        eprintln!("skipping: WEIGHTLIFT_BIN (the weightlift CLI) is not set");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let a = generate(dir.path(), "a.safetensors", 12, 256 << 20);
    let view = engine(&socket, KeeperMode::View);
    drop(load(&view, &a)); // no keeper yet: a normal load, which starts the context
    view.release_memory();
    let baseline = free_bytes();
    let mut keeper = std::process::Command::new(&bin)
        .args(["keep", "--device", "cuda:0", "--socket"])
        .arg(&socket)
        .arg(&a)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    loop {
        if let Ok(Reply::Status { entries, .. }) = weightlift::keep::status(&socket)
            && entries.first().is_some_and(|e| e.state == "ready")
        {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "the keeper did not keep the file");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (loaded, index) = load(&view, &a);
    assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
    keeper.kill().unwrap(); // SIGKILL, while the views are held
    keeper.wait().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    check_bytes(&loaded, &index); // the mapping keeps the memory valid after the exporter's death
    // A load now: the keeper gone, read from the file, the reason said.
    let (other, index2) = load(&view, &a);
    assert_ne!(other.report.path, PathUsed::Keeper);
    println!("after the keeper's death: {:?}", other.report.keeper);
    check_bytes(&other, &index2);
    drop((loaded, other));
    view.release_memory();
    back_to(baseline, 64 << 20);
}

#[test]
fn a_kept_pack_decodes_on_the_gpu_from_the_keepers_memory_and_frees_its_memory() {
    if !gpu_or_skip("a_kept_pack_decodes_on_the_gpu_from_the_keepers_memory_and_frees_its_memory") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let a = generate(dir.path(), "a.safetensors", 12, 64 << 20);
    let pack = dir.path().join("a.wlpack");
    let opts = weightlift_pack::PackOptions { plane_chunk: 256 << 10, ..Default::default() };
    weightlift_pack::pack(&a, &pack, &opts, &|_, _| {}).unwrap();
    // Batches of 4 MiB: several decoding at once from the keeper's memory, as a large pack's do.
    let settings = Settings::default().keeper(KeeperSocket::Path(socket.clone())).pack_batch_bytes(4 << 20);
    let e = Engine::new(settings).unwrap();
    let load = |decoder| e.load_pack(&pack, None, Device::Cuda(0), decoder, &LoadOpts::default()).unwrap();
    // The context, the pool and the decoder's first use, before the baseline (no keeper yet).
    drop(load(weightlift::Decoder::Gpu));
    e.release_memory();
    let baseline = free_bytes();
    let k = gpu_keeper(&socket, &pack);
    let loaded = load(weightlift::Decoder::Gpu);
    assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
    let note = loaded.report.keeper.clone().unwrap();
    assert!(note.contains("decoded on the GPU"), "{note}");
    println!("{note} in {:.4} s", loaded.report.seconds);
    check_against(&a, &loaded);
    drop(loaded);
    // A load that decodes on the CPU does not ask: decoded from the file.
    let loaded = load(weightlift::Decoder::Cpu);
    assert_ne!(loaded.report.path, PathUsed::Keeper);
    check_against(&a, &loaded);
    drop(loaded);
    drop(k);
    e.release_memory();
    back_to(baseline, 64 << 20);
}
