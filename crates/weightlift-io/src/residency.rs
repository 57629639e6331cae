//! Which parts of a file are in the page cache.
//!
//! First one `cachestat(2)` over the whole file (Linux 6.5+; cheap even for huge files since it counts folios):
//! a file entirely cached or entirely cold — the usual cases — needs nothing more. Otherwise, or without
//! `cachestat`, a per-page bitmap from `mincore(2)` on a mapping of the file that is never read (which costs a few
//! milliseconds per cached gigabyte).

use std::fs::File;
use std::os::fd::AsRawFd;

/// Where a file's pages are.
#[derive(Clone, Debug)]
pub enum Residency {
    /// Every page is cached.
    All { len: u64 },
    /// No page is cached.
    None,
    /// Per-page bitmap.
    Pages { page: u64, len: u64, resident: Vec<bool> },
}

/// `struct cachestat_range` of the Linux UAPI.
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

/// `struct cachestat` of the Linux UAPI.
#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// `TMPFS_MAGIC` of `statfs(2)`.
const TMPFS_MAGIC: i64 = 0x0102_1994;

// `f_type`'s integer type differs between targets (i64, u32, ...), hence the cast.
#[allow(clippy::unnecessary_cast)]
fn is_tmpfs(f_type: libc::__fsword_t) -> bool {
    f_type as i64 == TMPFS_MAGIC
}

/// `__NR_cachestat`, the same on every architecture (it postdates the per-architecture tables).
const SYS_CACHESTAT: libc::c_long = 451;

/// Cached pages of the whole file, or `None` where the kernel has no `cachestat`.
fn cachestat_pages(file: &File) -> Option<u64> {
    let range = CachestatRange { off: 0, len: 0 };
    let mut out = Cachestat::default();
    // SAFETY: cachestat reads `range` and writes `out`, both valid for their C layouts, and takes no ownership.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut out as *mut Cachestat,
            0u32,
        )
    };
    (rc == 0).then_some(out.nr_cache)
}

impl Residency {
    /// Probes `file` (`len` bytes). Returns `None` when neither probe is possible.
    pub fn probe(file: &File, len: u64) -> Option<Residency> {
        if len == 0 {
            return Some(Residency::None);
        }
        // tmpfs pages live in memory (or swap), and O_DIRECT there is a memory copy too: count them as cached.
        if rustix::fs::fstatfs(file).is_ok_and(|st| is_tmpfs(st.f_type)) {
            return Some(Residency::All { len });
        }
        let page = rustix::param::page_size() as u64;
        let pages = len.div_ceil(page);
        match cachestat_pages(file) {
            Some(0) => return Some(Residency::None),
            Some(n) if n >= pages => return Some(Residency::All { len }),
            _ => {}
        }
        Self::mincore(file, len, page)
    }

    fn mincore(file: &File, len: u64, page: u64) -> Option<Residency> {
        // SAFETY: the mapping is only handed to mincore and never read or written, so a concurrent change or
        // truncation of the file cannot be observed through it; it is unmapped when `map` drops.
        let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map(file) }.ok()?;
        let pages = len.div_ceil(page) as usize;
        let mut vec = vec![0u8; pages];
        // SAFETY: `map` is a live mapping of `len` bytes starting at a page boundary, and `vec` holds one byte for
        // each of its pages, as mincore requires.
        let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len as usize, vec.as_mut_ptr()) };
        if rc != 0 {
            return None;
        }
        Some(Residency::Pages { page, len, resident: vec.into_iter().map(|b| b & 1 == 1).collect() })
    }

    /// Fraction of the pages overlapping `[offset, offset + len)` that are resident.
    pub fn fraction(&self, offset: u64, len: u64) -> f64 {
        match self {
            Residency::All { .. } => 1.0,
            Residency::None => 0.0,
            Residency::Pages { page, resident, .. } => {
                if len == 0 {
                    return 1.0;
                }
                let first = (offset / page) as usize;
                let last = (offset + len).div_ceil(*page) as usize;
                let range = resident.get(first..last.min(resident.len())).unwrap_or(&[]);
                if range.is_empty() {
                    return 0.0;
                }
                range.iter().filter(|&&r| r).count() as f64 / range.len() as f64
            }
        }
    }

    /// Resident bytes of the whole file.
    pub fn resident_bytes(&self) -> u64 {
        match self {
            Residency::All { len } => *len,
            Residency::None => 0,
            Residency::Pages { page, len, resident } => {
                let pages = resident.iter().filter(|&&r| r).count() as u64;
                let tail_short = if resident.last() == Some(&true) { resident.len() as u64 * page - len } else { 0 };
                pages * page - tail_short
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_file_just_read_is_resident() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![3u8; 1 << 20]).unwrap();
        let mut f = File::open(&path).unwrap();
        let mut sink = Vec::new();
        f.read_to_end(&mut sink).unwrap();
        let r = Residency::probe(&f, 1 << 20).unwrap();
        assert!(r.fraction(0, 1 << 20) > 0.99, "{r:?}");
        assert_eq!(r.resident_bytes(), 1 << 20);
        let pages = Residency::mincore(&f, 1 << 20, 4096).unwrap();
        assert_eq!(pages.resident_bytes(), 1 << 20);
    }
}
