//! Staging memory: one anonymous mapping cut into equal slots, each the buffer of one read in flight. Anonymous
//! `mmap` memory can be both an io_uring fixed buffer and, once registered with the CUDA driver, the source of
//! device DMA (memory from `cuMemHostAlloc` may be refused as a fixed buffer).

use std::fmt;
use std::sync::Arc;

use memmap2::{Advice, MmapMut};

use crate::error::IoError;
use crate::params::StagingPages;
use crate::sink::SinkError;

/// The size of a transparent huge page on x86-64 and of the common arm64 configuration.
const HUGE_PAGE: usize = 2 << 20;

/// Keeps a memory range pinned for device DMA while it lives (unpins on drop).
pub trait PinGuard: Send + Sync + fmt::Debug {}

/// Pins host memory for device DMA (the CUDA crate implements this with `cuMemHostRegister`). Pinned memory must
/// serve every device (the CUDA implementation pins it as portable).
pub trait Pinner: Send + Sync + fmt::Debug {
    /// Pins `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be a live mapping that outlives the returned guard.
    unsafe fn pin(&self, ptr: *mut u8, len: usize) -> Result<Box<dyn PinGuard>, SinkError>;
}

/// Mapped memory that one staging, or the stagings of several lanes, live in.
pub struct Region {
    // Declared before `map` so that the memory is unpinned before it is unmapped.
    pin: Option<Box<dyn PinGuard>>,
    /// Owns the memory `base` points into (only dropped, never read through).
    #[allow(dead_code)]
    map: MmapMut,
    /// Start of the used range (a huge-page boundary when huge pages were asked for) and its length.
    base: *mut u8,
    bytes: usize,
    huge: bool,
}

// SAFETY: `base` points into `map`, which the region owns and never moves (an anonymous mapping); the stagings
// cut from a shared region use disjoint ranges of it, each from one lane at a time.
unsafe impl Send for Region {}
// SAFETY: as above; shared access reads the address and length only.
unsafe impl Sync for Region {}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("bytes", &self.bytes)
            .field("pinned", &self.pin.is_some())
            .field("huge_pages", &self.huge)
            .finish()
    }
}

impl Region {
    /// Maps and faults in `bytes` bytes (2 MiB transparent huge pages when `pages` asks for them and the kernel
    /// grants them), faulting in with up to `threads` threads at once.
    fn new(bytes: usize, pages: StagingPages, threads: usize) -> Result<Region, IoError> {
        let huge = pages == StagingPages::Huge && bytes >= HUGE_PAGE;
        // A huge page needs a 2 MiB-aligned range: map one huge page more and start at the first boundary. The
        // slack around the region is never touched, so it takes address space only.
        let slack = if huge { HUGE_PAGE } else { 0 };
        let oom = |e| IoError::OutOfMemory { what: "staging", bytes: bytes as u64, cause: Some(e) };
        let mut map =
            MmapMut::map_anon(bytes.checked_add(slack).ok_or_else(|| oom(std::io::ErrorKind::OutOfMemory.into()))?)
                .map_err(oom)?;
        let offset = if huge { map.as_ptr().align_offset(HUGE_PAGE) } else { 0 };
        // The mapping is page-aligned, so the first huge-page boundary lies less than `slack` into it.
        assert!(offset + bytes <= map.len(), "staging offset {offset} past the slack of {slack} bytes");
        // Measured on the H100 host: faulting in and zeroing 4 KiB pages is most of a lane's staging set-up; with
        // huge pages 16 lanes of 8 MiB set up in 29 ms instead of 57 (bench/results/2026-11-24-h100-j,
        // driver_probe.py), a lane of the engine in 2.5 ms instead of 4.1, and the first load of a fresh engine
        // took 1.15-1.25x the second instead of 1.23-1.48x (six interleaved pairs of processes on two machines,
        // 2026-11-24-h100-za and -zb). Warm loads of the same processes were 0-3% slower with huge pages in five
        // of the six pairs, within the hosts' run-to-run spread: a process's first load (often its only one) is
        // what the default favours. Under the THP defrag policy "madvise" (the common default) a huge-page fault
        // may compact memory on a fragmented host: `staging_pages=base` avoids it. Where THP is off the advice is
        // refused or ignored, and the region gets base pages.
        let huge = huge && map.advise_range(Advice::HugePage, offset, bytes).is_ok();
        if pages == StagingPages::Base {
            // Where THP is "always" the kernel would give huge pages unasked: base means base. Advice only.
            let _ = map.advise_range(Advice::NoHugePage, offset, bytes);
        }
        // Fault everything in now, in one call per thread where the kernel has MADV_POPULATE_WRITE (5.14+), page
        // by page otherwise: page faults during a load would stall the reads. Threads fault in disjoint parts of
        // one mapping (a fault takes the address space's lock shared; mapping takes it exclusively, which is why
        // lanes mapping and faulting in each their own region at once slowed each other).
        let part = bytes.div_ceil(threads.max(1)).next_multiple_of(HUGE_PAGE);
        let populated = std::thread::scope(|scope| {
            let map = &map;
            let parts: Vec<_> = (offset..offset + bytes)
                .step_by(part)
                .skip(1)
                .map(|start| {
                    let len = part.min(offset + bytes - start);
                    scope.spawn(move || map.advise_range(Advice::PopulateWrite, start, len).is_ok())
                })
                .collect();
            let first = map.advise_range(Advice::PopulateWrite, offset, part.min(bytes)).is_ok();
            parts.into_iter().fold(first, |all, h| h.join().unwrap_or(false) && all)
        });
        if !populated {
            for page in map[offset..offset + bytes].chunks_mut(4096) {
                page[0] = 0;
            }
        }
        // SAFETY: `offset + bytes <= map.len()` (asserted above).
        let base = unsafe { map.as_mut_ptr().add(offset) };
        Ok(Region { pin: None, map, base, bytes, huge })
    }
}

