//! Host memory for loaded tensors: aligned allocations that report failure instead of aborting the process.
//!
//! Large buffers are anonymous mappings: the kernel hands out zeroed pages lazily, so a buffer costs nothing until
//! the load writes it (from several I/O threads at once), where `alloc_zeroed` with a 64-byte alignment would
//! memset the whole buffer up front on one thread.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use memmap2::MmapMut;

use crate::error::IoError;

/// Alignment of every host buffer: a cache line, enough for any element type and for vector loads.
pub const HOST_ALIGN: usize = 64;
/// Buffers at least this large are mapped rather than taken from the allocator.
const MAP_THRESHOLD: usize = 1 << 20;

/// An owned, aligned, zero-initialised byte buffer.
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
    /// Allocates `len` zeroed bytes; an allocation failure is an error, not an abort.
    pub fn zeroed(len: usize) -> Result<HostBuffer, IoError> {
        if len == 0 {
            return Ok(HostBuffer { ptr: NonNull::<[u8; HOST_ALIGN]>::dangling().cast(), len: 0, map: None });
        }
        let oom =
            |detail: String| IoError::Staging { bytes: len as u64, reason: format!("out of host memory{detail}") };
        if len >= MAP_THRESHOLD {
            // No MADV_HUGEPAGE: where the kernel's THP defrag policy is "madvise" (a common default), a fault in
            // an advised region may stall for direct compaction, which was seen to slow loads tenfold.
            let mut map = MmapMut::map_anon(len).map_err(|e| oom(format!(": {e}")))?;
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
        if self.len > 0 && self.map.is_none() {
            // SAFETY: allocated in `zeroed` with this exact layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, HOST_ALIGN)) }
        }
    }
}
