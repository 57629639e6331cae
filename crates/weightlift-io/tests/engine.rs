//! The storage engine end to end: every loaded byte equals what `std::fs::read` sees, under every backend and
//! O_DIRECT policy; injected faults are errors naming the file and offset, never partial data reported as success.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use weightlift_io::fault::{Fault, FaultPlan};
use weightlift_io::{
    DirectMode, Extent, HostBuffer, HostSink, IoEngine, IoError, IoParams, IoReport, LoadOptions, LoadRequest, Pending,
    Piece, ReadEngine, Sink, SinkError, open_all,
};

/// Deterministic pseudo-random bytes: the synthetic-checkpoint generator's, so every test shares one.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    weightlift_format::synth::tensor_bytes(seed, 0, 0, &mut v);
    v
}

fn write(dir: &Path, name: &str, len: usize, seed: u64) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, pattern(len, seed)).unwrap();
    p
}

/// Cuts each file into ranges of awkward sizes at awkward offsets (gaps included), one destination per range.
fn extents_for(lens: &[u64], seed: u64) -> Vec<Extent> {
    let mut out = Vec::new();
    let mut x = seed | 1;
    let mut rnd = |m: u64| {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 33) % m.max(1)
    };
    for (f, &len) in lens.iter().enumerate() {
        let mut pos = rnd(7).min(len);
        while pos < len {
            let size = match rnd(4) {
                0 => 1 + rnd(100),
                1 => 1 + rnd(10_000),
                2 => 4096 * (1 + rnd(3)),
                _ => 1 + rnd(3 << 20),
            }
            .min(len - pos);
            out.push(Extent { file: f as u32, offset: pos, len: size, dest: out.len() as u32, dest_offset: 0 });
            pos += size + if rnd(3) == 0 { rnd(5000) } else { 0 };
        }
    }
    out
}

fn engine(params: &IoParams) -> IoEngine {
    IoEngine::new(*params, "the test").unwrap()
}

fn load_into_host(
    paths: &[PathBuf],
    extents: &[Extent],
    params: &IoParams,
    faults: Option<&FaultPlan>,
) -> Result<(Vec<HostBuffer>, IoReport), IoError> {
    load_with(&engine(params), paths, extents, faults)
}

fn load_with(
    engine: &IoEngine,
    paths: &[PathBuf],
    extents: &[Extent],
    faults: Option<&FaultPlan>,
) -> Result<(Vec<HostBuffer>, IoReport), IoError> {
    let files = open_all(paths, engine.params().direct != DirectMode::Never)?;
    let dest_lens: Vec<u64> = extents.iter().map(|e| e.len).collect();
    let mut bufs: Vec<HostBuffer> = dest_lens.iter().map(|&l| HostBuffer::new(l as usize, None).unwrap()).collect();
    let report = {
        let sink = HostSink::borrowing(&mut bufs);
        let req = LoadRequest { files: &files, extents, dest_lens: &dest_lens };
        let opts = LoadOptions { faults, ..LoadOptions::default() };
        engine.load(&req, &opts, &*sink)?
    };
    Ok((bufs, report))
}

fn check_bytes(paths: &[PathBuf], extents: &[Extent], bufs: &[HostBuffer]) {
    let contents: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    for (e, b) in extents.iter().zip(bufs) {
        let want = &contents[e.file as usize][e.offset as usize..(e.offset + e.len) as usize];
        assert!(&b[..] == want, "extent {e:?} differs");
    }
}

fn configs() -> Vec<(&'static str, IoParams)> {
    let small =
        IoParams { chunk_bytes: 64 << 10, staging_bytes: 1 << 20, threads: 2, queue_depth: 3, ..IoParams::default() };
    let mut v = Vec::new();
    for engine in [ReadEngine::Uring, ReadEngine::Pread] {
        if engine == ReadEngine::Uring && weightlift_io::uring_available().is_err() {
            eprintln!("skipping io_uring configurations: {}", weightlift_io::uring_available().unwrap_err());
            continue;
        }
        for direct in [DirectMode::Auto, DirectMode::Always, DirectMode::Never] {
            for cache in [weightlift_io::CachePolicy::Keep, weightlift_io::CachePolicy::Bypass] {
                v.push(("default", IoParams { engine, direct, cache, ..IoParams::default() }));
                v.push(("small", IoParams { engine, direct, cache, ..small }));
            }
        }
    }
    v
}

