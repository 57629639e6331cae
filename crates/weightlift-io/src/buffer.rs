//! Host memory for loaded tensors: aligned allocations that report failure instead of aborting the process.
//!
//! Large buffers are anonymous mappings: the kernel hands out zeroed pages lazily, so a buffer costs nothing until
//! the load writes it (from several I/O threads at once), where `alloc_zeroed` with a 64-byte alignment would
//! memset the whole buffer up front on one thread. Faulting fresh pages in still costs more than copying into them
//! (measured on a 2-vCPU VM: 1–2 GB/s into fresh pages, 11–17 GB/s into reused ones), so the mappings of freed
//! buffers are kept for reuse, up to `WEIGHTLIFT_HOST_CACHE_BYTES` (default 1 GiB) in all.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::{Mutex, OnceLock};

use memmap2::MmapMut;

use crate::error::IoError;

/// Mapped buffers are sized in multiples of this, so that freed ones fit later requests.
const MAP_GRAIN: usize = 2 << 20;
const DEFAULT_HOST_CACHE: usize = 1 << 30;

struct Cache {
    maps: Vec<MmapMut>,
    bytes: usize,
}

static CACHE: Mutex<Cache> = Mutex::new(Cache { maps: Vec::new(), bytes: 0 });

/// The bound on cached mappings (`WEIGHTLIFT_HOST_CACHE_BYTES`, read once).
pub fn host_cache_limit() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var("WEIGHTLIFT_HOST_CACHE_BYTES")
            .ok()
            .and_then(|v| crate::config::parse_bytes(&v).ok())
            .map_or(DEFAULT_HOST_CACHE, |b| b as usize)
    })
}

/// A cached mapping of exactly `cap` bytes, if one is there.
fn take_cached(cap: usize) -> Option<MmapMut> {
    let mut c = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let i = c.maps.iter().position(|m| m.len() == cap)?;
    let m = c.maps.swap_remove(i);
    c.bytes -= m.len();
    Some(m)
}

fn give_back(map: MmapMut) {
    let limit = host_cache_limit();
    let mut c = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if c.bytes + map.len() <= limit {
        c.bytes += map.len();
        c.maps.push(map);
    }
}

/// Bytes of freed host buffers currently kept for reuse.
pub fn host_cache_bytes() -> usize {
    CACHE.lock().unwrap_or_else(|p| p.into_inner()).bytes
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
    map: Option<MmapMut>,
}

// SAFETY: HostBuffer owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for HostBuffer {}
// SAFETY: shared access only hands out `&[u8]`, like Vec<u8>.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates `len` bytes (contents unspecified, see the type); an allocation failure is an error, not an
    /// abort.
    pub fn new(len: usize) -> Result<HostBuffer, IoError> {
        if len == 0 {
            return Ok(HostBuffer { ptr: NonNull::<[u8; HOST_ALIGN]>::dangling().cast(), len: 0, map: None });
        }
        let oom =
            |detail: String| IoError::Staging { bytes: len as u64, reason: format!("out of host memory{detail}") };
        if len >= MAP_THRESHOLD {
            // No MADV_HUGEPAGE: where the kernel's THP defrag policy is "madvise" (a common default), a fault in
            // an advised region may stall for direct compaction, which was seen to slow loads tenfold.
            let cap = len.next_multiple_of(MAP_GRAIN);
            let mut map = match take_cached(cap) {
                Some(m) => m,
                None => MmapMut::map_anon(cap).map_err(|e| oom(format!(": {e}")))?,
            };
            let ptr = NonNull::new(map.as_mut_ptr()).ok_or_else(|| oom(String::new()))?;
            return Ok(HostBuffer { ptr, len, map: Some(map) });
        }
        let layout = Layout::from_size_align(len, HOST_ALIGN).map_err(|_| oom(String::new()))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        NonNull::new(ptr).map(|ptr| HostBuffer { ptr, len, map: None }).ok_or_else(|| oom(String::new()))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

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
        if let Some(map) = self.map.take() {
            give_back(map);
            return;
        }
        if self.len > 0 {
            // SAFETY: allocated in `zeroed` with this exact layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, HOST_ALIGN)) }
        }
    }
}