/// A staging region of `slots` slots of `slot_bytes` each: a region of its own, or a lane's part of a region
/// several lanes share (see [`Staging::shared`]).
pub struct Staging {
    // Declared before `region` so that a pin of this staging alone goes before the memory.
    pin: Option<Box<dyn PinGuard>>,
    region: Arc<Region>,
    /// Where this staging starts in the region's used range.
    start: usize,
    slot_bytes: usize,
    slots: usize,
}

impl fmt::Debug for Staging {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Staging")
            .field("slot_bytes", &self.slot_bytes)
            .field("slots", &self.slots)
            .field("pinned", &self.is_pinned())
            .field("huge_pages", &self.region.huge)
            .field("shared", &(Arc::strong_count(&self.region) > 1 || self.start > 0))
            .finish()
    }
}

fn staging_bytes(slot_bytes: usize, slots: usize) -> Result<usize, IoError> {
    slot_bytes
        .checked_mul(slots)
        .filter(|&b| b > 0)
        .ok_or_else(|| IoError::Destinations(format!("staging of {slots} slots of {slot_bytes} bytes")))
}

impl Staging {
    /// Maps and touches `slots × slot_bytes` bytes (2 MiB transparent huge pages when `pages` asks for them and
    /// the kernel grants them), then pins them with `pinner` if one is given.
    pub fn new(
        slot_bytes: usize,
        slots: usize,
        pinner: Option<&dyn Pinner>,
        pages: StagingPages,
    ) -> Result<Staging, IoError> {
        let bytes = staging_bytes(slot_bytes, slots)?;
        let region = Arc::new(Region::new(bytes, pages, 1)?);
        let mut s = Staging { pin: None, region, start: 0, slot_bytes, slots };
        if let Some(p) = pinner {
            s.pin(p)?;
        }
        Ok(s)
    }

    /// One region for `lanes` stagings of `slots × slot_bytes` bytes, faulted in by up to `threads` threads at
    /// once and pinned with `pinner` as a whole; [`Staging::part`] cuts each lane's staging out of it. A fresh
    /// engine's lanes set up this way in one mapping, one pass of faulting in and one registration with the
    /// driver, instead of one of each per lane while the first lanes' copies already run.
    pub fn shared(
        slot_bytes: usize,
        slots: usize,
        lanes: usize,
        threads: usize,
        pinner: &dyn Pinner,
        pages: StagingPages,
    ) -> Result<Arc<Region>, IoError> {
        let bytes = staging_bytes(slot_bytes, slots)?
            .checked_mul(lanes)
            .filter(|&b| b > 0)
            .ok_or_else(|| IoError::Destinations(format!("staging for {lanes} lanes")))?;
        let mut region = Region::new(bytes, pages, threads)?;
        // SAFETY: the mapping lives in the region, and the guard is dropped before it (field order).
        let guard = unsafe { pinner.pin(region.base, bytes) }
            .map_err(|cause| IoError::Staging { bytes: bytes as u64, cause })?;
        region.pin = Some(guard);
        Ok(Arc::new(region))
    }