#[test]
fn small_and_odd_sized_files_load_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [0usize, 1, 4095, 4096, 4097, 1_000_003];
    let paths: Vec<PathBuf> =
        lens.iter().enumerate().map(|(i, &l)| write(dir.path(), &format!("f{i}"), l, i as u64 + 1)).collect();
    for (name, config) in configs() {
        // Each file whole, and each file cut into odd pieces, all files in one load.
        let mut extents: Vec<Extent> = lens
            .iter()
            .enumerate()
            .filter(|(_, l)| **l > 0)
            .map(|(f, &l)| Extent { file: f as u32, offset: 0, len: l as u64, dest: 0, dest_offset: 0 })
            .collect();
        let cut = extents_for(&lens.iter().map(|&l| l as u64).collect::<Vec<_>>(), 7);
        extents.extend(cut);
        for (i, e) in extents.iter_mut().enumerate() {
            e.dest = i as u32;
        }
        let (bufs, report) = load_into_host(&paths, &extents, &config, None).unwrap();
        check_bytes(&paths, &extents, &bufs);
        assert_eq!(report.requested_bytes, extents.iter().map(|e| e.len).sum::<u64>(), "{name}");
        assert!(report.peak_staging_bytes <= config.staging_bytes, "{name}: {report:?}");
        if config.direct == DirectMode::Never {
            assert_eq!(report.direct_bytes, 0, "{name}");
        }
        assert!(report.direct_bytes + report.buffered_bytes > 0, "{name}: {report:?}");
    }
}

#[test]
fn direct_always_reads_directly_where_the_filesystem_allows() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "f", 3 << 20, 3);
    let files = open_all(std::slice::from_ref(&path), true).unwrap();
    if !files[0].supports_direct() {
        eprintln!("skipping: {}", files[0].direct_refused.as_deref().unwrap_or("no O_DIRECT"));
        return;
    }
    let extents = [Extent { file: 0, offset: 13, len: (3 << 20) - 20, dest: 0, dest_offset: 0 }];
    let config = IoParams { direct: DirectMode::Always, ..IoParams::default() };
    let (bufs, report) = load_into_host(std::slice::from_ref(&path), &extents, &config, None).unwrap();
    check_bytes(std::slice::from_ref(&path), &extents, &bufs);
    assert!(report.direct_bytes >= 3 << 20, "{report:?}");
    assert_eq!(report.buffered_bytes, 0, "{report:?}");
}

#[test]
fn a_gigabyte_and_thirteen_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let len = (1usize << 30) + 13;
    let path = write(dir.path(), "big", len, 11);
    let extents = [
        Extent { file: 0, offset: 0, len: 7, dest: 0, dest_offset: 0 },
        Extent { file: 0, offset: 7, len: len as u64 - 7 - 6, dest: 1, dest_offset: 0 },
        Extent { file: 0, offset: len as u64 - 6, len: 6, dest: 2, dest_offset: 0 },
    ];
    let config = IoParams { staging_bytes: 32 << 20, ..IoParams::default() };
    let (bufs, report) = load_into_host(std::slice::from_ref(&path), &extents, &config, None).unwrap();
    check_bytes(std::slice::from_ref(&path), &extents, &bufs);
    assert!(report.peak_staging_bytes <= 32 << 20);
}

/// Discards bytes after checking them against the generator; keeps no destination memory.
struct CountingSink {
    bytes: AtomicU64,
    seen: Mutex<u64>,
}

impl Sink for CountingSink {
    fn deliver(&self, _lane: usize, pieces: &[Piece], data: &[u8]) -> Result<Option<Box<dyn Pending>>, SinkError> {
        for p in pieces {
            if (p.at + p.len) as usize > data.len() {
                return Err("piece past the read".into());
            }
            self.bytes.fetch_add(p.len, Ordering::Relaxed);
        }
        *self.seen.lock().unwrap() += 1;
        Ok(None)
    }
}

