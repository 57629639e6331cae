//! Writes: bytes from a source (host memory, or device memory copied out by the CUDA layer) go through staging
//! slots to the file with io_uring writes — O_DIRECT for block-aligned chunks where the filesystem allows, buffered
//! for the rest — several in flight, short writes resumed, then an optional fsync.

use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Instant;

use io_uring::{IoUring, opcode, squeue, types};

use crate::error::IoError;
use crate::file::{Access, OpenFile, Source, open_checked, same_file};
use crate::params::{DirectMode, IoParams, ReadEngine};
use crate::plan::ReadOp;
use crate::reading::{LaneStats, Next, Reading};
use crate::sink::SinkError;
use crate::staging::{Pinner, StagingPool};

/// Where the bytes to write come from.
pub trait WriteSource: Sync {
    /// Fills `buf` with the source's bytes starting at `offset` (relative to the start of the write).
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), SinkError>;
}

/// Host memory as a write source.
#[derive(Debug)]
pub struct HostSource<'a>(pub &'a [u8]);

impl WriteSource for HostSource<'_> {
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), SinkError> {
        let start = offset as usize;
        let src = self.0.get(start..start + buf.len()).ok_or("write source too short")?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// What a write did.
#[derive(Clone, Debug, Default)]
pub struct WriteReport {
    /// Bytes written.
    pub bytes: u64,
    /// Of those, bytes written with O_DIRECT.
    pub direct_bytes: u64,
    /// Of those, bytes written buffered (the unaligned head and tail, or all where O_DIRECT is refused).
    pub buffered_bytes: u64,
    /// Writes issued.
    pub ops: u64,
    /// The kernel interface: `uring` or `pwrite`.
    pub backend: &'static str,
    /// Wall time of the whole write, fsync included.
    pub seconds: f64,
    /// Of that, seconds in `fsync` (0 unless the request was durable).
    pub fsync_secs: f64,
}

/// Slots kept in flight by a write.
const WRITE_SLOTS: usize = 8;

/// Where to write: `len` bytes at `offset` of `path` (created if missing, never truncated), fsynced when `durable`.
#[derive(Clone, Copy, Debug)]
pub struct WriteRequest<'a> {
    /// The file to write.
    pub path: &'a Path,
    /// Where the bytes go in it.
    pub offset: u64,
    /// How many bytes to write.
    pub len: u64,
    /// Whether to fsync before returning.
    pub durable: bool,
    /// Injected faults (tests).
    pub faults: Option<&'a crate::fault::FaultPlan>,
}

