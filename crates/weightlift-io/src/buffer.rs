//! Host memory for loaded tensors: aligned allocations that report failure instead of aborting the process.
//!
//! Large buffers are anonymous mappings: the kernel hands out zeroed pages lazily, so a buffer costs nothing until
//! the load writes it (from several I/O threads at once), where `alloc_zeroed` with a 64-byte alignment would
//! memset the whole buffer up front on one thread. Faulting fresh pages in still costs more than copying into them
//! (measured on a 2-vCPU VM: 1–2 GB/s into fresh pages, 11–17 GB/s into reused ones), so the mappings of freed
//! buffers are kept for reuse in a [`HostCache`], up to the engine's `host_cache_bytes` setting.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memmap2::{Advice, MmapMut};

use crate::error::IoError;
use crate::params::HostPages;

/// Mapped buffers are sized in multiples of this, so that freed ones fit later requests.
const MAP_GRAIN: usize = 2 << 20;

/// Mappings of freed host buffers, kept for reuse by later buffers of the same cache, up to a bound. Each engine
/// has one (its `host_cache_bytes` setting); buffers return their mapping to the cache they came from, which lives
/// as long as any of its buffers.
#[derive(Debug)]
pub struct HostCache {
    limit: usize,
    maps: Mutex<CachedMaps>,
    pages: HostPages,
    /// Free 2 MiB blocks the kernel had when last read, less what was mapped since, and when it was read.
    free_huge: Mutex<Option<(Instant, u64)>>,
}

#[derive(Debug, Default)]
struct CachedMaps {
    maps: Vec<MmapMut>,
    bytes: usize,
}

impl HostCache {
    /// A cache keeping at most `limit` bytes of freed mappings (0 keeps none); its new mappings ask for `pages`.
    pub fn new(limit: u64, pages: HostPages) -> Arc<HostCache> {
        Arc::new(HostCache {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            maps: Mutex::default(),
            pages,
            free_huge: Mutex::new(None),
        })
    }