#[test]
fn staging_stays_under_its_bound_for_a_4_gib_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse");
    std::fs::File::create(&path).unwrap().set_len(4 << 30).unwrap();
    let files = open_all(std::slice::from_ref(&path), false).unwrap();
    let extents: Vec<Extent> =
        (0..64u64).map(|i| Extent { file: 0, offset: i << 26, len: 1 << 26, dest: i as u32, dest_offset: 0 }).collect();
    let dest_lens = vec![1u64 << 26; 64];
    let sink = CountingSink { bytes: AtomicU64::new(0), seen: Mutex::new(0) };
    let progress = AtomicU64::new(0);
    let config = IoParams { direct: DirectMode::Never, ..IoParams::default() };
    let req = LoadRequest { files: &files, extents: &extents, dest_lens: &dest_lens };
    let opts = LoadOptions { progress: Some(&progress), ..LoadOptions::default() };
    let report = engine(&config).load(&req, &opts, &sink).unwrap();
    assert_eq!(sink.bytes.load(Ordering::Relaxed), 4 << 30);
    assert_eq!(progress.load(Ordering::Relaxed), 4 << 30);
    assert!(report.peak_staging_bytes <= 256 << 20, "{}", report.peak_staging_bytes);
    assert!(report.peak_staging_bytes > 0);
}

fn faulty_setup(dir: &Path) -> (Vec<PathBuf>, Vec<Extent>) {
    let paths = vec![write(dir, "a", 300_000, 1), write(dir, "b", 2_000_000, 2)];
    let extents = extents_for(&[300_000, 2_000_000], 3);
    (paths, extents)
}

#[test]
fn eio_is_an_error_naming_file_and_offset() {
    for (name, config) in configs() {
        let dir = tempfile::tempdir().unwrap();
        let (paths, extents) = faulty_setup(dir.path());
        let faults = FaultPlan::new(vec![Fault::Eio { file: 1, offset: 1_234_567 }]);
        let err = load_into_host(&paths, &extents, &config, Some(&faults)).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, IoError::Read { .. }), "{name}: {msg}");
        assert!(msg.contains(&*paths[1].to_string_lossy()), "{name}: {msg}");
        assert!(msg.contains("offset"), "{name}: {msg}");
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{name}");
    }
}

#[test]
fn a_lane_that_panics_fails_its_load_and_breaks_the_engine() {
    for (name, config) in configs().into_iter().filter(|(_, c)| c.direct == DirectMode::Auto) {
        let dir = tempfile::tempdir().unwrap();
        let (paths, extents) = faulty_setup(dir.path());
        let engine = engine(&config);
        let (tx, rx) = std::sync::mpsc::channel();
        let (e, p, x) = (engine.clone(), paths.clone(), extents.clone());
        // On a thread of its own: a load left waiting for the dead lane fails the test instead of hanging it.
        std::thread::spawn(move || {
            let faults = FaultPlan::new(vec![Fault::Panic { file: 1, offset: 1_234_567 }]);
            let _ = tx.send(load_with(&e, &p, &x, Some(&faults)).map(|_| ()));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(60));
        let err =
            got.unwrap_or_else(|_| panic!("{name}: the load still waits for the lane that panicked")).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, IoError::Panicked(_)), "{name}: {msg}");
        assert!(msg.contains("injected panic at offset 1234567"), "{name}: {msg}");
        assert_eq!(msg.matches("an I/O thread panicked").count(), 1, "{name}: {msg}");
        // Later loads fail at once with the reason.
        let later = load_with(&engine, &paths, &extents, None).unwrap_err().to_string();
        assert!(later.contains("panicked") && later.contains("injected panic"), "{name}: {later}");
    }
}

#[test]
fn short_reads_are_completed_not_returned() {
    for (name, config) in configs() {
        let dir = tempfile::tempdir().unwrap();
        let (paths, extents) = faulty_setup(dir.path());
        let faults = FaultPlan::new(vec![
            Fault::Short { file: 0, offset: 100_001 },
            Fault::Short { file: 1, offset: 1_000_000 },
            Fault::Short { file: 1, offset: 1_999_999 },
        ]);
        let (bufs, report) = load_into_host(&paths, &extents, &config, Some(&faults)).unwrap();
        check_bytes(&paths, &extents, &bufs);
        assert!(report.stats.short_reads >= 1, "{name}: {report:?}");
    }
}

