//! What identifies a kept file's bytes: device, inode, length, modification and change times, read with `fstat`
//! from the descriptor the client opened (so paths in other mount namespaces, renames and races between a path's
//! lookup and its reading do not matter). The change time is there because `utimensat` can set a forged
//! modification time back after an in-place rewrite, but not the change time, which the kernel sets.

use std::os::fd::AsFd;

use serde::{Deserialize, Serialize};

/// A file's identity as the keeper keys it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stamp {
    /// The file system's device number.
    pub dev: u64,
    /// The inode.
    pub ino: u64,
    /// The length in bytes.
    pub len: u64,
    /// Modification time, in nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Status change time, in nanoseconds since the epoch.
    pub ctime_ns: i64,
}

impl Stamp {
    /// The identity of the open file `fd`.
    pub fn of(fd: impl AsFd) -> std::io::Result<Stamp> {
        let st = rustix::fs::fstat(fd)?;
        // i64 nanoseconds reach the year 2262 (and JSON has no 128-bit integers).
        let ns = |s: i64, n: u64| s.saturating_mul(1_000_000_000).saturating_add(n as i64);
        Ok(Stamp {
            dev: st.st_dev,
            ino: st.st_ino,
            len: st.st_size.max(0) as u64,
            mtime_ns: ns(st.st_mtime as i64, st.st_mtime_nsec as u64),
            ctime_ns: ns(st.st_ctime as i64, st.st_ctime_nsec as u64),
        })
    }

    /// Whether `other` is the same file (device and inode), whatever its contents now.
    pub fn same_file(&self, other: &Stamp) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }

    /// Whether the descriptor names a regular file.
    pub fn is_regular(fd: impl AsFd) -> std::io::Result<bool> {
        let st = rustix::fs::fstat(fd)?;
        Ok(rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile)
    }
}
