//! What every I/O thread ("lane") does the same whichever kernel interface submits its reads: the one place where a
//! read's result is interpreted (retry, short read, end of file, error), in-place targets, and the counters.

use std::io;
use std::time::Duration;

use crate::error::IoError;
use crate::file::OpenFile;
use crate::plan::{Plan, ReadOp};
use crate::sink::Sink;

/// Transient errors are retried this many times per read before giving up.
const MAX_RETRIES: u32 = 1000;

/// Counters of one lane, summed into the load's report.
#[derive(Clone, Debug, Default)]
pub struct LaneStats {
    /// Reads issued (each op once, whatever its retries).
    pub ops: u64,
    /// Bytes read through O_DIRECT descriptors.
    pub direct_bytes: u64,
    /// Bytes read through buffered descriptors (or from objects).
    pub buffered_bytes: u64,
    /// Reads issued again after an interruption (EINTR or EAGAIN).
    pub retries: u64,
    /// Reads that returned fewer bytes than asked before the end of the file (continued from where they stopped).
    pub short_reads: u64,
    /// O_DIRECT reads the filesystem refused (EINVAL), read again buffered.
    pub direct_fallbacks: u64,
    /// Time blocked in the kernel waiting for reads (io_uring_enter, or inside pread).
    pub io_wait: Duration,
    /// Time in the sink's `deliver` (host copies, or queuing device copies).
    pub deliver: Duration,
    /// Time blocked because every slot was waiting for a delivery to finish.
    pub backpressure: Duration,
    /// Time setting up staging for the load (mapping, faulting in and pinning slots, registering them with the
    /// ring): a lane's first load, or one that needs larger slots than it has.
    pub setup: Duration,
    /// Time waiting for other lanes' staging set-ups to finish before starting its own (lanes set up one at a
    /// time, process-wide).
    pub setup_wait: Duration,
    /// Bytes of cold ranges populated through a huge-page mapping before being read (`cache_pages = huge`; the
    /// kernel reads whole 2 MiB folios around them, 2 MiB folios only where the filesystem has large folios), and
    /// the time the lanes spent doing it (the disk reads of those ranges happen there).
    pub populated_bytes: u64,
    /// See `populated_bytes`.
    pub populate: Duration,
}

impl LaneStats {
    /// Adds `o`'s counters and times to these.
    pub fn add(&mut self, o: &LaneStats) {
        self.ops += o.ops;
        self.direct_bytes += o.direct_bytes;
        self.buffered_bytes += o.buffered_bytes;
        self.retries += o.retries;
        self.short_reads += o.short_reads;
        self.direct_fallbacks += o.direct_fallbacks;
        self.io_wait += o.io_wait;
        self.deliver += o.deliver;
        self.backpressure += o.backpressure;
        self.setup += o.setup;
        self.setup_wait += o.setup_wait;
        self.populated_bytes += o.populated_bytes;
        self.populate += o.populate;
    }
}

/// Reads per `readv` at most (the kernel's IOV_MAX).
const MAX_IOVECS: usize = 1024;

/// Where a buffered op's bytes go when they can be read straight into the sink's host destinations: pieces that
/// follow each other without gaps or overlaps and cover the whole op, each with a host address.
pub(crate) fn in_place_targets(plan: &Plan, op: &ReadOp, sink: &dyn Sink) -> Option<Vec<(*mut u8, usize)>> {
    if op.direct {
        return None;
    }
    let sink = sink.in_place()?;
    let pieces = plan.pieces_of(op);
    if pieces.len() > MAX_IOVECS {
        return None;
    }
    let mut pos = 0;
    let mut out = Vec::with_capacity(pieces.len());
    for p in pieces {
        if p.at != pos {
            return None;
        }
        out.push((sink.host_destination(p)?, p.len as usize));
        pos += p.len;
    }
    (pos == op.valid).then_some(out)
}

/// The iovecs covering bytes `[from, from + len)` of an op read in place.
pub(crate) fn iovecs(parts: &[(*mut u8, usize)], from: u64, len: u64) -> Vec<libc::iovec> {
    let (mut skip, mut left) = (from as usize, len as usize);
    let mut out = Vec::new();
    for &(ptr, n) in parts {
        if left == 0 {
            break;
        }
        if skip >= n {
            skip -= n;
            continue;
        }
        let take = (n - skip).min(left);
        // SAFETY: `skip < n`, so the address stays inside this destination range.
        out.push(libc::iovec { iov_base: unsafe { ptr.add(skip) }.cast(), iov_len: take });
        left -= take;
        skip = 0;
    }
    out
}

/// Which way a transfer moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    Read,
    Write,
}

/// A read (or write) in progress in one slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reading {
    pub dir: Dir,
    /// Bytes of the op already in the slot.
    pub done: u64,
    /// Whether the next read of this op goes through the O_DIRECT descriptor.
    pub direct: bool,
    pub retries: u32,
}

/// A read to issue: `len` bytes at file `offset` into the slot at `offset - op.offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub offset: u64,
    pub len: u64,
    pub direct: bool,
}

/// What to do after a read returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// The op's bytes are all in the slot.
    Complete,
    /// Read again.
    Read(Request),
}

impl Reading {
    pub fn start(direct: bool) -> Reading {
        Reading { dir: Dir::Read, done: 0, direct, retries: 0 }
    }

