//! Every hostile file gives its own specific error, never a panic, never an allocation sized by an unvalidated
//! number from the file, and never memory beyond a small multiple of the file's size.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

use weightlift_format::{DType, ErrorKind, RawSpec, corpus};

/// Records the largest single allocation made while `TRACKING` is set, and the live heap bytes at all times.
struct Tracking;

static LARGEST: AtomicUsize = AtomicUsize::new(0);
static TRACKING: AtomicUsize = AtomicUsize::new(0);
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);
static SERIAL: Mutex<()> = Mutex::new(());

fn grew(by: isize) {
    let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

/// Runs `f` and returns its result with the most heap it held at once beyond what was live before (other tests'
/// allocations meanwhile count too: callers hold `SERIAL` and allow some slack).
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    (out, (PEAK.load(Ordering::Relaxed) - base).max(0) as usize)
}

// SAFETY: every method forwards to the system allocator unchanged; the bookkeeping only touches atomics.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if TRACKING.load(Ordering::Relaxed) != 0 {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        }
        grew(layout.size() as isize);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with this layout (every allocation goes through `alloc` above).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if TRACKING.load(Ordering::Relaxed) != 0 {
            LARGEST.fetch_max(new_size, Ordering::Relaxed);
        }
        grew(new_size as isize - layout.size() as isize);
        // SAFETY: forwarded with the caller's guarantees for `GlobalAlloc::realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

fn variant(kind: &ErrorKind) -> String {
    let debug = format!("{kind:?}");
    debug.split(|c: char| !c.is_alphanumeric()).next().unwrap_or_default().to_string()
}

#[test]
fn every_hostile_file_gives_its_specific_error() {
    let _serial = SERIAL.lock().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cases = corpus::hostile();
    assert!(cases.len() >= 40, "the corpus shrank: {}", cases.len());
    for case in cases {
        let sub = dir.path().join(case.name.replace(' ', "_"));
        std::fs::create_dir(&sub).unwrap();
        let mut total = 0usize;
        for (name, bytes) in &case.files {
            std::fs::write(sub.join(name), bytes).unwrap();
            total += bytes.len();
        }
        let path = sub.join(&case.files[0].0);
        LARGEST.store(0, Ordering::Relaxed);
        TRACKING.store(1, Ordering::Relaxed);
        let (result, peak) = peak_of(|| weightlift_format::open(std::slice::from_ref(&path), None));
        TRACKING.store(0, Ordering::Relaxed);
        let err = match result {
            Ok(index) => panic!("{}: parsed without error: {index:?}", case.name),
            Err(e) => e,
        };
        // The rule for every command on a hostile file: memory bounded by a small multiple of the file.
        assert!(peak <= 4 * total + (1 << 18), "{}: held {peak} bytes at once for a {total}-byte input", case.name);
        assert_eq!(variant(&err.kind), case.expect, "{}: got {err}", case.name);
        let message = err.to_string();
        assert!(!message.contains('\n'), "{}: message spans lines: {message}", case.name);
        assert!(message.contains(&*sub.to_string_lossy()), "{}: message does not name the file: {message}", case.name);
        // The parser's own buffers (a 64 KiB read buffer, error strings, the header it was allowed to read) stay
        // within a small multiple of the file's size plus a constant (a GGUF array of 8-byte empty strings is a
        // vector of 24-byte `String`s); an absurd count from the file would blow far past this.
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(largest <= 3 * total + (1 << 17), "{}: allocated {largest} bytes for a {total}-byte input", case.name);
    }
}

#[test]
fn raw_file_too_short_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.bin");
    std::fs::write(&path, [1u8; 10]).unwrap();
    let spec = RawSpec { dtype: DType::F32, count: Some(3) };
    let err = weightlift_format::raw::read(&path, spec).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::RawTooShort { need: 12, have: 10, .. }), "{err}");
    let whole = RawSpec { dtype: DType::F32, count: None };
    let err = weightlift_format::raw::read(&path, whole).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::RawInvalid { .. }), "{err}");
    let ok = weightlift_format::raw::read(&path, RawSpec { dtype: DType::U16, count: None }).unwrap();
    assert_eq!(ok.tensors[0].shape, vec![5]);
    assert_eq!(ok.tensors[0].nbytes, 10);
}

