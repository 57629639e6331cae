//! Writes: host or device memory into a file, through staging slots (pinned for device memory).

use std::path::Path;

use weightlift_cuda::Gpu;

use super::{Engine, lock};
use crate::error::Result;
use crate::tensor::{RawSrc, TensorData};

impl Engine {
    /// Writes a loaded tensor's bytes into `path` at `offset` (durably when asked); returns the bytes written.
    pub fn write_tensor(&self, path: &Path, offset: u64, data: &TensorData, durable: bool) -> Result<u64> {
        let src = match data {
            TensorData::Host(b) => RawSrc::Host(b.as_ptr()),
            TensorData::Pinned(b) => RawSrc::Host(b.as_ptr()),
            TensorData::Device(d) => RawSrc::Device { ordinal: d.block.gpu().ordinal(), ptr: d.device_ptr() },
        };
        // SAFETY: `data` is borrowed for the whole call: its memory stays allocated and unmodified meanwhile.
        unsafe { self.write_from(path, offset, data.len() as u64, src, durable) }
    }

    /// Writes `len` bytes of caller memory into `path` at `offset` (creating the file if needed, never truncating
    /// it), then `fsync`s it when `durable`. Returns the bytes written.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes (device memory of the named device for `Device`) and not be
    /// written by anything else until this returns.
    pub unsafe fn write_from(&self, path: &Path, offset: u64, len: u64, src: RawSrc, durable: bool) -> Result<u64> {
        // SAFETY: the same contract.
        unsafe { self.write_from_with(path, offset, len, src, durable, None) }
    }

    /// [`Engine::write_from`] with faults injected into its writes (tests).
    ///
    /// # Safety
    /// As for [`Engine::write_from`].
    pub unsafe fn write_from_with(
        &self,
        path: &Path,
        offset: u64,
        len: u64,
        src: RawSrc,
        durable: bool,
        faults: Option<&weightlift_io::fault::FaultPlan>,
    ) -> Result<u64> {
        use weightlift_io::write::{HostSource, WriteRequest, WriteSource, write_at};
        let req = WriteRequest { path, offset, len, durable, faults };
        let params = self.settings.io_params();
        let mut pool = lock(&self.write_pool);
        let report = match src {
            RawSrc::Host(ptr) => {
                // SAFETY: the caller guarantees `ptr` is valid for reads of `len` bytes during the call.
                let data = unsafe { std::slice::from_raw_parts(ptr, len as usize) };
                write_at(&params, &req, &HostSource(data), &mut pool, None)?
            }
            RawSrc::Device { ordinal, ptr } => {
                // The copies out and the pinning below bind the device on this (the caller's) thread.
                let _restore = weightlift_cuda::ContextRestore::save();
                let gpu = self.gpu(ordinal)?;
                /// Device memory copied out chunk by chunk into (pinned) staging slots.
                struct DeviceSource<'a> {
                    gpu: &'a Gpu,
                    ptr: weightlift_cuda::CUdeviceptr,
                }
                impl WriteSource for DeviceSource<'_> {
                    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), weightlift_io::SinkError> {
                        // SAFETY: `write_from`'s caller guarantees the device range is readable; `buf` lies within it.
                        Ok(unsafe { weightlift_cuda::copy_device_to_host(self.gpu, self.ptr + offset, buf) }?)
                    }
                }
                let pinner = weightlift_cuda::CudaPinner::new(&gpu);
                write_at(&params, &req, &DeviceSource { gpu: &gpu, ptr }, &mut pool, Some(&pinner))?
            }
        };
        Ok(report.bytes)
    }
}
