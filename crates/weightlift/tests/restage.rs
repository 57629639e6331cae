//! A lane whose staging was grown for one load must serve the next load with other slot sizes. Regression test of
//! the hang seen on the H100 after cold GPU loads (bench/results/2026-11-24-h100 at b3a4ec8/hang-after-cold-loads): cold reads
//! made each lane's staging one large slot; the next warm load wanted two smaller slots, restaging kept the large
//! slot size, which left room for one slot only, so the lane restaged forever (spinning, pinning memory each time).

use std::sync::mpsc;
use std::time::Duration;

use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::{Device, Engine, LoadOpts, Settings};

/// Drops the file's pages from the page cache, so that the next load reads it cold.
fn evict(path: &std::path::Path) {
    let f = std::fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    // SAFETY: a valid descriptor; the call only advises the kernel.
    let r = unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0);
}

#[test]
fn a_warm_load_after_a_cold_one_gets_staging_that_fits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    synth::generate(
        &path,
        &Spec { layout: Layout::SingleHuge, container: Container::Safetensors, size: 48 << 20, seed: 5, align: None },
    )
    .unwrap();
    let reference = std::fs::read(&path).unwrap();
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    // Two lanes, 16 MiB of staging each: a cold read (large requests) fills a lane's share with one slot; a warm
    // load of 4 MiB chunks at queue depth 4 wants four slots.
    let settings = Settings::default().threads(2).queue_depth(4).staging_bytes(32 << 20).host_cache_bytes(0);
    let engine = std::sync::Arc::new(Engine::new(settings).unwrap());
    let mut slot_bytes = Vec::new();
    for cold in [true, false, true, false] {
        if cold {
            evict(&path);
        }
        let (tx, rx) = mpsc::channel();
        let (e, idx) = (engine.clone(), index.clone());
        std::thread::spawn(move || {
            let _ = tx.send(e.load(&idx, Device::Cpu, &LoadOpts::default()).map(|l| {
                let t = &l.tensors[0];
                let mut bytes = vec![0u8; t.data.len()];
                t.data.read_back(0, &mut bytes).unwrap();
                (bytes, l.report.io.slot_bytes, l.report.io.slots_per_lane)
            }));
        });
        let (bytes, slot, slots) = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("the {} load did not finish in 20 s", if cold { "cold" } else { "warm" }))
            .unwrap();
        let e = &index.tensors[0];
        assert!(bytes == reference[e.offset as usize..e.end() as usize]);
        slot_bytes.push((cold, slot, slots));
    }
    // The case is the one described above only if the cold and warm loads asked for different staging.
    let (cold, warm) = (slot_bytes[0], slot_bytes[1]);
    assert!(cold.1 > warm.1 && warm.2 > cold.2, "cold {cold:?}, warm {warm:?}: the case did not arise");
}
