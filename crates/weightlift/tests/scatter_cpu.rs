//! `Engine::read_ranges_into` into host memory: many ranges of two files (adjacent, with gaps, unaligned,
//! tiny and chunk-spanning) land at their destination offsets byte for byte, bytes between them stay untouched,
//! and bad ranges and injected read errors are errors, in every O_DIRECT mode and backend.

use std::path::PathBuf;

use weightlift::format::synth;
use weightlift::io::DirectMode;
use weightlift::io::fault::{Fault, FaultPlan};
use weightlift::{Backend, ByteRange, Dests, Engine, Error, LoadOpts, RawDest, ReadRequest, Settings, Sources};

const SENTINEL: u8 = 0xA5;

/// `(file, offset, len, dest_offset)`.
type Range = (usize, u64, u64, u64);

/// `Engine::read` of ranges `(file, offset, len, dest_offset)` of `paths` into `cap` bytes at `dest`.
///
/// # Safety
/// `dest` valid for writes of `cap` bytes, untouched by anything else until this returns.
unsafe fn read_ranges(
    engine: &Engine,
    paths: &[PathBuf],
    rs: &[Range],
    dest: RawDest,
    cap: u64,
    opts: &LoadOpts<'_>,
) -> weightlift::Result<weightlift::Report> {
    let ranges: Vec<ByteRange> = rs.iter().map(|&(f, o, l, d)| ByteRange::new(f, o, l, d)).collect();
    let dests = [(dest, cap)];
    let req = ReadRequest::new(Sources::Paths(paths), &ranges, Dests::Memory(&dests)).with_opts(*opts);
    // SAFETY: the caller's contract.
    unsafe { engine.read(&req) }
}

fn write(dir: &std::path::Path, name: &str, seed: u64, len: usize) -> (PathBuf, Vec<u8>) {
    let mut bytes = vec![0u8; len];
    synth::tensor_bytes(seed, 0, 0, &mut bytes);
    let path = dir.join(name);
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

/// Ranges `(file, offset, len, dest_offset)`, packed into the destination with gaps, and the destination's size.
fn ranges(b_len: u64) -> (Vec<Range>, u64) {
    let picks: [(usize, u64, u64); 9] = [
        (0, 0, 100),
        (0, 100, 4096),       // adjacent to the previous one
        (0, 5000, 1),         // one byte, unaligned
        (1, 4096, 8192),      // aligned
        (1, 333, 3000),       // before the previous range in the file: ranges need not be sorted
        (0, 70_000, 900_000), // spans several chunks
        (1, b_len - 17, 17),  // the file's last bytes
        (0, 6000, 0),         // empty
        (1, 20_000, 123_457),
    ];
    let mut out = Vec::new();
    let mut dest = 3u64;
    for (file, offset, len) in picks {
        out.push((file, offset, len, dest));
        dest += len + 11;
    }
    (out, dest + 5)
}

#[test]
fn ranges_land_at_their_offsets_and_nothing_else_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (a, abytes) = write(dir.path(), "a.bin", 1, 1_500_000);
    let (b, bbytes) = write(dir.path(), "b.bin", 2, 300_001);
    let (rs, cap) = ranges(bbytes.len() as u64);
    let paths = vec![a, b];
    for (direct, backend) in
        [(DirectMode::Auto, Backend::Auto), (DirectMode::Always, Backend::Uring), (DirectMode::Never, Backend::Pread)]
    {
        if backend == Backend::Uring && weightlift::io::uring_available().is_err() {
            println!("io_uring unavailable here: the uring case is skipped");
            continue;
        }
        let config = Settings::default().direct(direct).backend(backend).chunk_bytes(256 << 10).staging_bytes(4 << 20);
        let engine = Engine::new(config).unwrap();
        let mut dest = vec![SENTINEL; cap as usize];
        // SAFETY: `dest` is a live, exclusively borrowed buffer of `cap` bytes for the whole call.
        let report =
            unsafe { read_ranges(&engine, &paths, &rs, RawDest::Host(dest.as_mut_ptr()), cap, &LoadOpts::default()) }
                .unwrap();
        let mut want = vec![SENTINEL; cap as usize];
        for &(file, offset, len, at) in &rs {
            let src = if file == 0 { &abytes } else { &bbytes };
            want[at as usize..(at + len) as usize].copy_from_slice(&src[offset as usize..(offset + len) as usize]);
        }
        assert!(dest == want, "{direct:?}/{backend:?}: destination differs from the files");
        assert_eq!(report.bytes, rs.iter().map(|r| r.2).sum::<u64>());
        assert!(report.io.direct_bytes + report.io.buffered_bytes >= report.bytes);
    }
}

#[test]
fn bad_ranges_and_read_errors_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (a, abytes) = write(dir.path(), "a.bin", 3, 200_000);
    let paths = vec![a];
    let engine = Engine::new(Settings::default()).unwrap();
    let mut dest = vec![0u8; 100_000];
    let ptr = RawDest::Host(dest.as_mut_ptr());
    let len = abytes.len() as u64;
    let cases: [(&[Range], &str); 3] = [
        (&[(0, len - 10, 11, 0)], "past the end"),
        (&[(0, 0, 10, 99_995)], "past the destination"),
        (&[(1, 0, 10, 0)], "no such file"),
    ];
    for (rs, what) in cases {
        // SAFETY: `dest` is live and exclusively borrowed for the call; it holds 100 000 bytes.
        let err = unsafe { read_ranges(&engine, &paths, rs, ptr, 100_000, &LoadOpts::default()) }.unwrap_err();
        match (what, &err) {
            ("past the end", Error::Io(_)) | ("past the destination", Error::InvalidArgument(_)) => {}
            ("no such file", Error::InvalidArgument(_)) => {}
            _ => panic!("{what}: unexpected error {err:?}"),
        }
    }
    let faults = FaultPlan::new(vec![Fault::Eio { file: 0, offset: 150_000 }]);
    let opts = LoadOpts { faults: Some(&faults), ..LoadOpts::default() };
    // SAFETY: as above.
    let err = unsafe { read_ranges(&engine, &paths, &[(0, 120_000, 60_000, 0)], ptr, 100_000, &opts) };
    let msg = err.unwrap_err().to_string();
    assert!(msg.contains("a.bin") && msg.contains("Input/output error"), "{msg}");
    // A range the fault does not cover still reads.
    // SAFETY: as above.
    unsafe { read_ranges(&engine, &paths, &[(0, 0, 1000, 0)], ptr, 100_000, &opts) }.unwrap();
    assert!(dest[..1000] == abytes[..1000]);
}