#[test]
fn missing_file_and_directory_are_open_errors() {
    let dir = tempfile::tempdir().unwrap();
    for path in [dir.path().join("nope.safetensors"), dir.path().to_path_buf()] {
        let err = weightlift_format::open(std::slice::from_ref(&path), None).unwrap_err();
        assert!(matches!(err.kind, ErrorKind::Open(_)), "{err}");
    }
}

#[test]
fn valid_gguf_seed_parses() {
    let _serial = SERIAL.lock().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.gguf");
    std::fs::write(&path, corpus::valid_gguf()).unwrap();
    let index = weightlift_format::gguf::read(&path).unwrap();
    assert_eq!(index.tensors.len(), 2);
    assert_eq!(index.get("w").unwrap().nbytes, 2 * 2 * 18);
}

#[test]
fn every_hostile_pack_gives_its_specific_error() {
    let _serial = SERIAL.lock().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let valid = dir.path().join("valid.wlpack");
    std::fs::write(&valid, corpus::valid_pack()).unwrap();
    let index = weightlift_format::wlpack::read(&valid).unwrap();
    assert_eq!((index.items.len(), index.chunks.len(), index.streams.len()), (2, 2, 3));
    let cases = corpus::hostile_packs();
    assert!(cases.len() >= 30, "the pack corpus shrank: {}", cases.len());
    for case in cases {
        let path = dir.path().join(case.name.replace(' ', "_"));
        let bytes = &case.files[0].1;
        std::fs::write(&path, bytes).unwrap();
        LARGEST.store(0, Ordering::Relaxed);
        TRACKING.store(1, Ordering::Relaxed);
        let result = weightlift_format::wlpack::read(&path);
        TRACKING.store(0, Ordering::Relaxed);
        let err = match result {
            Ok(index) => panic!("{}: read without error: {index:?}", case.name),
            Err(e) => e,
        };
        assert_eq!(variant(&err.kind), case.expect, "{}: got {err}", case.name);
        let message = err.to_string();
        assert!(!message.contains('\n'), "{}: message spans lines: {message}", case.name);
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(
            largest <= bytes.len() + (1 << 17),
            "{}: allocated {largest} bytes for {} bytes",
            case.name,
            bytes.len()
        );
    }
}

/// Opens `path` as a checkpoint on another thread: a reader that blocks (a FIFO without a writer) fails the test
/// after a few seconds instead of hanging it.
fn open_within_seconds(path: &std::path::Path, raw: Option<RawSpec>) -> weightlift_format::FormatError {
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(weightlift_format::open(std::slice::from_ref(&owned), raw));
    });
    match rx.recv_timeout(std::time::Duration::from_secs(5)) {
        Ok(Ok(index)) => panic!("{}: parsed as a checkpoint: {index:?}", path.display()),
        Ok(Err(e)) => e,
        Err(_) => panic!("{}: opening it blocked for 5 s", path.display()),
    }
}

