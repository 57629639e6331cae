//! Staging memory: one anonymous mapping cut into equal slots, each the buffer of one read in flight. Anonymous
//! `mmap` memory can be both an io_uring fixed buffer and, once registered with the CUDA driver, the source of
//! device DMA (memory from `cuMemHostAlloc` may be refused as a fixed buffer).

use std::fmt;

use memmap2::{Advice, MmapMut};

use crate::error::IoError;
use crate::sink::SinkError;

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
    slot_bytes: usize,
    slots: usize,
}

impl fmt::Debug for Staging {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Staging")
            .field("slot_bytes", &self.slot_bytes)
            .field("slots", &self.slots)
            .field("pinned", &self.pin.is_some())
            .finish()
    }
}

impl Staging {
    /// Maps and touches `slots × slot_bytes` bytes (huge pages where the kernel grants them), then pins them with
    /// `pinner` if one is given.
    pub fn new(slot_bytes: usize, slots: usize, pinner: Option<&dyn Pinner>) -> Result<Staging, IoError> {
        let bytes = slot_bytes.checked_mul(slots).filter(|&b| b > 0);
        let Some(bytes) = bytes else {
            return Err(IoError::Destinations(format!("staging of {slots} slots of {slot_bytes} bytes")));
        };
        let mut map = MmapMut::map_anon(bytes).map_err(|e| IoError::OutOfMemory {
            what: "staging",
            bytes: bytes as u64,
            cause: Some(e),
        })?;
        // No MADV_HUGEPAGE: under the common THP defrag policy "madvise" it can stall in direct compaction.
        // Fault everything in now, in one call where the kernel has MADV_POPULATE_WRITE (5.14+), page by page
        // otherwise: page faults during a load would stall the reads.
        if map.advise(Advice::PopulateWrite).is_err() {
            for page in map.chunks_mut(4096) {
                page[0] = 0;
            }
        }
        let mut s = Staging { pin: None, map, slot_bytes, slots };
        if let Some(p) = pinner {
            s.pin(p)?;
        }
        Ok(s)
    }

    /// Pins the region for device DMA, unless it is pinned already.
    pub fn pin(&mut self, pinner: &dyn Pinner) -> Result<(), IoError> {
        if self.pin.is_none() {
            let bytes = self.map.len();
            // SAFETY: the mapping lives in `Staging` and the guard is dropped before it (field order).
            let guard = unsafe { pinner.pin(self.map.as_mut_ptr(), bytes) }
                .map_err(|cause| IoError::Staging { bytes: bytes as u64, cause })?;
            self.pin = Some(guard);
        }
        Ok(())
    }

    /// The whole region (for registration with the kernel).
    pub fn region(&mut self) -> (*mut u8, usize) {
        (self.map.as_mut_ptr(), self.map.len())
    }

    /// Slot `i`'s address and length.
    pub fn slot_ptr(&mut self, i: usize) -> (*mut u8, usize) {
        debug_assert!(i < self.slots);
        // SAFETY: `i < slots`, so the slot lies inside the mapping of `slots × slot_bytes` bytes.
        (unsafe { self.map.as_mut_ptr().add(i * self.slot_bytes) }, self.slot_bytes)
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
        self.pin.is_some()
    }

    /// Every slot, as exclusive slices.
    pub fn slots_mut(&mut self) -> Vec<&mut [u8]> {
        self.map.chunks_mut(self.slot_bytes).take(self.slots).collect()
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
            self.current = Some(Staging::new(slot_bytes, slots, pinner)?);
        }
        self.current.as_mut().ok_or_else(|| IoError::Destinations("no staging region".into()))
    }

    /// Frees the cached region.
    pub fn release(&mut self) {
        self.current = None;
    }
}
