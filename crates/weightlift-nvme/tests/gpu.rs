//! The GPU path end to end against the software controller: kernels build submission entries, ring doorbells and
//! poll completions; every byte that lands in device memory is compared with `std::fs::read`; several queue pairs
//! run under load; an injected controller error comes back as a typed error naming its LBAs. Each test says why
//! it skips on a machine without CUDA or NVRTC.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use weightlift_cuda::{DeviceBuffer, Gpu};
use weightlift_nvme::gpu::{GpuLoader, GpuOptions, Tier, compile, kernel_source, nvrtc_available};
use weightlift_nvme::spec::Status;
use weightlift_nvme::{BringUp, ByteRange, Controller, Fault, NvmeError, SoftConfig, SoftNvme};

/// Deterministic pseudo-random bytes: the synthetic-checkpoint generator's, so every test shares one.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    weightlift_format::synth::tensor_bytes(seed, 0, 0, &mut v);
    v
}

fn backing(dir: &Path, len: usize, seed: u64) -> PathBuf {
    let p = dir.join(format!("gpu-ns-{seed}.bin"));
    std::fs::write(&p, pattern(len, seed)).unwrap();
    p
}

/// The tests take turns on the GPU: tier 2's stand-in for peer-to-peer DMA issues CUDA copies while a kernel
/// polls, and another test's device-wide synchronisation (module loads, `cuCtxSynchronize`) in that window stalls
/// those copies until the kernel's timeout.
static GPU_TURN: Mutex<()> = Mutex::new(());

/// The GPU to run on (holding the turn), or `None` with the reason printed.
fn gpu() -> Option<(MutexGuard<'static, ()>, Gpu)> {
    if let Err(why) = weightlift_cuda::available() {
        println!("skipped: CUDA unavailable: {why}");
        return None;
    }
    if let Err(why) = nvrtc_available() {
        println!("skipped: {why}");
        return None;
    }
    let turn = GPU_TURN.lock().unwrap_or_else(|p| p.into_inner());
    Some((turn, Gpu::open(0).expect("CUDA is available but cuda:0 does not open")))
}

/// Awkward ranges over a `len`-byte file: unaligned starts and lengths, gaps, the unaligned tail, and destinations
/// that do not share the source's alignment.
fn ranges(len: u64, seed: u64) -> (Vec<ByteRange>, u64) {
    let mut out = Vec::new();
    let (mut pos, mut dest, mut x) = (0u64, 0u64, seed | 1);
    while pos < len {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let n = (1 + (x >> 33) % (4 << 20)).min(len - pos);
        out.push(ByteRange { offset: pos, len: n, dest_offset: dest });
        dest += n + (x >> 61);
        pos += n + (x >> 45) % 3000;
    }
    (out, dest)
}

fn check(file: &[u8], ranges: &[ByteRange], got: &[u8]) {
    for r in ranges {
        let want = &file[r.offset as usize..(r.offset + r.len) as usize];
        let have = &got[r.dest_offset as usize..(r.dest_offset + r.len) as usize];
        if want != have {
            let at = want.iter().zip(have).position(|(a, b)| a != b).unwrap_or(0);
            panic!("range {r:?} differs first at byte {at}");
        }
    }
}

fn run(gpu: &Gpu, tier: Tier, lba_size: u32, queue_pairs: u16, entries: u32, len: usize, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), len, seed);
    let file = std::fs::read(&path).unwrap();
    let soft =
        SoftNvme::start(&path, SoftConfig { lba_size, mdts: 5, io_threads: 4, ..SoftConfig::default() }).unwrap();
    let ctrl = Controller::bring_up(soft.bus(), BringUp::default()).unwrap();
    let opts = GpuOptions { tier, queue_pairs, entries, ..GpuOptions::default() };
    let mut loader = GpuLoader::new(gpu, &ctrl, &opts).unwrap();
    let (ranges, dest_len) = ranges(len as u64, seed);
    let stream = gpu.stream(0).unwrap();
    let mut dest = DeviceBuffer::alloc(gpu, dest_len as usize, &stream).unwrap();
    for round in 0..2 {
        let report = loader.load(&ranges, &mut dest).unwrap();
        let mut got = vec![0u8; dest_len as usize];
        dest.read_back(0, &mut got).unwrap();
        check(&file, &ranges, &got);
        assert!(report.commands >= ranges.len() as u64);
        println!(
            "{tier:?} lba {lba_size} {queue_pairs}x{entries} round {round}: {} commands, {} bytes in {:?}: {:.0} IOPS, {:.2} GB/s",
            report.commands,
            report.bytes,
            report.elapsed,
            report.iops(),
            report.gbps()
        );
    }
    assert!(soft.fatal().is_none());
}

