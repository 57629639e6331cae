//! The CUDA layer's error type.

use cudarc::driver::DriverError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// No usable CUDA driver or device on this machine (the reason says which).
    #[error("CUDA unavailable: {0}")]
    Unavailable(String),
    /// A device index past the devices present.
    #[error("cuda:{ordinal} does not exist ({count} CUDA device(s) present)")]
    NoSuchDevice { ordinal: u32, count: u32 },
    /// Device memory ran out.
    #[error("cuda:{device}: out of memory allocating {bytes} bytes ({free} of {total} bytes free)")]
    OutOfMemory { device: u32, bytes: u64, free: u64, total: u64 },
    /// A copy out of a device buffer would pass its end.
    #[error("cuda:{device}: {len} bytes at offset {offset} lie past the end of a {size}-byte device buffer")]
    OutOfBounds { device: u32, offset: u64, len: u64, size: u64 },
    /// cuFile could not be loaded or opened (not installed, symbols missing, CUDA unusable).
    #[error("{0}")]
    CufileUnavailable(String),
    /// A cuFile call failed, with its status code.
    #[error(transparent)]
    Cufile(#[from] CufileError),
    /// A driver call failed.
    #[error("cuda:{device}: {call} failed: {error}")]
    Driver { device: u32, call: &'static str, error: DriverError },
    /// The caller's device allocator (a [`crate::DeviceAllocator`]) failed for a reason other than memory running
    /// out.
    #[error("cuda:{device}: the {allocator} allocator failed to allocate {bytes} bytes: {why}")]
    Allocator { device: u32, allocator: String, bytes: u64, why: String },
}

impl CudaError {
    pub fn driver(device: u32, call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
        move |error| CudaError::Driver { device, call, error }
    }
}

/// A cuFile failure: the call, cuFile's status (or the negative return of a read/write) and what it means.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cuFile {call} failed: {what} (status {code})")]
pub struct CufileError {
    pub call: &'static str,
    pub code: i64,
    pub what: String,
}

/// An nvCOMP call that failed: the call and nvCOMP's status.
#[derive(Debug, Clone, thiserror::Error)]
#[error("nvCOMP {call} failed: {what} (status {status})")]
pub struct NvcompError {
    pub call: String,
    pub status: i32,
    pub what: String,
}