/// Writes `req.len` bytes of `source` as `req` says.
pub fn write_at(
    params: &IoParams,
    req: &WriteRequest<'_>,
    source: &dyn WriteSource,
    pool: &mut StagingPool,
    pinner: Option<&dyn Pinner>,
) -> Result<WriteReport, IoError> {
    let WriteRequest { path, offset, len, durable, faults } = *req;
    // What pwrite(2) says of a range past the largest file offset, before anything is opened or copied.
    let end = offset.checked_add(len).filter(|&end| end <= i64::MAX as u64).ok_or_else(|| IoError::Write {
        path: path.to_path_buf(),
        offset,
        len,
        cause: rustix::io::Errno::INVAL.into(),
    })?;
    let t0 = Instant::now();
    let buffered = open_checked(path, Access::WRITE_CREATE)?;
    let want_direct = params.direct != DirectMode::Never;
    let direct = if want_direct {
        open_checked(path, Access { write: true, direct: true, ..Access::READ })
            .ok()
            .filter(|f| same_file(f, &buffered))
    } else {
        None
    };
    let block =
        direct.as_ref().map_or(4096, |_| crate::file::OpenFile::open(path, true).map(|f| f.block).unwrap_or(4096));
    let chunk = params.chunk_bytes.max(block).next_multiple_of(block);
    let mut report = WriteReport { bytes: len, ..WriteReport::default() };
    let target = OpenFile {
        path: path.to_path_buf(),
        source: Source::Local(buffered),
        direct,
        direct_refused: None,
        len: end,
        block,
        mem_align: block,
        copy: None,
    };
    if len > 0 {
        let slots = WRITE_SLOTS.min(len.div_ceil(chunk) as usize).max(1);
        let staging =
            pool.acquire(chunk as usize, slots, params.staging_bytes.max(chunk), pinner, params.staging_pages)?;
        let use_uring = params.engine != ReadEngine::Pread && crate::uring::available().is_ok();
        let w = Writer { target: &target, offset, len, chunk, source, faults };
        let mut stats = LaneStats::default();
        let ptrs: Vec<(*mut u8, usize)> = (0..slots).map(|i| staging.slot_ptr(i)).collect();
        if use_uring {
            report.backend = "uring";
            w.run_uring(&ptrs, &mut stats)?;
        } else {
            report.backend = "pwrite";
            w.run_pwrite(ptrs[0], &mut stats)?;
        }
        report.direct_bytes = stats.direct_bytes;
        report.buffered_bytes = stats.buffered_bytes;
        report.ops = stats.ops;
    }
    if durable {
        let t = Instant::now();
        if let Some(file) = target.local() {
            file.sync_all().map_err(|cause| IoError::Write { path: path.to_path_buf(), offset, len, cause })?;
        }
        report.fsync_secs = t.elapsed().as_secs_f64();
    }
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

struct Writer<'a> {
    target: &'a OpenFile,
    offset: u64,
    len: u64,
    chunk: u64,
    source: &'a dyn WriteSource,
    faults: Option<&'a crate::fault::FaultPlan>,
}

/// A chunk being written from a slot: its state machine and the op it writes (file offset, bytes, O_DIRECT).
struct InFlight {
    writing: Reading,
    op: ReadOp,
}