    /// Lane `i`'s staging in a region from [`Staging::shared`] of `slots × slot_bytes` bytes per lane.
    ///
    /// # Safety
    /// Each `i` must be taken at most once from a region, and `slots`, `slot_bytes` must be those it was made
    /// with: stagings of one region must not overlap.
    pub unsafe fn part(region: Arc<Region>, i: usize, slot_bytes: usize, slots: usize) -> Result<Staging, IoError> {
        let lane = staging_bytes(slot_bytes, slots)?;
        let start = i.checked_mul(lane).filter(|&s| s + lane <= region.bytes);
        let start = start.ok_or_else(|| IoError::Destinations(format!("no staging {i} of {lane} bytes here")))?;
        Ok(Staging { pin: None, region, start, slot_bytes, slots })
    }

    /// Pins the staging for device DMA, unless it (or the region it is part of) is pinned already.
    pub fn pin(&mut self, pinner: &dyn Pinner) -> Result<(), IoError> {
        if !self.is_pinned() {
            let (ptr, bytes) = self.region();
            // SAFETY: the region lives as long as this staging, and the guard is dropped before it (field order).
            let guard =
                unsafe { pinner.pin(ptr, bytes) }.map_err(|cause| IoError::Staging { bytes: bytes as u64, cause })?;
            self.pin = Some(guard);
        }
        Ok(())
    }

    /// This staging's memory (for registration with the kernel).
    pub fn region(&mut self) -> (*mut u8, usize) {
        // SAFETY: `start + slots × slot_bytes` lies inside the region's used range (checked where it was made).
        (unsafe { self.region.base.add(self.start) }, self.slot_bytes * self.slots)
    }

    /// Slot `i`'s address and length.
    pub fn slot_ptr(&mut self, i: usize) -> (*mut u8, usize) {
        debug_assert!(i < self.slots);
        // SAFETY: `i < slots`, so the slot lies inside this staging's range of the region.
        (unsafe { self.region.base.add(self.start + i * self.slot_bytes) }, self.slot_bytes)
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn bytes(&self) -> u64 {
        (self.slot_bytes * self.slots) as u64
    }

    pub fn is_pinned(&self) -> bool {
        self.pin.is_some() || self.region.pin.is_some()
    }

    /// Whether the region was given to the kernel for huge pages (it decides, page by page, whether they are).
    pub fn asked_huge_pages(&self) -> bool {
        self.region.huge
    }

    /// Every slot, as exclusive slices.
    pub fn slots_mut(&mut self) -> Vec<&mut [u8]> {
        let (ptr, len) = self.region();
        // SAFETY: this staging's range is its own (`part`'s contract for shared regions), lives as long as `self`,
        // and `&mut self` keeps it from being handed out twice.
        let all = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        all.chunks_mut(self.slot_bytes).collect()
    }
}

/// Keeps the last staging region for reuse by the next write of the same shape (pinning is not free).
#[derive(Debug, Default)]
pub struct StagingPool {
    current: Option<Staging>,
}

impl StagingPool {
    pub fn new() -> StagingPool {
        StagingPool::default()
    }

    /// A region of at least `slots` slots of at least `slot_bytes` each and at most `max_bytes` in all, reusing
    /// the cached one when it fits.
    pub fn acquire(
        &mut self,
        slot_bytes: usize,
        slots: usize,
        max_bytes: u64,
        pinner: Option<&dyn Pinner>,
        pages: StagingPages,
    ) -> Result<&mut Staging, IoError> {
        let fits = self.current.as_ref().is_some_and(|s| {
            // Larger slots serve smaller reads, but not much larger ones: a bigger staging footprint falls out of
            // the CPU caches the copies run through (measured: 256 MiB of 16 MiB slots, left by a cold load, cost a
            // following warm load about 4% against 64 MiB of 4 MiB slots).
            s.slot_bytes >= slot_bytes
                && s.slot_bytes <= slot_bytes * 2
                && s.slots >= slots
                && s.slots <= slots * 2
                && s.bytes() <= max_bytes
                // Pinned memory serves unpinned requests as well.
                && (s.is_pinned() || pinner.is_none())
        });
        if !fits {
            self.current = None;
            self.current = Some(Staging::new(slot_bytes, slots, pinner, pages)?);
        }
        self.current.as_mut().ok_or_else(|| IoError::Destinations("no staging region".into()))
    }

