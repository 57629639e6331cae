//! The cuFile-style API with host buffers (the variant every machine can run): reads and writes with buffer
//! offsets, short counts at the end of the file, batches, vectored and asynchronous I/O, and each documented error.

use std::path::Path;

use weightlift::cufile_api::{BatchEntry, FileMode, Op, Session};
use weightlift::io::HostBuffer;
use weightlift::{Device, Error, Settings};

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8 | 1).collect()
}

fn session() -> std::sync::Arc<Session> {
    std::sync::Arc::new(Session::open(Settings::default(), false).unwrap())
}

fn buf(len: usize) -> HostBuffer {
    HostBuffer::new(len, None).unwrap()
}

fn register(s: &Session, b: &mut HostBuffer) -> u64 {
    let base = b.as_mut_ptr() as u64;
    // SAFETY: the buffers outlive the session in every test (declared before it or dropped after use).
    unsafe { s.buf_register(base, b.len() as u64, Device::Cpu) }.unwrap();
    base
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn reads_with_offsets_and_short_counts() {
    let dir = tempfile::tempdir().unwrap();
    let content = data(100_003);
    let path = write_file(dir.path(), "f", &content);
    let mut b = buf(70_000);
    let s = session();
    let fh = s.handle_register(&path, FileMode::parse("r").unwrap()).unwrap();
    let base = register(&s, &mut b);
    assert_eq!(s.read(fh, base, 60_000, 1234, 5000).unwrap(), 60_000);
    assert!(b[5000..65_000] == content[1234..61_234]);
    // At the end of the file: what is there, as pread.
    assert_eq!(s.read(fh, base, 10_000, 95_000, 0).unwrap(), 5003);
    assert!(b[..5003] == content[95_000..]);
    assert_eq!(s.read(fh, base, 10, 200_000, 0).unwrap(), 0);
    // Unregistered memory through pread.
    let mut other = buf(100);
    // SAFETY: `other` is live and unaliased during the call.
    assert_eq!(unsafe { s.pread(fh, other.as_mut_ptr() as u64, 100, 7, Device::Cpu) }.unwrap(), 100);
    assert!(other[..] == content[7..107]);
}

#[test]
fn writes_batches_and_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out");
    let content = data(20_000);
    let mut a = buf(8_000);
    let mut b = buf(12_000);
    a.copy_from_slice(&content[..8_000]);
    b.copy_from_slice(&content[8_000..]);
    let s = session();
    let fh = s.handle_register(&path, FileMode::parse("w+").unwrap()).unwrap();
    let (pa, pb) = (register(&s, &mut a), register(&s, &mut b));
    assert_eq!(s.writev(fh, 0, &[(pa, 8_000), (pb, 12_000)]).unwrap(), 20_000);
    assert!(std::fs::read(&path).unwrap() == content);
    assert_eq!(s.write(fh, pb, 100, 50_000, 11_900).unwrap(), 100);
    let back = std::fs::read(&path).unwrap();
    assert_eq!(back.len(), 50_100);
    assert!(back[50_000..] == content[19_900..]);
    // Read back into the buffers through a batch, one entry failing on its own.
    a.fill(0);
    b.fill(0);
    let results = s.batch(&[
        BatchEntry { op: Op::Read, fh, base: pa, size: 8_000, file_offset: 0, buf_offset: 0 },
        BatchEntry { op: Op::Read, fh, base: pb, size: 12_000, file_offset: 8_000, buf_offset: 0 },
        BatchEntry { op: Op::Read, fh, base: pb, size: 12_001, file_offset: 0, buf_offset: 0 },
    ]);
    assert_eq!(results[0].as_ref().unwrap(), &8_000);
    assert_eq!(results[1].as_ref().unwrap(), &12_000);
    assert!(matches!(results[2], Err(Error::InvalidArgument(_))));
    assert!(a[..] == content[..8_000] && b[..] == content[8_000..]);
    a.fill(0);
    b.fill(0);
    assert_eq!(s.readv(fh, 0, &[(pa, 8_000), (pb, 12_000)]).unwrap(), 20_000);
    assert!(a[..] == content[..8_000] && b[..] == content[8_000..]);
}

#[test]
fn async_io_reports_its_byte_count() {
    let dir = tempfile::tempdir().unwrap();
    let content = data(50_000);
    let path = write_file(dir.path(), "a", &content);
    let mut b = buf(50_000);
    let s = session();
    let fh = s.handle_register(&path, FileMode::parse("r").unwrap()).unwrap();
    let base = register(&s, &mut b);
    // SAFETY: no stream is given.
    let mut io = unsafe { s.submit_async(Op::Read, fh, base, 50_000, 0, 0, None) }.unwrap();
    assert_eq!(io.wait().unwrap(), 50_000);
    assert!(b[..] == content[..]);
    assert!(matches!(io.wait(), Err(Error::InvalidArgument(_))), "a result is taken once");
}

#[test]
fn each_misuse_is_its_own_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "e", &data(10_000));
    let mut b = buf(4096);
    let s = session();
    let fh = s.handle_register(&path, FileMode::parse("r").unwrap()).unwrap();
    let unregistered = b.as_mut_ptr() as u64;
    let e = s.read(fh, unregistered, 10, 0, 0).unwrap_err();
    assert!(e.to_string().contains("not registered"), "{e}");
    let base = register(&s, &mut b);
    let e = s.read(fh, base, 4000, 0, 100).unwrap_err();
    assert!(e.to_string().contains("past the end"), "{e}");
    let e = s.write(fh, base, 10, 0, 0).unwrap_err();
    assert!(matches!(&e, Error::Io(io) if io.io_kind() == Some(std::io::ErrorKind::PermissionDenied)), "{e}");
    let e = s.read(999, base, 10, 0, 0).unwrap_err();
    assert!(e.to_string().contains("file handle 999"), "{e}");
    if let Ok(direct) = s.handle_register(&path, FileMode::parse("rd").unwrap()) {
        let e = s.read(direct, base, 100, 3, 0).unwrap_err();
        assert!(e.to_string().contains("misaligned O_DIRECT"), "{e}");
        assert_eq!(s.read(direct, base, 4096, 4096, 0).unwrap(), 4096);
    }
    assert!(matches!(s.handle_register(&dir.path().join("missing"), FileMode::parse("r").unwrap()), Err(Error::Io(_))));
    assert!(FileMode::parse("x").is_err());
    s.close();
    assert!(s.read(fh, base, 10, 0, 0).is_err(), "a closed session refuses work");
}

#[test]
fn asking_for_cufile_without_it_is_an_error() {
    match Session::open(Settings::default(), true) {
        Ok(s) => eprintln!("cuFile present here: {}", s.backend()),
        Err(e) => {
            assert!(matches!(e, Error::Cuda(_)), "{e}");
            assert!(e.to_string().contains("cuFile requested but unavailable"), "{e}");
        }
    }
}