    /// Whether a new mapping of `bytes` asks for 2 MiB pages. Under `auto`, only while the kernel's free 2 MiB
    /// blocks (read at most every 100 ms, less what was mapped since) cover twice what is asked.
    fn huge_pages_for(&self, bytes: usize) -> bool {
        match self.pages {
            HostPages::Huge => true,
            HostPages::Base => false,
            HostPages::Auto => {
                let blocks = bytes.div_ceil(HUGE_PAGE) as u64;
                let mut free = self.free_huge.lock().unwrap_or_else(|p| p.into_inner());
                let fresh = free.is_some_and(|(at, _)| at.elapsed() < Duration::from_millis(100));
                if !fresh {
                    *free = Some((Instant::now(), free_huge_blocks().unwrap_or(0)));
                }
                let Some((_, left)) = free.as_mut() else { return false };
                let enough = *left >= blocks * 2;
                if enough {
                    *left -= blocks;
                }
                enough
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CachedMaps> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A cached mapping of exactly `cap` bytes, if one is there.
    fn take(&self, cap: usize) -> Option<MmapMut> {
        let mut c = self.lock();
        let i = c.maps.iter().position(|m| m.len() == cap)?;
        let m = c.maps.swap_remove(i);
        c.bytes -= m.len();
        Some(m)
    }

    fn give_back(&self, map: MmapMut) {
        let mut c = self.lock();
        if c.bytes + map.len() <= self.limit {
            c.bytes += map.len();
            c.maps.push(map);
        }
    }

    /// Bytes of freed host buffers currently kept for reuse.
    pub fn cached_bytes(&self) -> usize {
        self.lock().bytes
    }

    /// The bound on cached bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Frees every cached mapping.
    pub fn clear(&self) {
        let mut c = self.lock();
        c.maps.clear();
        c.bytes = 0;
    }
}

/// A transparent huge page.
const HUGE_PAGE: usize = 2 << 20;

/// Free blocks of 2 MiB or more the kernel's buddy allocator holds, in 2 MiB units (`/proc/buddyinfo`: per zone,
/// the free blocks of each order; order 9 is 2 MiB with 4 KiB pages). Memory the kernel can give as huge pages at
/// once, without compacting.
fn free_huge_blocks() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/buddyinfo").ok()?;
    let mut total = 0u64;
    for line in text.lines() {
        let counts = line.split_once("zone")?.1.split_whitespace().skip(1);
        for (order, n) in counts.enumerate().filter(|(o, _)| *o >= 9) {
            total += n.parse::<u64>().ok()? << (order - 9);
        }
    }
    Some(total)
}

/// Alignment of every host buffer: a cache line, enough for any element type and for vector loads.
pub const HOST_ALIGN: usize = 64;
/// Buffers at least this large are mapped rather than taken from the allocator.
const MAP_THRESHOLD: usize = 1 << 20;

/// An owned, aligned byte buffer. Fresh memory reads as zeros; recycled memory holds bytes an earlier buffer of
/// this process left (initialised, never another process's data); loads overwrite all of it.
#[derive(Debug)]
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    map: Option<(MmapMut, Option<Arc<HostCache>>)>,
}

// SAFETY: HostBuffer owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for HostBuffer {}
// SAFETY: shared access only hands out `&[u8]`, like Vec<u8>.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates `len` bytes (contents unspecified, see the type); an allocation failure is an error, not an
    /// abort. Large buffers come from, and return to, `cache` when one is given.
    pub fn new(len: usize, cache: Option<&Arc<HostCache>>) -> Result<HostBuffer, IoError> {
        if len == 0 {
            return Ok(HostBuffer { ptr: NonNull::<[u8; HOST_ALIGN]>::dangling().cast(), len: 0, map: None });
        }
        let oom = |cause: Option<std::io::Error>| IoError::OutOfMemory { what: "host", bytes: len as u64, cause };
        if len >= MAP_THRESHOLD {
            // One huge page more than asked, for a 2 MiB-aligned start (address space only: the slack is never
            // touched). 2 MiB pages only where the host pages setting says: where the kernel's THP defrag policy
            // is "madvise" (a common default) a fault in an advised region may stall for direct compaction, which
            // was seen to slow loads tenfold, so `auto` asks for them only while the kernel has free 2 MiB blocks.
            // Faulting fresh 4 KiB pages in was most of a one-shot load into host memory (page faults, zeroing and
            // the page lists: ~35 % of its cycles on the 2-core VM).
            let cap = len.next_multiple_of(MAP_GRAIN);
            let mut map = match cache.and_then(|c| c.take(cap + HUGE_PAGE)) {
                Some(m) => m,
                None => {
                    let map = MmapMut::map_anon(cap + HUGE_PAGE).map_err(|e| oom(Some(e)))?;
                    let offset = map.as_ptr().align_offset(HUGE_PAGE);
                    let huge = cache.is_some_and(|c| c.huge_pages_for(cap));
                    let advice = if huge { Advice::HugePage } else { Advice::NoHugePage };
                    // Advice only: where THP is off it is refused, and the pages are base pages.
                    let _ = map.advise_range(advice, offset, cap);
                    map
                }
            };
            let offset = map.as_ptr().align_offset(HUGE_PAGE);
            // SAFETY: the mapping is page-aligned, so the first 2 MiB boundary lies less than HUGE_PAGE into it, and
            // `offset + cap <= map.len()`.
            let ptr = NonNull::new(unsafe { map.as_mut_ptr().add(offset) }).ok_or_else(|| oom(None))?;
            return Ok(HostBuffer { ptr, len, map: Some((map, cache.cloned())) });
        }
        let layout = Layout::from_size_align(len, HOST_ALIGN).map_err(|_| oom(None))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        NonNull::new(ptr).map(|ptr| HostBuffer { ptr, len, map: None }).ok_or_else(|| oom(None))
    }

    /// The buffer's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte, aligned to [`HOST_ALIGN`] (dangling but aligned for an empty buffer).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The first byte, writable, aligned to [`HOST_ALIGN`] (dangling but aligned for an empty buffer).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for HostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised (zeroed, then written) bytes, or dangling and aligned with
        // `len == 0`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Some((map, cache)) = self.map.take() {
            if let Some(c) = cache {
                c.give_back(map);
            }
            return;
        }
        if self.len > 0 {
            // SAFETY: allocated in `zeroed` with this exact layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, HOST_ALIGN)) }
        }
    }
}