impl Writer<'_> {
    /// The op writing `n` bytes at position `pos` of the write: O_DIRECT when aligned and allowed.
    fn op(&self, pos: u64, n: u64) -> ReadOp {
        let at = self.offset + pos;
        let direct =
            self.target.direct.is_some() && at.is_multiple_of(self.target.block) && n.is_multiple_of(self.target.block);
        ReadOp { file: 0, offset: at, len: n, valid: n, direct, cold: false, pieces: 0..0 }
    }

    fn faulted(&self, offset: u64, len: u64, result: io::Result<usize>) -> io::Result<usize> {
        match self.faults {
            Some(f) => f.after_write(offset, len, result),
            None => result,
        }
    }

    fn fd(&self, direct: bool) -> i32 {
        match (&self.target.direct, direct) {
            (Some(d), true) => d.as_raw_fd(),
            // The target is always a local file (opened above).
            _ => self.target.local().map_or(-1, |f| f.as_raw_fd()),
        }
    }

    fn fill(&self, pos: u64, slot: (*mut u8, usize), n: u64) -> Result<(), IoError> {
        // SAFETY: the slot is free (no write in flight reads it) and holds at least `chunk >= n` bytes.
        let buf = unsafe { std::slice::from_raw_parts_mut(slot.0, n as usize) };
        self.source.fill(pos, buf).map_err(IoError::Sink)
    }

    fn run_pwrite(&self, slot: (*mut u8, usize), stats: &mut LaneStats) -> Result<(), IoError> {
        let mut pos = 0;
        while pos < self.len {
            let n = (self.len - pos).min(self.chunk);
            self.fill(pos, slot, n)?;
            let op = self.op(pos, n);
            let mut w = Reading::start_write(op.direct);
            loop {
                let req = w.request(&op);
                let from = (req.offset - op.offset) as usize;
                // SAFETY: `from + req.len <= n`, inside the slot filled above; the descriptor is open.
                let r = unsafe {
                    libc::pwrite(self.fd(req.direct), slot.0.add(from).cast(), req.len as usize, req.offset as i64)
                };
                let result = if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r as usize) };
                let result = self.faulted(req.offset, req.len, result);
                if let Next::Complete = w.on_result(&op, self.target, result, stats)? {
                    break;
                }
            }
            stats.ops += 1;
            pos += n;
        }
        Ok(())
    }

    /// Keeps up to one write per slot in flight. On an error, stops filling slots and drains what is in flight
    /// before returning it: no write may still read a slot once this returns.
    fn run_uring(&self, slots: &[(*mut u8, usize)], stats: &mut LaneStats) -> Result<(), IoError> {
        let n_slots = slots.len();
        let mut ring: IoUring = IoUring::builder()
            .build((n_slots * 2).next_power_of_two() as u32)
            .map_err(|cause| IoError::Uring { call: "setup", cause })?;
        let mut state: Vec<Option<InFlight>> = (0..n_slots).map(|_| None).collect();
        let mut free: Vec<usize> = (0..n_slots).rev().collect();
        let (mut pos, mut inflight) = (0u64, 0usize);
        let mut first_err: Option<IoError> = None;
        loop {
            while first_err.is_none() && pos < self.len {
                let Some(slot) = free.pop() else { break };
                let n = (self.len - pos).min(self.chunk);
                if let Err(e) = self.fill(pos, slots[slot], n) {
                    first_err = Some(e);
                    free.push(slot);
                    break;
                }
                let op = self.op(pos, n);
                let f = InFlight { writing: Reading::start_write(op.direct), op };
                match self.push(&mut ring, slot, slots[slot].0, &f) {
                    Ok(()) => {
                        state[slot] = Some(f);
                        inflight += 1;
                        pos += n;
                    }
                    Err(e) => {
                        first_err = Some(e);
                        free.push(slot);
                    }
                }
            }
            if inflight == 0 {
                break;
            }
            if let Err(e) = submit_and_wait(&mut ring) {
                // The ring cannot make progress; dropping it below waits for what is in flight.
                first_err.get_or_insert(e);
                break;
            }
            let done: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
            inflight -= done.len();
            for (ud, res) in done {
                let slot = ud as usize;
                let Some(mut f) = state.get_mut(slot).and_then(Option::take) else { continue };
                let result = if res < 0 { Err(io::Error::from_raw_os_error(-res)) } else { Ok(res as usize) };
                let req = f.writing.request(&f.op);
                let result = self.faulted(req.offset, req.len, result);
                match f.writing.on_result(&f.op, self.target, result, stats) {
                    Ok(Next::Complete) => {
                        stats.ops += 1;
                        free.push(slot);
                    }
                    Ok(Next::Read(_)) if first_err.is_some() => free.push(slot),
                    Ok(Next::Read(_)) => match self.push(&mut ring, slot, slots[slot].0, &f) {
                        Ok(()) => {
                            state[slot] = Some(f);
                            inflight += 1;
                        }
                        Err(e) => {
                            first_err.get_or_insert(e);
                            free.push(slot);
                        }
                    },
                    Err(e) => {
                        first_err.get_or_insert(e);
                        free.push(slot);
                    }
                }
            }
        }
        drop(ring);
        first_err.map_or(Ok(()), Err)
    }

    /// Pushes the next write of `f` (from its slot at `base`).
    fn push(&self, ring: &mut IoUring, slot: usize, base: *mut u8, f: &InFlight) -> Result<(), IoError> {
        let req = f.writing.request(&f.op);
        // SAFETY: `req.offset - op.offset < op.len <= chunk`, inside the slot.
        let ptr = unsafe { base.add((req.offset - f.op.offset) as usize) };
        let entry: squeue::Entry = opcode::Write::new(types::Fd(self.fd(req.direct)), ptr, req.len as u32)
            .offset(req.offset)
            .build()
            .user_data(slot as u64);
        loop {
            // SAFETY: the bytes lie in a staging slot that is not touched until this write's completion arrives
            // (the slot stays out of the free list until then); the descriptor stays open for the whole call.
            if unsafe { ring.submission().push(&entry) }.is_ok() {
                return Ok(());
            }
            ring.submit().map_err(|cause| IoError::Uring { call: "submit", cause })?;
        }
    }
}