#[test]
fn truncation_while_reading_is_an_error() {
    for (name, config) in configs() {
        let dir = tempfile::tempdir().unwrap();
        let (paths, extents) = faulty_setup(dir.path());
        let faults = FaultPlan::new(vec![Fault::TruncateAt { file: 1, offset: 1_500_000 }]);
        let err = load_into_host(&paths, &extents, &config, Some(&faults)).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, IoError::Truncated { .. }), "{name}: {msg}");
        assert!(msg.contains(&*paths[1].to_string_lossy()), "{name}: {msg}");
    }
}

#[test]
fn extents_past_the_end_are_rejected_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "f", 1000, 1);
    let extents = [Extent { file: 0, offset: 900, len: 200, dest: 0, dest_offset: 0 }];
    let err = load_into_host(std::slice::from_ref(&path), &extents, &IoParams::default(), None).unwrap_err();
    assert!(matches!(err, IoError::PastEnd { .. }), "{err}");
}

#[test]
fn cancellation_stops_the_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "f", 8 << 20, 1);
    let files = open_all(std::slice::from_ref(&path), false).unwrap();
    let extents = [Extent { file: 0, offset: 0, len: 8 << 20, dest: 0, dest_offset: 0 }];
    let mut bufs = vec![HostBuffer::new(8 << 20, None).unwrap()];
    let sink = HostSink::borrowing(&mut bufs);
    let cancel = AtomicBool::new(true);
    let req = LoadRequest { files: &files, extents: &extents, dest_lens: &[8 << 20] };
    let opts = LoadOptions { cancel: Some(&cancel), ..LoadOptions::default() };
    let err = engine(&IoParams::default()).load(&req, &opts, &*sink).unwrap_err();
    assert!(matches!(err, IoError::Cancelled), "{err}");
}

/// The lanes persist: one engine serves many loads (and loads from several threads at once) with the right bytes.
#[test]
fn one_engine_serves_many_loads_and_threads() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, extents) = faulty_setup(dir.path());
    for (name, config) in configs().into_iter().step_by(3) {
        let engine = engine(&config);
        for _ in 0..3 {
            let (bufs, _) = load_with(&engine, &paths, &extents, None).unwrap();
            check_bytes(&paths, &extents, &bufs);
        }
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    let (bufs, _) = load_with(&engine, &paths, &extents, None).unwrap();
                    check_bytes(&paths, &extents, &bufs);
                });
            }
        });
        // A failed load leaves the engine usable.
        let faults = FaultPlan::new(vec![Fault::Eio { file: 1, offset: 1_234_567 }]);
        assert!(load_with(&engine, &paths, &extents, Some(&faults)).is_err(), "{name}");
        let (bufs, _) = load_with(&engine, &paths, &extents, None).unwrap();
        check_bytes(&paths, &extents, &bufs);
    }
}

/// Counts a sink's calls, and those made after the load using it returned.
struct WatchedSink {
    inner: HostSink,
    returned: AtomicBool,
    late_calls: AtomicU64,
}

