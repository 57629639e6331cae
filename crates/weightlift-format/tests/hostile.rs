//! Every hostile file gives its own specific error, never a panic, and never an allocation sized by an
//! unvalidated number from the file.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use weightlift_format::{DType, ErrorKind, RawSpec, corpus};

/// Records the largest single allocation made while `TRACKING` is set.
struct Tracking;

static LARGEST: AtomicUsize = AtomicUsize::new(0);
static TRACKING: AtomicUsize = AtomicUsize::new(0);
static SERIAL: Mutex<()> = Mutex::new(());

// SAFETY: every method forwards to the system allocator unchanged; the bookkeeping only touches atomics.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if TRACKING.load(Ordering::Relaxed) != 0 {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        }
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with this layout (every allocation goes through `alloc` above).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if TRACKING.load(Ordering::Relaxed) != 0 {
            LARGEST.fetch_max(new_size, Ordering::Relaxed);
        }
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
        let result = weightlift_format::open(std::slice::from_ref(&path), None);
        TRACKING.store(0, Ordering::Relaxed);
        let err = match result {
            Ok(index) => panic!("{}: parsed without error: {index:?}", case.name),
            Err(e) => e,
        };
        assert_eq!(variant(&err.kind), case.expect, "{}: got {err}", case.name);
        let message = err.to_string();
        assert!(!message.contains('\n'), "{}: message spans lines: {message}", case.name);
        assert!(message.contains(&*sub.to_string_lossy()), "{}: message does not name the file: {message}", case.name);
        // The parser's own buffers (a 64 KiB read buffer, error strings, the header it was allowed to read) stay
        // within the file's size plus a constant; an absurd count from the file would blow far past this.
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(largest <= total + (1 << 17), "{}: allocated {largest} bytes for a {total}-byte input", case.name);
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