    /// Frees the cached region.
    pub fn release(&mut self) {
        self.current = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 2 MiB-aligned region as read from this process's smaps: the kB the kernel backs with huge pages.
    fn anon_huge_kib(start: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                        inside = a <= start && start < b;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(v) = line.strip_prefix("AnonHugePages:") {
                    return v.trim().trim_end_matches("kB").trim().parse().ok();
                }
            }
        }
        None
    }

    #[test]
    fn slots_are_disjoint_and_keep_what_is_written_with_either_page_size() {
        for pages in [StagingPages::Huge, StagingPages::Base] {
            for (slot_bytes, slots) in [(4 << 20, 3), (4096, 5), (3 << 20, 1)] {
                let mut s = Staging::new(slot_bytes, slots, None, pages).unwrap();
                let (base, len) = s.region();
                assert_eq!(len, slot_bytes * slots);
                let huge = pages == StagingPages::Huge && len >= HUGE_PAGE;
                if huge {
                    assert_eq!(base as usize % HUGE_PAGE, 0, "{pages:?} {slot_bytes}×{slots}");
                }
                for i in 0..slots {
                    let (p, n) = s.slot_ptr(i);
                    assert_eq!((p as usize - base as usize, n), (i * slot_bytes, slot_bytes));
                }
                for (i, slot) in s.slots_mut().into_iter().enumerate() {
                    assert_eq!(slot.len(), slot_bytes);
                    for (j, b) in slot.iter_mut().enumerate() {
                        *b = (i * 31 + j * 7 + (j >> 12)) as u8;
                    }
                }
                for (i, slot) in s.slots_mut().into_iter().enumerate() {
                    assert!(slot.iter().enumerate().all(|(j, &b)| b == (i * 31 + j * 7 + (j >> 12)) as u8));
                }
                if huge && s.asked_huge_pages() {
                    // Whether the kernel gave huge pages depends on the machine (THP off, fragmented memory):
                    // printed, not asserted.
                    eprintln!("{slot_bytes}×{slots}: AnonHugePages {:?} kB", anon_huge_kib(base as usize));
                }
            }
        }
    }

    #[derive(Debug)]
    struct NoGuard;
    impl PinGuard for NoGuard {}
    #[derive(Debug)]
    struct NoPin;
    impl Pinner for NoPin {
        unsafe fn pin(&self, _ptr: *mut u8, _len: usize) -> Result<Box<dyn PinGuard>, SinkError> {
            Ok(Box::new(NoGuard))
        }
    }

    #[test]
    fn parts_of_a_shared_region_are_disjoint_pinned_and_bounded() {
        for pages in [StagingPages::Huge, StagingPages::Base] {
            let (slot_bytes, slots, lanes) = (1 << 20, 2, 3);
            let region = Staging::shared(slot_bytes, slots, lanes, 2, &NoPin, pages).unwrap();
            // SAFETY: each part taken once, with the region's shape.
            let mut parts: Vec<Staging> =
                (0..lanes).map(|i| unsafe { Staging::part(region.clone(), i, slot_bytes, slots) }.unwrap()).collect();
            for (i, s) in parts.iter_mut().enumerate() {
                assert!(s.is_pinned());
                let (p, n) = s.region();
                assert_eq!(n, slot_bytes * slots);
                assert_eq!(p as usize - region.base as usize, i * n);
                for slot in s.slots_mut() {
                    slot.fill(i as u8 + 1);
                }
            }
            for (i, s) in parts.iter_mut().enumerate() {
                assert!(s.slots_mut().iter().all(|slot| slot.iter().all(|&b| b == i as u8 + 1)));
            }
            // SAFETY: refused before anything is cut out.
            assert!(unsafe { Staging::part(region.clone(), lanes, slot_bytes, slots) }.is_err());
        }
    }

    #[test]
    fn an_empty_staging_is_an_error() {
        for pages in [StagingPages::Huge, StagingPages::Base] {
            assert!(matches!(Staging::new(0, 4, None, pages), Err(IoError::Destinations(_))));
            assert!(matches!(Staging::new(4096, 0, None, pages), Err(IoError::Destinations(_))));
        }
    }
}