impl WatchedSink {
    fn note(&self) {
        if self.returned.load(Ordering::SeqCst) {
            self.late_calls.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Sink for WatchedSink {
    fn begin_lane(&self, lane: usize) -> Result<(), SinkError> {
        self.note();
        self.inner.begin_lane(lane)
    }
    fn deliver(&self, lane: usize, pieces: &[Piece], data: &[u8]) -> Result<Option<Box<dyn Pending>>, SinkError> {
        self.note();
        self.inner.deliver(lane, pieces, data)
    }
    fn landed(&self, pieces: &[Piece]) {
        self.note();
        self.inner.landed(pieces);
    }
    fn end_lane(&self, lane: usize) -> Result<(), SinkError> {
        self.note();
        self.inner.end_lane(lane)
    }
}

/// A load's sink may be gone once the load has returned (it lives in the caller's frame), so no lane may call it
/// after that, not even a lane that was still setting up its staging for the load when the load completed (lanes
/// pin their staging one at a time; a one-read load is done by the first lane ready). Seen on the GPU machine as a segfault.
#[test]
fn no_lane_calls_a_sink_after_its_load_returned() {
    let dir = tempfile::tempdir().unwrap();
    let len = 64usize << 20;
    let path = write(dir.path(), "sixteen-reads.bin", len, 5);
    let expected = pattern(len, 5);
    let params = IoParams { threads: 16, ..IoParams::default() };
    for round in 0..3 {
        let io = engine(&params);
        let files = open_all(std::slice::from_ref(&path), false).unwrap();
        let mut out = vec![0u8; len];
        let extents = [Extent { file: 0, offset: 0, len: len as u64, dest: 0, dest_offset: 0 }];
        // SAFETY: `out` outlives the sink and nothing else touches it during the load.
        let inner = unsafe { HostSink::new(vec![(out.as_mut_ptr(), out.len())]) };
        let sink = WatchedSink { inner, returned: AtomicBool::new(false), late_calls: AtomicU64::new(0) };
        let req = LoadRequest { files: &files, extents: &extents, dest_lens: &[len as u64] };
        io.load(&req, &LoadOptions::default(), &sink).unwrap();
        sink.returned.store(true, Ordering::SeqCst);
        // The other lanes finish setting up meanwhile.
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(sink.late_calls.load(Ordering::SeqCst), 0, "round {round}: lanes called the sink after the load");
        assert!(out == expected, "round {round}: bytes differ");
    }
}

/// Records which lanes joined a load.
struct LaneSink {
    inner: HostSink,
    lanes: Mutex<Vec<usize>>,
}

impl Sink for LaneSink {
    fn begin_lane(&self, lane: usize) -> Result<(), SinkError> {
        self.lanes.lock().unwrap().push(lane);
        self.inner.begin_lane(lane)
    }
    fn deliver(&self, lane: usize, pieces: &[Piece], data: &[u8]) -> Result<Option<Box<dyn Pending>>, SinkError> {
        self.inner.deliver(lane, pieces, data)
    }
    fn landed(&self, pieces: &[Piece]) {
        self.inner.landed(pieces);
    }
    fn end_lane(&self, lane: usize) -> Result<(), SinkError> {
        self.inner.end_lane(lane)
    }
}

/// A streaming load capped at two lanes is read by lanes 0 and 1 only (of 8), every byte in place, and its report's
/// staging is that of two lanes; without the cap, more lanes join.
#[test]
fn a_stream_capped_at_two_lanes_uses_two() {
    let dir = tempfile::tempdir().unwrap();
    let len = 192usize << 20; // 192 reads: more than one lane's work while the others set up
    let path = write(dir.path(), "capped.bin", len, 9);
    let expected = pattern(len, 9);
    let io = engine(&IoParams { threads: 8, chunk_bytes: 1 << 20, ..IoParams::default() });
    let files = open_all(std::slice::from_ref(&path), false).unwrap();
    for cap in [Some(2), None] {
        let mut out = vec![0u8; len];
        let extents = [Extent { file: 0, offset: 0, len: len as u64, dest: 0, dest_offset: 0 }];
        // SAFETY: `out` outlives the load (waited below) and nothing else touches it meanwhile.
        let inner = unsafe { HostSink::new(vec![(out.as_mut_ptr(), out.len())]) };
        let sink = std::sync::Arc::new(LaneSink { inner, lanes: Mutex::new(Vec::new()) });
        let req = LoadRequest { files: &files, extents: &extents, dest_lens: &[len as u64] };
        let opts = weightlift_io::StreamOptions { max_lanes: cap, ..Default::default() };
        let report = io.start(&req, opts, sink.clone()).unwrap().wait().unwrap();
        assert!(out == expected, "cap {cap:?}: bytes differ");
        let lanes = sink.lanes.lock().unwrap().clone();
        match cap {
            Some(c) => {
                assert!(lanes.iter().all(|&l| l < c), "lanes {lanes:?} joined a load capped at {c}");
                assert_eq!(report.peak_staging_bytes, report.slot_bytes * report.slots_per_lane as u64 * c as u64);
            }
            None => assert!(lanes.iter().any(|&l| l >= 2), "only lanes {lanes:?} joined an uncapped load"),
        }
    }
}

/// Staging set up by `prepare_staging` before a load is what the load uses: the load sets up nothing and waits for
/// no lane, and every byte arrives; asked again, the lanes find their staging fitting and set up nothing; after
/// `release_staging` they set it up again.
#[test]
fn staging_prepared_before_a_load_is_what_the_load_uses() {
    let dir = tempfile::tempdir().unwrap();
    let len = 40usize << 20;
    let path = write(dir.path(), "prepared.bin", len, 11);
    let expected = pattern(len, 11);
    let params = IoParams { threads: 4, chunk_bytes: 1 << 20, direct: DirectMode::Never, ..IoParams::default() };
    let io = engine(&params);
    let p = io.prepare_staging(false, None, None).unwrap();
    assert_eq!((p.lanes, p.lanes_set_up, p.slot_bytes, p.slots_per_lane, p.pinned), (4, 4, 1 << 20, 1, false));
    assert!(p.setup_thread_secs > 0.0 && p.seconds > 0.0, "{p:?}");

    let files = open_all(std::slice::from_ref(&path), false).unwrap();
    let mut out = vec![0u8; len];
    let extents = [Extent { file: 0, offset: 0, len: len as u64, dest: 0, dest_offset: 0 }];
    // SAFETY: `out` outlives the load (waited below) and nothing else touches it meanwhile.
    let inner = unsafe { HostSink::new(vec![(out.as_mut_ptr(), out.len())]) };
    // Not in place: every read goes through a lane's staging.
    let sink = std::sync::Arc::new(LaneSink { inner, lanes: Mutex::new(Vec::new()) });
    let req = LoadRequest { files: &files, extents: &extents, dest_lens: &[len as u64] };
    let report = io.load(&req, &LoadOptions::default(), &*sink).unwrap();
    assert!(out == expected, "bytes differ");
    assert!(sink.lanes.lock().unwrap().len() > 1, "one lane read everything");
    assert_eq!((report.stats.setup, report.stats.setup_wait), Default::default(), "{report:?}");

    let again = io.prepare_staging(false, None, None).unwrap();
    assert_eq!((again.lanes, again.lanes_set_up), (4, 0), "{again:?}");
    io.release_staging();
    let after = io.prepare_staging(false, None, None).unwrap();
    assert_eq!((after.lanes, after.lanes_set_up), (4, 4), "{after:?}");
}

/// Delivers through a host sink once `open` is set (holding its lane busy until then).
struct HeldSink {
    inner: HostSink,
    open: AtomicBool,
}

impl Sink for HeldSink {
    fn deliver(&self, lane: usize, pieces: &[Piece], data: &[u8]) -> Result<Option<Box<dyn Pending>>, SinkError> {
        while !self.open.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.inner.deliver(lane, pieces, data)
    }
}

/// A set-up request waits for lanes busy with a load; asked to stop, it returns `Cancelled` at once (the load goes
/// on, every byte arrives); asked again after the load, it completes.
#[test]
fn a_staging_request_waiting_for_busy_lanes_can_be_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let len = 8usize << 20;
    let path = write(dir.path(), "held.bin", len, 12);
    let params = IoParams { threads: 2, chunk_bytes: 1 << 20, direct: DirectMode::Never, ..IoParams::default() };
    let io = engine(&params);
    let files = open_all(std::slice::from_ref(&path), false).unwrap();
    let mut out = vec![0u8; len];
    let extents = [Extent { file: 0, offset: 0, len: len as u64, dest: 0, dest_offset: 0 }];
    // SAFETY: `out` outlives the load (waited below) and nothing else touches it meanwhile.
    let inner = unsafe { HostSink::new(vec![(out.as_mut_ptr(), out.len())]) };
    let sink = std::sync::Arc::new(HeldSink { inner, open: AtomicBool::new(false) });
    let req = LoadRequest { files: &files, extents: &extents, dest_lens: &[len as u64] };
    let running = io.start(&req, weightlift_io::StreamOptions::default(), sink.clone()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50)); // the lanes take their first reads and hold
    let cancel = AtomicBool::new(true);
    let t = std::time::Instant::now();
    let refused = io.prepare_staging(false, None, Some(&cancel));
    assert!(matches!(refused, Err(IoError::Cancelled)), "{refused:?}");
    assert!(t.elapsed() < std::time::Duration::from_secs(2), "cancelling took {:?}", t.elapsed());
    sink.open.store(true, Ordering::Release);
    running.wait().unwrap();
    assert!(out == pattern(len, 12), "bytes differ");
    let p = io.prepare_staging(false, None, None).unwrap();
    assert_eq!(p.lanes, 2, "{p:?}");
}

/// Pins nothing; counts the regions it was asked to pin.
#[derive(Debug, Default)]
struct CountingPinner(AtomicU64);

#[derive(Debug)]
struct NoPin;
impl weightlift_io::PinGuard for NoPin {}

impl weightlift_io::Pinner for CountingPinner {
    unsafe fn pin(&self, _ptr: *mut u8, _len: usize) -> Result<Box<dyn weightlift_io::PinGuard>, SinkError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(NoPin))
    }
}

