//! Which parts of a file are in the page cache.
//!
//! `cachestat(2)` (Linux 6.5+) counts a range's cached pages by walking its folios: cheap for a file the page
//! cache holds in large folios (one written, or read sequentially), but a file cached as 4 KiB folios — after a
//! cold load's parallel buffered reads, say — costs about 2 ms per cached GiB (7–11 ms for 4 GiB on the H100
//! machine, `bench/results/2026-11-24-h100-zi`), paid before every load. A file over [`SAMPLED_ABOVE`] is therefore
//! first probed at [`SAMPLES`] places of [`SAMPLE_BYTES`] spread over it: all of them wholly cached or all of them
//! empty — the usual cases, a warm or a cold checkpoint — settles it; otherwise, and for smaller files, one
//! `cachestat` over the whole file; a file partly cached then gets a per-page bitmap from `mincore(2)` on a
//! mapping of the file that is never read. Without `cachestat`, `mincore` alone. A sampled answer can miss a
//! partly evicted stretch between the samples: the pages there are then read as cached pages are (buffered, in
//! requests of the cached size), which costs speed, never bytes.
use std::fs::File;
use std::os::fd::AsRawFd;

/// Files larger than this are probed at a few places first (see the module's documentation).
pub const SAMPLED_ABOVE: u64 = 256 << 20;
/// Places probed in a large file.
pub const SAMPLES: u64 = 32;
/// Bytes probed at each place.
pub const SAMPLE_BYTES: u64 = 1 << 20;

/// Where a file's pages are.
#[derive(Clone, Debug)]
pub enum Residency {
    /// Every page is cached (`sampled`: every one of the places probed was).
    All { len: u64, sampled: bool },
    /// No page is cached (`sampled`: none of the places probed had any).
    None { sampled: bool },
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

/// Cached pages of `len` bytes of the file from `off` (`len` 0: to its end), or `None` where the kernel has no
/// `cachestat`.
fn cachestat_pages(file: &File, off: u64, len: u64) -> Option<u64> {
    let range = CachestatRange { off, len };
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
            return Some(Residency::None { sampled: false });
        }
        // tmpfs pages live in memory (or swap), and O_DIRECT there is a memory copy too: count them as cached.
        if rustix::fs::fstatfs(file).is_ok_and(|st| is_tmpfs(st.f_type)) {
            return Some(Residency::All { len, sampled: false });
        }
        let page = rustix::param::page_size() as u64;
        if len > SAMPLED_ABOVE {
            if let Some(r) = Self::sampled(file, len, page) {
                return Some(r);
            }
        }
        let pages = len.div_ceil(page);
        match cachestat_pages(file, 0, 0) {
            Some(0) => return Some(Residency::None { sampled: false }),
            Some(n) if n >= pages => return Some(Residency::All { len, sampled: false }),
            _ => {}
        }
        Self::mincore(file, len, page)
    }

    /// `All` or `None` if every place probed says so; `None` (no answer) if they differ or `cachestat` is missing.
    fn sampled(file: &File, len: u64, page: u64) -> Option<Residency> {
        let (mut full, mut empty) = (true, true);
        let last_start = (len - SAMPLE_BYTES) / page * page;
        for i in 0..SAMPLES {
            let off = (last_start * i / (SAMPLES - 1)) / page * page;
            let want = SAMPLE_BYTES.min(len - off).div_ceil(page);
            let n = cachestat_pages(file, off, SAMPLE_BYTES)?;
            full &= n >= want;
            empty &= n == 0;
            if !full && !empty {
                return None;
            }
        }
        if full { Some(Residency::All { len, sampled: true }) } else { Some(Residency::None { sampled: true }) }
    }

    /// Whether the answer came from probing a few places of the file rather than all of it.
    pub fn is_sampled(&self) -> bool {
        matches!(self, Residency::All { sampled: true, .. } | Residency::None { sampled: true })
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
            Residency::None { .. } => 0.0,
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
            Residency::All { len, .. } => *len,
            Residency::None { .. } => 0,
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

    fn drop_from_cache(f: &File, offset: u64, len: u64) {
        // SAFETY: plain advice on a valid descriptor.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), offset as i64, len as i64, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
    }

    /// A file over the sampling threshold: wholly cached, wholly dropped, and cached but for one stretch the
    /// samples hit (then the whole-file answer, exact), each checked against `mincore`'s per-page count.
    #[test]
    fn large_files_are_sampled_and_partly_cached_ones_fall_back_to_the_exact_probe() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        let len = SAMPLED_ABOVE + (5 << 20) + 1234;
        std::fs::write(&path, (0..len).map(|i| (i % 251) as u8).collect::<Vec<u8>>()).unwrap();
        let mut f = File::open(&path).unwrap();
        f.sync_all().unwrap(); // dirty pages are not dropped
        let page = rustix::param::page_size() as u64;
        let mut sink = Vec::new();
        f.read_to_end(&mut sink).unwrap();
        let exact = |f: &File| Residency::mincore(f, len, page).unwrap().resident_bytes();
        let Some(has_cachestat) = cachestat_pages(&f, 0, 0).map(|_| true) else {
            // No cachestat: the probe is mincore's, exact.
            assert_eq!(Residency::probe(&f, len).unwrap().resident_bytes(), exact(&f));
            return;
        };
        assert!(has_cachestat);
        if exact(&f) != len {
            eprintln!("the page cache did not keep the whole file here (memory pressure?): nothing to check");
            return;
        }
        let warm = Residency::probe(&f, len).unwrap();
        assert!(matches!(warm, Residency::All { sampled: true, .. }), "{warm:?}");
        assert_eq!(warm.resident_bytes(), len);
        assert!(warm.is_sampled());

        // The first sample sits at offset 0: drop the first 4 MiB (whole folios, whatever their size) and the
        // samples disagree.
        drop_from_cache(&f, 0, 4 << 20);
        if exact(&f) == len {
            eprintln!("the kernel kept the dropped range cached: the partial case was not checked");
        } else {
            let partial = Residency::probe(&f, len).unwrap();
            assert!(!partial.is_sampled(), "{partial:?}");
            assert_eq!(partial.resident_bytes(), exact(&f));
            assert!(partial.fraction(0, 1 << 20) < 0.5 && partial.fraction(8 << 20, 1 << 20) > 0.99, "{partial:?}");
        }

        drop_from_cache(&f, 0, 0);
        if exact(&f) == 0 {
            let cold = Residency::probe(&f, len).unwrap();
            assert!(matches!(cold, Residency::None { sampled: true }), "{cold:?}");
            assert_eq!(cold.resident_bytes(), 0);
        }
    }
}