#[test]
fn fifos_sockets_and_devices_are_refused_without_blocking() {
    use weightlift_format::regular::NodeKind;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.safetensors");
    let status = std::process::Command::new("mkfifo").arg(&fifo).status().expect("run mkfifo");
    assert!(status.success());
    let sock = dir.path().join("model.gguf");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let raw = Some(RawSpec { dtype: DType::U8, count: None });
    let cases = [
        (fifo.clone(), None, NodeKind::Fifo),
        (fifo.clone(), raw, NodeKind::Fifo),
        (dir.path().join("model.gguf"), None, NodeKind::Socket),
        ("/dev/null".into(), None, NodeKind::CharDevice),
        ("/dev/zero".into(), raw, NodeKind::CharDevice),
    ];
    for (path, raw, expected) in cases {
        let err = open_within_seconds(&path, raw);
        assert!(matches!(err.kind, ErrorKind::NotAFile { node } if node == expected), "{}: {err}", path.display());
        let message = err.to_string();
        assert!(message.contains(&*path.to_string_lossy()) && message.contains("not a regular file"), "{message}");
    }
    // A FIFO without an extension goes through format detection, which reads the first bytes: refused all the same.
    let bare = dir.path().join("checkpoint");
    assert!(std::process::Command::new("mkfifo").arg(&bare).status().unwrap().success());
    assert!(matches!(open_within_seconds(&bare, None).kind, ErrorKind::NotAFile { node: NodeKind::Fifo }));
    let err = open_within_seconds(dir.path(), None);
    assert!(matches!(&err.kind, ErrorKind::Open(e) if e.kind() == std::io::ErrorKind::IsADirectory), "{err}");
}

/// A shard index listing 200,000 tensors of one shard (plus one it lacks): read in about the time of the shard
/// itself, not in time quadratic in the entries (which took minutes).
#[test]
fn a_shard_index_of_200k_tensors_is_read_in_linear_time() {
    let _serial = SERIAL.lock().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let case = corpus::wide_shard_index();
    for (name, bytes) in &case.files {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let shard = dir.path().join("s.safetensors");
    let t0 = std::time::Instant::now();
    let alone = weightlift_format::open(std::slice::from_ref(&shard), None).unwrap();
    let shard_secs = t0.elapsed().as_secs_f64();
    assert_eq!(alone.tensors.len(), corpus::WIDE_SHARD_TENSORS);
    let t0 = std::time::Instant::now();
    let err = weightlift_format::open(&[dir.path().join(&case.files[0].0)], None).unwrap_err();
    let index_secs = t0.elapsed().as_secs_f64();
    assert_eq!(variant(&err.kind), case.expect, "{err}");
    assert!(err.to_string().contains("zz.missing"), "{err}");
    assert!(index_secs < 5.0 * shard_secs + 2.0, "the index took {index_secs:.2} s, its shard alone {shard_secs:.2} s");
}

/// A valid 16 MiB GGUF file whose metadata is one array of 16 M `uint8`: parsed into about 16 MiB, and shown
/// (by default) as a summary of a few elements.
#[test]
fn a_long_metadata_array_costs_about_its_size() {
    use weightlift_format::Metadata;
    use weightlift_format::gguf::{self, GgufArray, GgufValue};
    let _serial = SERIAL.lock().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.gguf");
    let n = 16usize << 20;
    let kv = vec![("big".to_string(), GgufValue::Array(GgufArray::U8(vec![7; n])))];
    let lay = gguf::layout(&kv, &[]).unwrap();
    drop(kv);
    std::fs::write(&path, &lay.header).unwrap();
    let file_len = lay.header.len();
    drop(lay);
    let (index, peak) = peak_of(|| weightlift_format::open(std::slice::from_ref(&path), None).unwrap());
    assert!(peak <= file_len + file_len / 4 + (1 << 20), "held {peak} bytes at once for a {file_len}-byte file");
    let Metadata::Gguf(kv) = &index.files[0].metadata else { panic!("not GGUF metadata") };
    let GgufValue::Array(GgufArray::U8(v)) = &kv[0].1 else { panic!("{:?}", kv[0].1.type_name()) };
    assert_eq!(v.len(), n);
    let summary = kv[0].1.to_json_summary(8);
    assert_eq!(summary["len"], n);
    assert_eq!(summary["type"], "uint8");
    assert_eq!(summary["head"].as_array().unwrap().len(), 8);
    assert_eq!(GgufValue::Array(GgufArray::U8(vec![1, 2])).to_json_summary(8), serde_json::json!([1, 2]));
}
