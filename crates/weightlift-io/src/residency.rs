//! Which parts of a file are in the page cache.
//!
//! `cachestat(2)` (Linux 6.5+) counts a range's cached pages by walking its folios: cheap for a file the page
//! cache holds in large folios (one written, or read sequentially), but a file cached as 4 KiB folios — after a
//! cold load's parallel buffered reads, say — costs about 2 ms per cached GiB (7–11 ms for 4 GiB on the H100
//! machine, `bench/results/2026-11-24-h100-zi at b3a4ec8`), paid before every load. A load that reads most of a span over
//! [`SAMPLED_ABOVE`] ([`Residency::probe_for`]) therefore first probes [`SAMPLES`] places of [`SAMPLE_BYTES`]
//! spread over that span: all of them wholly cached or all of them (nearly) empty — the usual cases, a warm or a
//! cold checkpoint — settles it. Otherwise, for smaller loads, for loads of a few ranges of a large file, and for
//! [`Residency::probe`], one `cachestat` over the whole file; a file partly cached then gets a per-page bitmap from
//! `mincore(2)` on a mapping of the file that is never read. Without `cachestat`, `mincore` alone. A sampled
//! answer can miss a partly evicted stretch between the samples (or a few cached pages in a cold file): the pages
//! there are then read as the rest is, which costs speed, never bytes.

use std::fs::File;
use std::os::fd::AsRawFd;

/// A load of most of a span of a file larger than this probes a few places of it first (see the module's
/// documentation).
pub const SAMPLED_ABOVE: u64 = 256 << 20;
/// Places probed in such a span.
pub const SAMPLES: u64 = 32;
/// Bytes probed at each place.
pub const SAMPLE_BYTES: u64 = 1 << 20;

/// Where a file's pages are.
#[derive(Clone, Debug)]
pub enum Residency {
    /// Every page is cached.
    All {
        /// The file's length in bytes.
        len: u64,
    },
    /// No page is cached.
    None,
    /// Every place probed in a span of `bytes` bytes was wholly cached (`cached`), or at most a quarter cached;
    /// taken to hold for every range the load asks about.
    Sampled {
        /// Whether the places probed were wholly cached.
        cached: bool,
        /// The span's length in bytes.
        bytes: u64,
    },
    /// Per-page bitmap.
    Pages {
        /// The page size in bytes.
        page: u64,
        /// The file's length in bytes.
        len: u64,
        /// Whether each page, from the file's start, is cached.
        resident: Vec<bool>,
    },
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

/// Where [`Residency::probe_for`] probes a span `lo..hi` of over [`SAMPLED_ABOVE`] bytes: the middle of each of
/// [`SAMPLES`] equal parts, on a page boundary. Not the span's ends: opening a cold checkpoint reads its header,
/// and read-ahead caches the data just after it.
fn sample_offsets(lo: u64, hi: u64, page: u64) -> impl Iterator<Item = u64> {
    let part = (hi - lo) / SAMPLES;
    (0..SAMPLES).map(move |i| (lo + i * part + part / 2 - SAMPLE_BYTES / 2) / page * page)
}

impl Residency {
    /// Probes `file` (`len` bytes) exactly. Returns `None` when neither probe is possible.
    pub fn probe(file: &File, len: u64) -> Option<Residency> {
        Self::probe_for(file, len, 0, 0, 0)
    }

    /// Probes `file` (`len` bytes) for a load that reads `requested` bytes between `lo` and `hi`: by samples
    /// where that span is over [`SAMPLED_ABOVE`] and the load reads at least nine tenths of it, exactly otherwise
    /// (see the module's documentation). Returns `None` when neither probe is possible.
    pub fn probe_for(file: &File, len: u64, lo: u64, hi: u64, requested: u64) -> Option<Residency> {
        if len == 0 {
            return Some(Residency::None);
        }
        // tmpfs pages live in memory (or swap), and O_DIRECT there is a memory copy too: count them as cached.
        if rustix::fs::fstatfs(file).is_ok_and(|st| is_tmpfs(st.f_type)) {
            return Some(Residency::All { len });
        }
        let page = rustix::param::page_size() as u64;
        let hi = hi.min(len);
        let span = hi.saturating_sub(lo);
        if span > SAMPLED_ABOVE
            && requested.saturating_mul(10) >= span.saturating_mul(9)
            && let Some(r) = Self::sampled(file, lo, hi, page)
        {
            return Some(r);
        }
        let pages = len.div_ceil(page);
        match cachestat_pages(file, 0, 0) {
            Some(0) => return Some(Residency::None),
            Some(n) if n >= pages => return Some(Residency::All { len }),
            _ => {}
        }
        Self::mincore(file, len, page)
    }

