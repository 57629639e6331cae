//! Writes: bytes from a source (host memory, or device memory copied out by the CUDA layer) go through staging
//! slots to the file with io_uring writes — O_DIRECT for block-aligned chunks where the filesystem allows, buffered
//! for the rest — several in flight, short writes resumed, then an optional fsync.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

use io_uring::{IoUring, opcode, squeue, types};

use crate::config::{Backend, DirectMode, IoConfig};
use crate::error::IoError;
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
    pub bytes: u64,
    pub direct_bytes: u64,
    pub buffered_bytes: u64,
    pub ops: u64,
    pub backend: &'static str,
    pub seconds: f64,
    pub fsync_secs: f64,
}

/// Slots kept in flight by a write.
const WRITE_SLOTS: usize = 8;

/// Where to write: `len` bytes at `offset` of `path` (created if missing, never truncated), fsynced when `durable`.
#[derive(Clone, Copy, Debug)]
pub struct WriteRequest<'a> {
    pub path: &'a Path,
    pub offset: u64,
    pub len: u64,
    pub durable: bool,
}

/// Writes `req.len` bytes of `source` as `req` says.
pub fn write_at(
    config: &IoConfig,
    req: &WriteRequest<'_>,
    source: &dyn WriteSource,
    pool: &mut StagingPool,
    pinner: Option<&dyn Pinner>,
) -> Result<WriteReport, IoError> {
    let WriteRequest { path, offset, len, durable } = *req;
    let t0 = Instant::now();
    let open_err = |cause| IoError::Open { path: path.to_path_buf(), cause };
    let buffered = OpenOptions::new().write(true).create(true).truncate(false).open(path).map_err(open_err)?;
    let want_direct = config.direct.value != DirectMode::Never;
    let direct =
        if want_direct { OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path).ok() } else { None };
    let block =
        direct.as_ref().map_or(4096, |_| crate::file::OpenFile::open(path, true).map(|f| f.block).unwrap_or(4096));
    let chunk = config.chunk_bytes.value.max(block).next_multiple_of(block);
    let mut report = WriteReport { bytes: len, ..WriteReport::default() };
    if len > 0 {
        let slots = WRITE_SLOTS.min(len.div_ceil(chunk) as usize).max(1);
        let staging = pool.acquire(chunk as usize, slots, config.staging_bytes.value.max(chunk), pinner)?;
        let use_uring = config.backend.value != Backend::Pread && crate::uring::available().is_ok();
        let mut w = Writer {
            path,
            buffered: &buffered,
            direct: direct.as_ref(),
            block,
            offset,
            len,
            chunk,
            source,
            report: &mut report,
        };
        if use_uring {
            w.report.backend = "uring";
            w.run_uring(staging.slots_mut().into_iter().take(slots).collect())?;
        } else {
            w.report.backend = "pwrite";
            let mut slots = staging.slots_mut();
            let slot = slots.first_mut().ok_or_else(|| IoError::Staging { bytes: chunk, reason: "no slot".into() })?;
            w.run_pwrite(slot)?;
        }
    }
    if durable {
        let t = Instant::now();
        buffered.sync_all().map_err(|cause| IoError::Write { path: path.to_path_buf(), offset, len, cause })?;
        report.fsync_secs = t.elapsed().as_secs_f64();
    }
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

struct Writer<'a> {
    path: &'a Path,
    buffered: &'a File,
    direct: Option<&'a File>,
    block: u64,
    offset: u64,
    len: u64,
    chunk: u64,
    source: &'a dyn WriteSource,
    report: &'a mut WriteReport,
}