    /// A write (of an op's `valid` bytes, from the slot to the file).
    pub fn start_write(direct: bool) -> Reading {
        Reading { dir: Dir::Write, done: 0, direct, retries: 0 }
    }

    fn failure(&self, file: &OpenFile, offset: u64, len: u64, cause: io::Error) -> IoError {
        // An object's failure names its URL and byte range itself.
        match cause.get_ref().and_then(|e| e.downcast_ref::<weightlift_remote::RemoteError>()) {
            // Stopped because its job was cancelled, or failed already (whose first error then stands).
            Some(weightlift_remote::RemoteError::Stopped { .. }) => return IoError::Cancelled,
            Some(e) => return IoError::Remote(e.clone()),
            None => {}
        }
        let path = file.path.clone();
        match self.dir {
            Dir::Read => IoError::Read { path, offset, len, cause },
            Dir::Write => IoError::Write { path, offset, len, cause },
        }
    }

    /// The read to issue now for this op.
    pub fn request(&self, op: &ReadOp) -> Request {
        let len = if self.direct { op.len - self.done } else { op.valid - self.done };
        Request { offset: op.offset + self.done, len, direct: self.direct }
    }

    /// Interprets the result of the read (or write) last issued for this op. This is the only place results are
    /// read (copy this pattern: one state machine per transfer, fed every result, deciding what comes next):
    /// transient errors retry, short reads continue where they stopped (through the buffered descriptor when the
    /// position is no longer block-aligned), an early end of file is a truncation, anything else an error naming
    /// the file and offset. A write that returns 0 is an error (the device is full or refuses).
    pub fn on_result(
        &mut self,
        op: &ReadOp,
        file: &OpenFile,
        result: io::Result<usize>,
        stats: &mut LaneStats,
    ) -> Result<Next, IoError> {
        let at = op.offset + self.done;
        match result {
            Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) => {
                self.retries += 1;
                stats.retries += 1;
                if self.retries > MAX_RETRIES {
                    return Err(self.failure(file, at, op.valid - self.done, e));
                }
            }
            Err(e) if self.direct && e.raw_os_error() == Some(libc::EINVAL) => {
                // The filesystem refused this O_DIRECT read after all: finish it buffered.
                self.direct = false;
                stats.direct_fallbacks += 1;
            }
            Err(e) => return Err(self.failure(file, at, op.valid - self.done, e)),
            Ok(0) if self.done < op.valid && self.dir == Dir::Write => {
                let cause = io::Error::new(io::ErrorKind::WriteZero, "write returned 0");
                return Err(self.failure(file, at, op.valid - self.done, cause));
            }
            Ok(0) if self.done < op.valid => {
                return Err(IoError::Truncated {
                    path: file.path.clone(),
                    offset: at,
                    expected_end: op.offset + op.valid,
                });
            }
            Ok(n) => {
                if self.direct {
                    stats.direct_bytes += n as u64;
                } else {
                    stats.buffered_bytes += n as u64;
                }
                self.done = (self.done + n as u64).min(op.len);
                if self.done >= op.valid {
                    return Ok(Next::Complete);
                }
                stats.short_reads += 1;
                if self.direct && !self.done.is_multiple_of(file.block) {
                    self.direct = false;
                }
            }
        }
        Ok(Next::Read(self.request(op)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> OpenFile {
        let f = tempfile::tempfile().unwrap();
        OpenFile {
            path: "/x".into(),
            source: crate::file::Source::Local(f.try_clone().unwrap()),
            direct: None,
            direct_refused: None,
            len: 10_000,
            block: 4096,
            mem_align: 4096,
            copy: None,
        }
    }

    #[test]
    fn short_reads_continue_and_eof_is_truncation() {
        let op = ReadOp { file: 0, offset: 0, len: 8192, valid: 8192, direct: true, cold: false, pieces: 0..0 };
        let f = file();
        let mut st = LaneStats::default();
        let mut r = Reading::start(true);
        assert_eq!(
            r.on_result(&op, &f, Ok(4096), &mut st).unwrap(),
            Next::Read(Request { offset: 4096, len: 4096, direct: true })
        );
        assert_eq!(
            r.on_result(&op, &f, Ok(100), &mut st).unwrap(),
            Next::Read(Request { offset: 4196, len: 3996, direct: false })
        );
        let err = r.on_result(&op, &f, Ok(0), &mut st).unwrap_err();
        assert!(matches!(err, IoError::Truncated { offset: 4196, expected_end: 8192, .. }), "{err}");
        assert_eq!(st.short_reads, 2);
    }

    #[test]
    fn transient_errors_retry_and_hard_errors_name_the_offset() {
        let op = ReadOp { file: 0, offset: 500, len: 100, valid: 100, direct: false, cold: false, pieces: 0..0 };
        let f = file();
        let mut st = LaneStats::default();
        let mut r = Reading::start(false);
        let again = r.on_result(&op, &f, Err(io::Error::from_raw_os_error(libc::EAGAIN)), &mut st).unwrap();
        assert_eq!(again, Next::Read(Request { offset: 500, len: 100, direct: false }));
        assert_eq!(st.retries, 1);
        let err = r.on_result(&op, &f, Err(io::Error::from_raw_os_error(libc::EIO)), &mut st).unwrap_err();
        assert!(err.to_string().contains("offset 500"), "{err}");
        assert_eq!(r.on_result(&op, &f, Ok(100), &mut st).unwrap(), Next::Complete);
    }
}
