//! Fault injection for tests: reads that fail with EIO, come back short, or hit a file truncated mid-load, at
//! chosen offsets. The engine consults a [`FaultPlan`] around every read it issues, whichever backend runs.

use std::fs::OpenOptions;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// One injected fault, on input file `file` (its index in the load) at byte `offset` of it; the write faults apply to
/// the file being written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // the fields: `file` and `offset`, as above; each variant says what happens there
pub enum Fault {
    /// Every read covering `offset` fails with EIO.
    Eio { file: u32, offset: u64 },
    /// The first read covering `offset` returns only the bytes before it (a transient short read).
    Short { file: u32, offset: u64 },
    /// Before the first read reaching `offset`, the file is truncated to `offset` bytes.
    TruncateAt { file: u32, offset: u64 },
    /// The lane that finishes the first read covering `offset` panics there (a bug's stand-in: what the engine
    /// does with a lane that dies).
    Panic { file: u32, offset: u64 },
    /// Every write covering `offset` fails with EIO.
    WriteEio { offset: u64 },
    /// Every write covering `offset` fails with ENOSPC (a full file system).
    WriteFull { offset: u64 },
    /// The first write covering `offset` stores only the bytes before it (a transient short write).
    ShortWrite { offset: u64 },
}

/// A set of faults, each of the one-shot kinds firing once.
#[derive(Debug)]
pub struct FaultPlan {
    faults: Vec<(Fault, AtomicBool)>,
}

impl FaultPlan {
    /// A plan injecting `faults`, none fired yet.
    pub fn new(faults: Vec<Fault>) -> FaultPlan {
        FaultPlan { faults: faults.into_iter().map(|f| (f, AtomicBool::new(false))).collect() }
    }

    /// Runs before a read of `[offset, offset + len)` of `file` (at `path`) is issued.
    pub fn before_read(&self, file: u32, path: &Path, offset: u64, len: u64) {
        for (fault, fired) in &self.faults {
            if let Fault::TruncateAt { file: f, offset: at } = *fault
                && f == file
                && offset + len > at
                && !fired.swap(true, Ordering::SeqCst)
                && let Ok(w) = OpenOptions::new().write(true).open(path)
            {
                let _ = w.set_len(at);
            }
        }
    }

    /// Runs on the result of a write of `[offset, offset + len)`, possibly replacing it.
    pub fn after_write(&self, offset: u64, len: u64, result: io::Result<usize>) -> io::Result<usize> {
        let covers = |at: u64| at >= offset && at < offset + len;
        for (fault, fired) in &self.faults {
            match *fault {
                Fault::WriteEio { offset: at } if covers(at) => return Err(io::Error::from_raw_os_error(libc::EIO)),
                Fault::WriteFull { offset: at } if covers(at) => {
                    return Err(io::Error::from_raw_os_error(libc::ENOSPC));
                }
                Fault::ShortWrite { offset: at } if covers(at) && at > offset => {
                    if let Ok(n) = result
                        && !fired.swap(true, Ordering::SeqCst)
                    {
                        return Ok(n.min((at - offset) as usize));
                    }
                }
                _ => {}
            }
        }
        result
    }

    /// Runs on the result of a read of `[offset, offset + len)` of `file`, possibly replacing it.
    pub fn after_read(&self, file: u32, offset: u64, len: u64, result: io::Result<usize>) -> io::Result<usize> {
        let covers = |at: u64| at >= offset && at < offset + len;
        for (fault, fired) in &self.faults {
            match *fault {
                Fault::Eio { file: f, offset: at } if f == file && covers(at) => {
                    return Err(io::Error::from_raw_os_error(libc::EIO));
                }
                Fault::Panic { file: f, offset: at }
                    if f == file && covers(at) && !fired.swap(true, Ordering::SeqCst) =>
                {
                    panic!("injected panic at offset {at} of file {file}");
                }
                Fault::Short { file: f, offset: at } if f == file && covers(at) && at > offset => {
                    if let Ok(n) = result
                        && !fired.swap(true, Ordering::SeqCst)
                    {
                        return Ok(n.min((at - offset) as usize));
                    }
                }
                _ => {}
            }
        }
        result
    }
}