fn submit_and_wait(ring: &mut IoUring) -> Result<(), IoError> {
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => return Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)) => {}
            Err(cause) => return Err(IoError::Uring { call: "submit", cause }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_byte_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(5 << 20) + 123).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for engine in [ReadEngine::Uring, ReadEngine::Pread] {
            for direct in [DirectMode::Auto, DirectMode::Never] {
                let path = dir.path().join(format!("w-{engine}-{direct}"));
                std::fs::write(&path, vec![0xAAu8; 100]).unwrap();
                let config = IoParams { engine, direct, chunk_bytes: 1 << 20, ..IoParams::default() };
                let req =
                    WriteRequest { path: &path, offset: 4096, len: data.len() as u64, durable: true, faults: None };
                let r = write_at(&config, &req, &HostSource(&data), &mut StagingPool::new(), None).unwrap();
                let back = std::fs::read(&path).unwrap();
                assert_eq!(&back[..100], &[0xAA; 100][..], "the write must not truncate or clobber earlier bytes");
                assert!(back[100..4096].iter().all(|&b| b == 0));
                assert!(back[4096..] == data[..], "{engine} {direct}");
                assert_eq!(r.direct_bytes + r.buffered_bytes, data.len() as u64);
                if direct == DirectMode::Never {
                    assert_eq!(r.direct_bytes, 0);
                }
            }
        }
    }

    #[test]
    fn a_range_past_the_largest_offset_is_einval_before_the_file_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("never");
        let data = [7u8; 16];
        for offset in [u64::MAX - 4, i64::MAX as u64 - 4] {
            let req = WriteRequest { path: &path, offset, len: data.len() as u64, durable: false, faults: None };
            let err = write_at(&IoParams::default(), &req, &HostSource(&data), &mut StagingPool::new(), None)
                .expect_err("a write ending past i64::MAX");
            assert_eq!(err.raw_os_error(), Some(rustix::io::Errno::INVAL.raw_os_error()), "{err}");
            assert!(!path.exists(), "the file was created before the range was checked");
        }
    }

    #[test]
    fn writing_into_a_fifo_or_a_device_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let targets = [(fifo, crate::file::NodeKind::Fifo), ("/dev/null".into(), crate::file::NodeKind::CharDevice)];
        let sent = targets.clone();
        // On another thread, so that a blocking open fails the test instead of hanging it.
        std::thread::spawn(move || {
            for (path, _) in &sent {
                let req = WriteRequest { path, offset: 0, len: 3, durable: true, faults: None };
                let r = write_at(&IoParams::default(), &req, &HostSource(b"abc"), &mut StagingPool::new(), None);
                let _ = tx.send(r.map(|_| ()));
            }
        });
        for (path, kind) in &targets {
            let r = rx.recv_timeout(std::time::Duration::from_secs(5)).expect("the write blocked");
            match r {
                Err(IoError::NotAFile { node, path: p }) => assert_eq!((node, &p), (*kind, path)),
                other => panic!("{}: {other:?}", path.display()),
            }
        }
    }

    #[test]
    fn writing_into_a_read_only_file_fails_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro");
        std::fs::write(&path, b"x").unwrap();
        let mut perms = std::fs::metadata(&path).unwrap().permissions();
        perms.set_readonly(true);
        std::fs::set_permissions(&path, perms).unwrap();
        let req = WriteRequest { path: &path, offset: 0, len: 1, durable: false, faults: None };
        let r = write_at(&IoParams::default(), &req, &HostSource(b"y"), &mut StagingPool::new(), None);
        // Root may write anyway; everyone else gets a permission error naming the file.
        if let Err(e) = r {
            assert!(e.to_string().contains("ro"), "{e}");
            assert_eq!(e.io_kind(), Some(io::ErrorKind::PermissionDenied));
        }
    }
}