impl Writer<'_> {
    fn err(&self, offset: u64, len: u64, cause: io::Error) -> IoError {
        IoError::Write { path: self.path.to_path_buf(), offset, len, cause }
    }

    /// Whether `[at, at + n)` of the file can be written with O_DIRECT.
    fn aligned(&self, at: u64, n: u64) -> bool {
        self.direct.is_some() && at % self.block == 0 && n % self.block == 0
    }

    fn fill(&self, pos: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.source.fill(pos, buf).map_err(IoError::Sink)
    }

    fn run_pwrite(&mut self, slot: &mut [u8]) -> Result<(), IoError> {
        let mut pos = 0;
        while pos < self.len {
            let n = (self.len - pos).min(self.chunk);
            let at = self.offset + pos;
            self.fill(pos, &mut slot[..n as usize])?;
            let direct = self.aligned(at, n);
            let f = if direct { self.direct.unwrap_or(self.buffered) } else { self.buffered };
            let r = f.write_all_at(&slot[..n as usize], at);
            let r = match r {
                Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    self.buffered.write_all_at(&slot[..n as usize], at).map(|()| false)
                }
                other => other.map(|()| direct),
            };
            let direct = r.map_err(|e| self.err(at, n, e))?;
            if direct {
                self.report.direct_bytes += n;
            } else {
                self.report.buffered_bytes += n;
            }
            self.report.ops += 1;
            pos += n;
        }
        Ok(())
    }

    fn run_uring(&mut self, slots: Vec<&mut [u8]>) -> Result<(), IoError> {
        let uring_err = |what: &str, e: io::Error| IoError::Uring(format!("{what}: {e}"));
        let mut ring: IoUring = IoUring::builder()
            .build((slots.len() * 2).next_power_of_two() as u32)
            .map_err(|e| uring_err("setup", e))?;
        let fds = [self.buffered.as_raw_fd(), self.direct.map_or(-1, |d| d.as_raw_fd())];
        ring.submitter().register_files(&fds).map_err(|e| uring_err("registering files", e))?;
        let ptrs: Vec<(*mut u8, usize)> = slots.into_iter().map(|s| (s.as_mut_ptr(), s.len())).collect();
        // State per slot: (file position relative to the write, bytes in the slot, bytes done, direct).
        let mut state: Vec<Option<(u64, u64, u64, bool)>> = vec![None; ptrs.len()];
        let mut free: Vec<usize> = (0..ptrs.len()).rev().collect();
        let mut pos = 0u64;
        let mut inflight = 0usize;
        let mut first_err: Option<IoError> = None;
        loop {
            while first_err.is_none() && pos < self.len {
                let Some(slot) = free.pop() else { break };
                let n = (self.len - pos).min(self.chunk);
                let (ptr, _) = ptrs[slot];
                // SAFETY: the slot is free (no write in flight reads it) and holds at least `chunk >= n` bytes.
                let buf = unsafe { std::slice::from_raw_parts_mut(ptr, n as usize) };
                if let Err(e) = self.fill(pos, buf) {
                    first_err = Some(e);
                    free.push(slot);
                    break;
                }
                let direct = self.aligned(self.offset + pos, n);
                state[slot] = Some((pos, n, 0, direct));
                push_write(&mut ring, slot, ptr, self.offset + pos, n, direct)?;
                inflight += 1;
                pos += n;
            }
            if inflight == 0 {
                break;
            }
            loop {
                match ring.submit_and_wait(1) {
                    Ok(_) => break,
                    Err(e)
                        if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)) =>
                    {
                        continue;
                    }
                    Err(e) => return Err(uring_err("submit", e)),
                }
            }
            let done: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
            inflight -= done.len();
            for (ud, res) in done {
                let slot = ud as usize;
                let Some(Some((p, n, got, direct))) = state.get(slot).copied() else { continue };
                let at = self.offset + p + got;
                if res < 0 {
                    let e = io::Error::from_raw_os_error(-res);
                    if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock)
                        || (direct && res == -libc::EINVAL)
                    {
                        // Retry; an O_DIRECT refusal is retried buffered.
                        let direct = direct && res != -libc::EINVAL;
                        state[slot] = Some((p, n, got, direct));
                        // SAFETY: the slot still holds the chunk; `got < n`.
                        let ptr = unsafe { ptrs[slot].0.add(got as usize) };
                        push_write(&mut ring, slot, ptr, at, n - got, direct)?;
                        inflight += 1;
                        continue;
                    }
                    first_err.get_or_insert(self.err(at, n - got, e));
                    state[slot] = None;
                    free.push(slot);
                    continue;
                }
                let w = res as u64;
                if w == 0 {
                    first_err.get_or_insert(self.err(
                        at,
                        n - got,
                        io::Error::new(io::ErrorKind::WriteZero, "write returned 0"),
                    ));
                    state[slot] = None;
                    free.push(slot);
                    continue;
                }
                if direct {
                    self.report.direct_bytes += w;
                } else {
                    self.report.buffered_bytes += w;
                }
                let got = got + w;
                if got < n {
                    // A short write: the rest goes buffered if it no longer starts on a block.
                    let direct = direct && got % self.block == 0;
                    state[slot] = Some((p, n, got, direct));
                    // SAFETY: the slot still holds the chunk; `got < n`.
                    let ptr = unsafe { ptrs[slot].0.add(got as usize) };
                    push_write(&mut ring, slot, ptr, self.offset + p + got, n - got, direct)?;
                    inflight += 1;
                } else {
                    self.report.ops += 1;
                    state[slot] = None;
                    free.push(slot);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

fn push_write(ring: &mut IoUring, slot: usize, ptr: *const u8, at: u64, n: u64, direct: bool) -> Result<(), IoError> {
    let entry: squeue::Entry =
        opcode::Write::new(types::Fixed(u32::from(direct)), ptr, n as u32).offset(at).build().user_data(slot as u64);
    loop {
        // SAFETY: `ptr..ptr + n` lies in a staging slot that is not touched until this write's completion arrives
        // (the slot stays out of the free list until then); fixed file 0 is the buffered and 1 the O_DIRECT
        // descriptor, registered for the life of the ring.
        if unsafe { ring.submission().push(&entry) }.is_ok() {
            return Ok(());
        }
        ring.submit().map_err(|e| IoError::Uring(format!("submit: {e}")))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_byte_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(5 << 20) + 123).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for backend in [Backend::Uring, Backend::Pread] {
            for direct in [DirectMode::Auto, DirectMode::Never] {
                let path = dir.path().join(format!("w-{backend}-{direct}"));
                std::fs::write(&path, vec![0xAAu8; 100]).unwrap();
                let config = IoConfig::default().backend(backend).direct(direct).chunk_bytes(1 << 20);
                let req = WriteRequest { path: &path, offset: 4096, len: data.len() as u64, durable: true };
                let r = write_at(&config, &req, &HostSource(&data), &mut StagingPool::new(), None).unwrap();
                let back = std::fs::read(&path).unwrap();
                assert_eq!(&back[..100], &[0xAA; 100][..], "the write must not truncate or clobber earlier bytes");
                assert!(back[100..4096].iter().all(|&b| b == 0));
                assert!(back[4096..] == data[..], "{backend} {direct}");
                assert_eq!(r.direct_bytes + r.buffered_bytes, data.len() as u64);
                if direct == DirectMode::Never {
                    assert_eq!(r.direct_bytes, 0);
                }
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
        let req = WriteRequest { path: &path, offset: 0, len: 1, durable: false };
        let r = write_at(&IoConfig::default(), &req, &HostSource(b"y"), &mut StagingPool::new(), None);
        // Root may write anyway; everyone else gets a permission error naming the file.
        if let Err(e) = r {
            assert!(e.to_string().contains("ro"), "{e}");
            assert_eq!(e.io_kind(), Some(io::ErrorKind::PermissionDenied));
        }
    }
}
