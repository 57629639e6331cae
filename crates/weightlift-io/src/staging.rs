//! Staging memory: one anonymous mapping cut into equal slots, each the buffer of one read in flight. Anonymous
//! `mmap` memory can be both an io_uring fixed buffer and, once registered with the CUDA driver, the source of
//! device DMA (memory from `cuMemHostAlloc` may be refused as a fixed buffer).

use std::fmt;

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

/// A staging region of `slots` slots of `slot_bytes` each.
pub struct Staging {
    // Declared before `map` so that the memory is unpinned before it is unmapped.
    pin: Option<Box<dyn PinGuard>>,
    map: MmapMut,
    /// Where the region starts in `map` (a huge-page boundary when huge pages were asked for).
    offset: usize,
    slot_bytes: usize,
    slots: usize,
    huge: bool,
}

impl fmt::Debug for Staging {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Staging")
            .field("slot_bytes", &self.slot_bytes)
            .field("slots", &self.slots)
            .field("pinned", &self.pin.is_some())
            .field("huge_pages", &self.huge)
            .finish()
    }
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
        let mut s = Staging::map(slot_bytes, slots, pages)?;
        if let Some(p) = pinner {
            s.pin(p)?;
        }
        Ok(s)
    }

    /// Maps and touches `slots × slot_bytes` bytes (2 MiB transparent huge pages when `pages` asks for them and
    /// the kernel grants them), unpinned.
    pub fn map(slot_bytes: usize, slots: usize, pages: StagingPages) -> Result<Staging, IoError> {
        let bytes = slot_bytes.checked_mul(slots).filter(|&b| b > 0);
        let Some(bytes) = bytes else {
            return Err(IoError::Destinations(format!("staging of {slots} slots of {slot_bytes} bytes")));
        };
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
        // huge pages 16 lanes of 8 MiB set up in 29 ms instead of 57 (bench/results/2026-11-24-h100-j at b3a4ec8,
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
        // Fault everything in now (page faults during a load would stall the reads), by touching each page rather
        // than with one MADV_POPULATE_WRITE: that call holds the process's mmap lock (shared) while it faults the
        // whole range in, and the next lane's `mmap` (which takes it exclusively) waits for it, so 16 lanes setting
        // up at once faulted in one after another. Touching takes the fault path, which on Linux 6.4+ locks only
        // the one mapping. Measured on the H100 machine (bench/results/2026-11-25-h100-o at b3a4ec8): 16 lanes × 8 MiB
        // faulted in by 5.5 ms instead of 21.6, the first load of a fresh process 0.069 s instead of 0.087 (1.25
        // GB) and 0.125 s instead of 0.151 (4.49 GB), medians of 9.
        for page in map[offset..offset + bytes].chunks_mut(4096) {
            page[0] = 0;
        }
        Ok(Staging { pin: None, map, offset, slot_bytes, slots, huge })
    }

    /// Pins the region for device DMA, unless it is pinned already.
    pub fn pin(&mut self, pinner: &dyn Pinner) -> Result<(), IoError> {
        if self.pin.is_none() {
            let (ptr, bytes) = self.region();
            // SAFETY: the mapping lives in `Staging` and the guard is dropped before it (field order).
            let guard =
                unsafe { pinner.pin(ptr, bytes) }.map_err(|cause| IoError::Staging { bytes: bytes as u64, cause })?;
            self.pin = Some(guard);
        }
        Ok(())
    }

    /// The whole region (for registration with the kernel).
    pub fn region(&mut self) -> (*mut u8, usize) {
        let used = self.used();
        (self.map[used].as_mut_ptr(), self.slot_bytes * self.slots)
    }

    /// The part of the mapping the slots take (`map` checked that it lies inside).
    fn used(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.slot_bytes * self.slots
    }

    /// Slot `i`'s address and length.
    pub fn slot_ptr(&mut self, i: usize) -> (*mut u8, usize) {
        debug_assert!(i < self.slots);
        // SAFETY: `i < slots`, so the slot lies inside the region of `slots × slot_bytes` bytes at `offset`.
        (unsafe { self.map.as_mut_ptr().add(self.offset + i * self.slot_bytes) }, self.slot_bytes)
    }

    /// Bytes of each slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// How many slots the region has.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes of all the slots together.
    pub fn bytes(&self) -> u64 {
        (self.slot_bytes * self.slots) as u64
    }

    /// Whether the region is pinned for device DMA (it was made with a pinner).
    pub fn is_pinned(&self) -> bool {
        self.pin.is_some()
    }

    /// Whether the region was given to the kernel for huge pages (it decides, page by page, whether they are).
    pub fn asked_huge_pages(&self) -> bool {
        self.huge
    }

    /// Every slot, as exclusive slices.
    pub fn slots_mut(&mut self) -> Vec<&mut [u8]> {
        let used = self.used();
        self.map[used].chunks_mut(self.slot_bytes).collect()
    }
}

/// Keeps the last staging region for reuse by the next write of the same shape (pinning is not free).
#[derive(Debug, Default)]
pub struct StagingPool {
    current: Option<Staging>,
}

impl StagingPool {
    /// An empty pool.
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
            if let Some((range, _)) = line.split_once(' ')
                && let Some((a, b)) = range.split_once('-')
                && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            {
                inside = a <= start && start < b;
                continue;
            }
            if inside && let Some(v) = line.strip_prefix("AnonHugePages:") {
                return v.trim().trim_end_matches("kB").trim().parse().ok();
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

    #[test]
    fn an_empty_staging_is_an_error() {
        for pages in [StagingPages::Huge, StagingPages::Base] {
            assert!(matches!(Staging::new(0, 4, None, pages), Err(IoError::Destinations(_))));
            assert!(matches!(Staging::new(4096, 0, None, pages), Err(IoError::Destinations(_))));
        }
    }
}
