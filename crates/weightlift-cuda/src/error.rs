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
    /// A driver call failed.
    #[error("cuda:{device}: {call} failed: {error}")]
    Driver { device: u32, call: &'static str, error: DriverError },
}

impl CudaError {
    pub(crate) fn driver(device: u32, call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
        move |error| CudaError::Driver { device, call, error }
    }
}
