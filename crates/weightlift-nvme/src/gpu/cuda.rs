//! CUDA pieces the GPU path needs beyond weightlift-cuda, in the same layers: checks that the run-time-loaded
//! libraries have every symbol before cudarc touches them (cudarc panics on a missing one), NVRTC compilation,
//! host memory registered into the device's address space, and the device-memory hook the software controller
//! uses in place of peer-to-peer DMA.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaStream, sys};
use cudarc::nvrtc::Ptx;
use weightlift_cuda::Gpu;

use crate::bus::DeviceDma;
use crate::error::NvmeError;

/// Driver symbols this module calls beyond those weightlift-cuda checks.
const DRIVER_SYMBOLS: &[&str] = &[
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemHostGetDevicePointer_v2",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemsetD8Async",
];

/// Whether the driver has everything the GPU path calls; never panics.
pub(crate) fn check_driver() -> Result<(), NvmeError> {
    weightlift_cuda::available().map_err(NvmeError::gpu("find the CUDA driver"))?;
    let missing =
        weightlift_cuda::missing_driver_symbols(DRIVER_SYMBOLS).map_err(NvmeError::gpu("find the CUDA driver"))?;
    if missing.is_empty() {
        Ok(())
    } else {
        Err(NvmeError::Gpu {
            step: "check the CUDA driver",
            detail: format!("the driver lacks {}", missing.join(", ")),
        })
    }
}

/// Whether NVRTC can be loaded with every symbol the compiler calls; never panics.
pub fn nvrtc_available() -> Result<(), String> {
    weightlift_cuda::nvrtc::available()
}

/// Compiles `source` to PTX for compute capability `arch` (NVRTC's default when `None`). Needs NVRTC only, no
/// GPU.
pub fn compile(source: &str, arch: Option<(i32, i32)>) -> Result<Ptx, NvmeError> {
    weightlift_cuda::nvrtc::compile(source, "weightlift_nvme.cu", arch)
        .map_err(|detail| NvmeError::Gpu { step: "compile the kernel", detail })
}

/// Host memory registered with the driver and mapped into the device's address space; unregistered on drop.
#[derive(Debug)]
pub(crate) struct HostRegistration {
    gpu: Gpu,
    ptr: *mut u8,
    device: sys::CUdeviceptr,
}

// SAFETY: the registration is an address known to the driver; unregistering is thread-safe.
unsafe impl Send for HostRegistration {}
// SAFETY: as above; nothing reads or writes the memory through it.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers `len` bytes at `ptr`. `io_memory` marks a device's MMIO (a real drive's BAR0), which the GPU then
    /// writes with PCIe peer-to-peer stores.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be a live mapping that outlives the registration.
    pub unsafe fn new(gpu: &Gpu, ptr: *mut u8, len: usize, io_memory: bool) -> Result<HostRegistration, NvmeError> {
        gpu.bind().map_err(|e| NvmeError::Gpu { step: "bind the context", detail: e.to_string() })?;
        let mut flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        if io_memory {
            flags |= sys::CU_MEMHOSTREGISTER_IOMEMORY;
        }
        // SAFETY: per the contract the range is a live mapping that outlives the registration.
        unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, flags) }.result().map_err(|e| NvmeError::Gpu {
            step: "register host memory (cuMemHostRegister)",
            detail: format!("{len} bytes{}: {e}", if io_memory { " of I/O memory" } else { "" }),
        })?;
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` was registered with DEVICEMAP just above; the out-pointer is valid.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, ptr.cast(), 0) }.result();
        let reg = HostRegistration { gpu: gpu.clone(), ptr, device };
        r.map_err(|e| NvmeError::Gpu {
            step: "map host memory into the device (cuMemHostGetDevicePointer)",
            detail: e.to_string(),
        })?;
        Ok(reg)
    }

    pub fn device_ptr(&self) -> u64 {
        self.device
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: registered in `new`, unregistered once, before the mapping goes away (the owner drops this first).
        if let Err(e) = unsafe { sys::cuMemHostUnregister(self.ptr.cast()) }.result() {
            tracing::warn!("unregistering host memory: {e}");
        }
    }
}

/// Device memory moved by the copy engines on streams of their own, standing in for a drive's peer-to-peer writes:
/// each copy is complete when the call returns, and never waits for the kernel polling the queues (the streams are
/// non-blocking and nothing synchronises the context).
#[derive(Debug)]
pub(crate) struct CudaDma {
    gpu: Gpu,
    streams: Mutex<Vec<Arc<CudaStream>>>,
}

impl CudaDma {
    pub fn new(gpu: &Gpu) -> CudaDma {
        CudaDma { gpu: gpu.clone(), streams: Mutex::new(Vec::new()) }
    }

    fn with_stream(&self, f: impl FnOnce(sys::CUstream) -> Result<(), String>) -> Result<(), String> {
        self.gpu.bind().map_err(|e| e.to_string())?;
        let pooled = self.streams.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let stream = match pooled {
            Some(s) => s,
            None => self.gpu.context().new_stream().map_err(|e| format!("cuStreamCreate: {e}"))?,
        };
        let r = f(stream.cu_stream()).and_then(|()| {
            // SAFETY: a live stream of this context.
            unsafe { sys::cuStreamSynchronize(stream.cu_stream()) }
                .result()
                .map_err(|e| format!("cuStreamSynchronize: {e}"))
        });
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).push(stream);
        r
    }
}

impl DeviceDma for CudaDma {
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), String> {
        self.with_stream(|s| {
            // SAFETY: the controller only calls this for ranges inside a device window mapped by the loader, which
            // owns that device memory for the window's life; `data` is a host buffer of the given length that
            // outlives the synchronised copy.
            unsafe { sys::cuMemcpyHtoDAsync_v2(addr, data.as_ptr().cast(), data.len(), s) }
                .result()
                .map_err(|e| format!("cuMemcpyHtoDAsync of {} bytes to {addr:#x}: {e}", data.len()))
        })
    }

    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), String> {
        self.with_stream(|s| {
            // SAFETY: as for `write`, with `out` writable for its length until the synchronised copy completes.
            unsafe { sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), addr, out.len(), s) }
                .result()
                .map_err(|e| format!("cuMemcpyDtoHAsync of {} bytes from {addr:#x}: {e}", out.len()))
        })
    }
}
