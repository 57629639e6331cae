//! The CUDA layer's error type.

use cudarc::driver::DriverError;

/// A CUDA failure: no driver or device, memory, a driver call, cuFile, or a caller's allocator. Displays as one line
/// naming the device (`cuda:N`) where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// No usable CUDA driver or device on this machine (the reason says which).
    #[error("CUDA unavailable: {0}")]
    Unavailable(String),
    /// A device index past the devices present.
    #[error("cuda:{ordinal} does not exist ({count} CUDA device(s) present)")]
    NoSuchDevice {
        /// The index asked for.
        ordinal: u32,
        /// How many devices the driver sees.
        count: u32,
    },
    /// Device memory (or, from [`crate::PinnedBuffer::alloc`], page-locked host memory) ran out.
    #[error("cuda:{device}: out of memory allocating {bytes} bytes ({free} of {total} bytes free)")]
    OutOfMemory {
        /// The device's index.
        device: u32,
        /// The allocation that failed, in bytes.
        bytes: u64,
        /// The device's free memory in bytes when it failed (`cuMemGetInfo`); 0 where unknown (that call failed
        /// too, or the memory was page-locked host memory).
        free: u64,
        /// The device's memory in bytes; 0 where unknown, as for `free`.
        total: u64,
    },
    /// A copy out of a device buffer would pass its end.
    #[error("cuda:{device}: {len} bytes at offset {offset} lie past the end of a {size}-byte device buffer")]
    OutOfBounds {
        /// The device's index.
        device: u32,
        /// Where the copy would start in the buffer, in bytes.
        offset: u64,
        /// The bytes it would copy.
        len: u64,
        /// The buffer's length in bytes.
        size: u64,
    },
    /// cuFile could not be loaded or opened (not installed, symbols missing, CUDA unusable).
    #[error("{0}")]
    CufileUnavailable(String),
    /// A cuFile call failed, with its status code.
    #[error(transparent)]
    Cufile(#[from] CufileError),
    /// A driver call failed.
    #[error("cuda:{device}: {call} failed: {error}")]
    Driver {
        /// The device's index.
        device: u32,
        /// The driver API function that failed (`cuMemAllocAsync`, say).
        call: &'static str,
        /// The driver's `CUresult`.
        error: DriverError,
    },
    /// The caller's device allocator (a [`crate::DeviceAllocator`]) failed for a reason other than memory running
    /// out.
    #[error("cuda:{device}: the {allocator} allocator failed to allocate {bytes} bytes: {why}")]
    Allocator {
        /// The device's index.
        device: u32,
        /// The allocator's name ([`crate::DeviceAllocator::name`]).
        allocator: String,
        /// The allocation that failed, in bytes.
        bytes: u64,
        /// What the allocator said.
        why: String,
    },
}

impl CudaError {
    /// For `map_err` on a driver call's result: turns its `DriverError` into [`CudaError::Driver`] naming `device`
    /// and `call`.
    pub fn driver(device: u32, call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
        move |error| CudaError::Driver { device, call, error }
    }
}

/// A cuFile failure: the call, cuFile's status (or the negative return of a read/write) and what it means.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cuFile {call} failed: {what} (status {code})")]
pub struct CufileError {
    /// The cuFile function that failed (`cuFileRead`, say).
    pub call: &'static str,
    /// cuFile's status (a `CUfileOpError`, 5000 and up), or the negative value a read or write returned (`-errno`
    /// or a negated cuFile status).
    pub code: i64,
    /// What the code means, in words.
    pub what: String,
}

/// An nvCOMP call that failed: the call and nvCOMP's status.
#[derive(Debug, Clone, thiserror::Error)]
#[error("nvCOMP {call} failed: {what} (status {status})")]
pub struct NvcompError {
    /// The nvCOMP function that failed.
    pub call: String,
    /// nvCOMP's `nvcompStatus_t`.
    pub status: i32,
    /// What the status means, in words.
    pub what: String,
}