/// Staging of a device load's shape faulted in without a pinner (no device needed) is then pinned where it is by a
/// request with one: each lane pins its region once, and a third request finds everything set up.
#[test]
fn device_staging_faulted_in_first_is_pinned_in_place() {
    let io = engine(&IoParams { threads: 3, chunk_bytes: 1 << 20, ..IoParams::default() });
    let host = io.prepare_staging(true, None, None).unwrap();
    assert_eq!((host.lanes, host.lanes_set_up, host.slots_per_lane, host.pinned), (3, 3, 2, false), "{host:?}");
    let pinner = std::sync::Arc::new(CountingPinner::default());
    let pinned = io.prepare_staging(true, Some(pinner.clone()), None).unwrap();
    assert_eq!((pinned.lanes, pinned.lanes_set_up, pinned.slots_per_lane, pinned.pinned), (3, 3, 2, true));
    assert_eq!(pinner.0.load(Ordering::Relaxed), 3, "one pin per lane's region");
    let again = io.prepare_staging(true, Some(pinner.clone()), None).unwrap();
    assert_eq!(again.lanes_set_up, 0, "{again:?}");
    assert_eq!(pinner.0.load(Ordering::Relaxed), 3);
}

/// Bytes of `path` that a fresh mapping of it maps with 2 MiB page-table entries once populated: the bytes the
/// page cache holds in 2 MiB folios (only those can be mapped that way). None where the kernel does not say. With
/// `huge`, the mapping is advised `MADV_HUGEPAGE` before it is populated (what is not cached yet is then read in
/// 2 MiB folios, where the kernel and filesystem have them).
fn bytes_in_2mib_folios(path: &Path, huge: bool) -> Option<u64> {
    use std::os::fd::AsRawFd;
    const HUGE: usize = 2 << 20;
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    // SAFETY: an anonymous reservation, then the file mapped read-only at a 2 MiB boundary inside it (MAP_FIXED
    // over our own reservation); only the kernel reads the mapping (MADV_POPULATE_READ); both are unmapped here.
    unsafe {
        let span = len + HUGE;
        let r = libc::mmap(std::ptr::null_mut(), span, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
        assert_ne!(r, libc::MAP_FAILED);
        let at = (r as usize).next_multiple_of(HUGE) as *mut libc::c_void;
        let m = libc::mmap(at, len, libc::PROT_READ, libc::MAP_SHARED | libc::MAP_FIXED, f.as_raw_fd(), 0);
        assert_eq!(m, at);
        if huge {
            libc::madvise(m, len, libc::MADV_HUGEPAGE);
        }
        let populated = libc::madvise(m, len, libc::MADV_POPULATE_READ) == 0;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
        libc::munmap(r, span);
        if !populated {
            return None;
        }
        let head = format!("{:x}-", at as usize);
        let entry = smaps.split_once(&format!("\n{head}")).map(|(_, rest)| rest)?;
        let line = entry.lines().find(|l| l.starts_with("FilePmdMapped:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib << 10)
    }
}

/// Drops the file's pages from the page cache (its own pages only: no root needed).
fn evict(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    f.sync_all().unwrap(); // dirty pages are not dropped
    // SAFETY: a valid descriptor; the call only advises the kernel.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
}

/// `cache_pages = huge` (the default): a cold load that keeps the file in the page cache leaves it in 2 MiB
/// folios, which the next reader (a new process) reads faster than the 4 KiB folios the lanes' scattered reads
/// leave otherwise.
#[test]
fn cold_ranges_kept_in_the_page_cache_land_in_2_mib_folios() {
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: `statfs` is plain data, for which all zeroes is a valid value.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    let c = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and a struct the kernel fills.
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut fs) }, 0);
    if fs.f_type == libc::TMPFS_MAGIC {
        eprintln!("skipped: the temporary directory is on tmpfs, whose pages are never cold");
        return;
    }
    // Whether this kernel and filesystem cache a file in 2 MiB folios at all, asked without the engine.
    let probe = write(dir.path(), "probe.bin", 8 << 20, 3);
    evict(&probe);
    if bytes_in_2mib_folios(&probe, true).unwrap_or(0) == 0 {
        eprintln!("skipped: this kernel or filesystem does not cache files in 2 MiB folios (or does not say so)");
        return;
    }
    let len = (64 << 20) + 12_345;
    let whole_folios = (len as u64) >> 21 << 21;
    let path = write(dir.path(), "cold.bin", len, 17);
    let extents = [Extent { file: 0, offset: 0, len: len as u64, dest: 0, dest_offset: 0 }];
    for pages in [weightlift_io::CachePages::Base, weightlift_io::CachePages::Huge] {
        evict(&path);
        let params =
            IoParams { threads: 8, cache: weightlift_io::CachePolicy::Keep, cache_pages: pages, ..IoParams::default() };
        let (bufs, report) = load_into_host(std::slice::from_ref(&path), &extents, &params, None).unwrap();
        check_bytes(std::slice::from_ref(&path), &extents, &bufs);
        assert_eq!(report.cache_pages, pages);
        let huge = bytes_in_2mib_folios(&path, false).expect("FilePmdMapped, reported for the probe");
        eprintln!("cache_pages={pages}: {huge} of {len} bytes in 2 MiB folios");
        match pages {
            weightlift_io::CachePages::Base => assert_eq!(report.stats.populated_bytes, 0),
            weightlift_io::CachePages::Huge => {
                assert_eq!(report.populate_refusal, None);
                assert_eq!(report.stats.populated_bytes, len as u64, "every cold byte populated first");
                // The kernel falls back to smaller folios where a 2 MiB allocation fails at once (it does not
                // compact memory for readahead); under the other tests' load a few do. Plain reads leave 0-16 MiB.
                assert!(huge >= whole_folios / 4 * 3, "{huge} of {whole_folios} bytes in 2 MiB folios");
            }
        }
    }
}