    /// [`Residency::Sampled`] if every place probed in `lo..hi` (over [`SAMPLED_ABOVE`] bytes) says the same; no
    /// answer if they differ or `cachestat` is missing.
    fn sampled(file: &File, lo: u64, hi: u64, page: u64) -> Option<Residency> {
        let (mut full, mut empty) = (true, true);
        let want = SAMPLE_BYTES.div_ceil(page);
        for off in sample_offsets(lo, hi, page) {
            let n = cachestat_pages(file, off, SAMPLE_BYTES)?;
            full &= n >= want;
            // A quarter of a place cached still counts as empty (a few stray pages of a cold file).
            empty &= n <= want / 4;
            if !full && !empty {
                return None;
            }
        }
        Some(Residency::Sampled { cached: full, bytes: hi - lo })
    }

    /// Whether the answer came from probing a few places of the file rather than all of it.
    pub fn is_sampled(&self) -> bool {
        matches!(self, Residency::Sampled { .. })
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
            Residency::Sampled { cached, .. } => f64::from(u8::from(*cached)),
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
            Residency::Sampled { cached: true, bytes } => *bytes,
            Residency::Sampled { cached: false, .. } => 0,
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

    /// Dropped ranges start on a 2 MiB boundary, so that no large folio straddles their start.
    const HOLE_ALIGN: u64 = 2 << 20;

    fn drop_from_cache(f: &File, offset: u64, len: u64) {
        // SAFETY: plain advice on a valid descriptor.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), offset as i64, len as i64, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
    }

    /// A load of most of a file over the sampling threshold: wholly cached, cached but for a stretch a sample hits
    /// (then the exact probe), and dropped; a load of a few ranges of it is probed exactly. Checked against
    /// `mincore`'s per-page answer.
    #[test]
    fn large_loads_are_sampled_and_partly_cached_files_fall_back_to_the_exact_probe() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        let len = SAMPLED_ABOVE + (5 << 20) + 1234;
        {
            let mut w = std::io::BufWriter::new(File::create(&path).unwrap());
            let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
            let mut left = len as usize;
            while left > 0 {
                let n = left.min(chunk.len());
                std::io::Write::write_all(&mut w, &chunk[..n]).unwrap();
                left -= n;
            }
            w.into_inner().unwrap().sync_all().unwrap(); // dirty pages would not be dropped below
        }
        let mut f = File::open(&path).unwrap();
        if rustix::fs::fstatfs(&f).is_ok_and(|st| is_tmpfs(st.f_type)) {
            eprintln!("the temporary directory is on tmpfs, where every page counts as cached: nothing to sample");
            return;
        }
        let mut buf = vec![0u8; 1 << 20];
        while f.read(&mut buf).unwrap() > 0 {}
        let page = rustix::param::page_size() as u64;
        let exact = |f: &File| Residency::mincore(f, len, page).unwrap().resident_bytes();
        if cachestat_pages(&f, 0, 0).is_none() {
            // No cachestat: the probe is mincore's, exact.
            assert_eq!(Residency::probe_for(&f, len, 0, len, len).unwrap().resident_bytes(), exact(&f));
            return;
        }
        if exact(&f) != len {
            eprintln!("the page cache did not keep the whole file here (memory pressure?): nothing to check");
            return;
        }
        let warm = Residency::probe_for(&f, len, 100, len, len - 100).unwrap();
        assert!(matches!(warm, Residency::Sampled { cached: true, bytes } if bytes == len - 100), "{warm:?}");
        assert_eq!(warm.fraction(12345, 1 << 20), 1.0);
        // A load of a third of the file, or a small file's load, is probed exactly.
        assert!(!Residency::probe_for(&f, len, 0, len, len / 3).unwrap().is_sampled());
        assert!(!Residency::probe(&f, len).unwrap().is_sampled());

        // Drop 4 MiB around the first place probed (whole folios, whatever their size): the samples disagree.
        let first = sample_offsets(0, len, page).next().unwrap();
        let (hole, hole_len) = ((first - (1 << 20)) / HOLE_ALIGN * HOLE_ALIGN, 4 << 20);
        drop_from_cache(&f, hole, hole_len);
        if exact(&f) == len {
            eprintln!("the kernel kept the dropped range cached: the partial case was not checked");
        } else {
            let partial = Residency::probe_for(&f, len, 0, len, len).unwrap();
            assert!(!partial.is_sampled(), "{partial:?}");
            assert!(partial.resident_bytes() < len);
            assert!(partial.fraction(first, SAMPLE_BYTES) < 0.5, "{partial:?}");
            assert!(partial.fraction(hole + hole_len + (4 << 20), 1 << 20) > 0.99, "{partial:?}");
        }

        drop_from_cache(&f, 0, 0);
        if exact(&f) == 0 {
            let cold = Residency::probe_for(&f, len, 0, len, len).unwrap();
            assert!(matches!(cold, Residency::Sampled { cached: false, .. }), "{cold:?}");
            assert_eq!((cold.resident_bytes(), cold.fraction(0, len)), (0, 0.0));
            // Reading a header at the start (and the read-ahead after it) leaves the file cold to the samples.
            let mut header = vec![0u8; 80 << 10];
            std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0)).unwrap();
            f.read_exact(&mut header).unwrap();
            let opened = Residency::probe_for(&f, len, 80 << 10, len, len - (80 << 10)).unwrap();
            assert!(matches!(opened, Residency::Sampled { cached: false, .. }), "{opened:?}");
        }
    }
}