#[test]
fn kernel_compiles_with_nvrtc() {
    if let Err(why) = nvrtc_available() {
        println!("skipped: {why}");
        return;
    }
    for arch in [None, Some((8, 0)), Some((9, 0))] {
        let ptx = compile(&kernel_source(), arch).unwrap_or_else(|e| panic!("{arch:?}: {e}"));
        let text = ptx.to_src();
        assert!(text.contains("wl_nvme_read"), "{arch:?}");
        assert!(text.contains("membar.sys") || text.contains("fence.sc.sys"), "__threadfence_system is in the PTX");
    }
}

#[test]
fn tier1_loads_byte_for_byte() {
    let Some((_turn, gpu)) = gpu() else { return };
    run(&gpu, Tier::HostStaging, 512, 4, 32, (24 << 20) + 333, 1);
    run(&gpu, Tier::HostStaging, 4096, 2, 8, (3 << 20) + 5, 2);
}

#[test]
fn tier2_loads_byte_for_byte() {
    let Some((_turn, gpu)) = gpu() else { return };
    run(&gpu, Tier::DeviceStaging, 512, 4, 32, (24 << 20) + 333, 3);
    run(&gpu, Tier::DeviceStaging, 4096, 2, 8, (3 << 20) + 5, 4);
}

#[test]
fn many_queue_pairs_under_load() {
    let Some((_turn, gpu)) = gpu() else { return };
    run(&gpu, Tier::HostStaging, 4096, 16, 64, 96 << 20, 5);
    run(&gpu, Tier::DeviceStaging, 512, 16, 128, 64 << 20, 6);
}

#[test]
fn injected_error_is_typed_and_names_the_lba() {
    let Some((_turn, gpu)) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let len = 16 << 20;
    let path = backing(dir.path(), len, 7);
    let file = std::fs::read(&path).unwrap();
    let soft = SoftNvme::start(&path, SoftConfig { io_threads: 2, ..SoftConfig::default() }).unwrap();
    let ctrl = Controller::bring_up(soft.bus(), BringUp::default()).unwrap();
    for tier in [Tier::HostStaging, Tier::DeviceStaging] {
        let opts =
            GpuOptions { tier, queue_pairs: 4, entries: 16, timeout: Duration::from_secs(5), ..GpuOptions::default() };
        let mut loader = GpuLoader::new(&gpu, &ctrl, &opts).unwrap();
        let ranges = [ByteRange { offset: 0, len: len as u64, dest_offset: 0 }];
        let stream = gpu.stream(0).unwrap();
        let mut dest = DeviceBuffer::alloc(&gpu, len, &stream).unwrap();
        let bad_lba = 12_345;
        soft.inject(Fault { lba: bad_lba, status: Status::UNRECOVERED_READ_ERROR, op: None });
        let e = loader.load(&ranges, &mut dest).unwrap_err();
        match &e {
            NvmeError::Command { slba, nlb, status, .. } => {
                assert!((*slba..*slba + u64::from(*nlb)).contains(&bad_lba), "{e}");
                assert!(status.same_code(Status::UNRECOVERED_READ_ERROR), "{e}");
                assert!(e.to_string().contains(&format!("LBA {slba}..")), "{e}");
            }
            other => panic!("{tier:?}: expected a command error, got {other}"),
        }
        println!("{tier:?}: {e}");
        // The kernel drained its queues before stopping: the same loader works once the fault is gone.
        soft.clear_faults();
        loader.load(&ranges, &mut dest).unwrap();
        let mut got = vec![0u8; len];
        dest.read_back(0, &mut got).unwrap();
        assert!(got == file, "{tier:?}: reload after the error");
    }
}