/// A file cut short after it was opened, loaded cold with `cache_pages = huge`: the mapping the lanes populate
/// through reaches past the new end, which the advice reports as an error (a read through it would be SIGBUS);
/// the load fails naming the file, the process lives on.
#[test]
fn a_file_cut_short_under_a_cold_huge_page_load_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let len = 24 << 20;
    let path = write(dir.path(), "cut.bin", len, 23);
    let params = IoParams {
        threads: 4,
        cache: weightlift_io::CachePolicy::Keep,
        cache_pages: weightlift_io::CachePages::Huge,
        ..IoParams::default()
    };
    let engine = engine(&params);
    let files = open_all(std::slice::from_ref(&path), true).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(5 << 20).unwrap();
    evict(&path);
    let extents = [Extent { file: 0, offset: 0, len: len as u64, dest: 0, dest_offset: 0 }];
    let dest_lens = [len as u64];
    let mut bufs = vec![HostBuffer::new(len, None).unwrap()];
    let result = {
        let sink = HostSink::borrowing(&mut bufs);
        let req = LoadRequest { files: &files, extents: &extents, dest_lens: &dest_lens };
        engine.load(&req, &LoadOptions::default(), &*sink)
    };
    let err = result.expect_err("a load past the end of the file must fail");
    assert!(err.to_string().contains("cut.bin"), "{err}");
}
