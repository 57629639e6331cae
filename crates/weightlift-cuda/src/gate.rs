//! Stream-ordered host work: a gate that a CUDA stream waits at (`cuStreamWaitValue32` on a flag in mapped pinned
//! memory) until a host thread opens it. The host thread first waits for the work queued on the stream before the
//! gate (an event), does its I/O, then opens the gate: the stream's later kernels see the I/O's result, as with
//! `cuFileReadAsync`.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use cudarc::driver::sys;

use crate::error::CudaError;
use crate::gpu::Gpu;

/// A gate on one stream. Dropping it opens it (a stream must never wait forever).
#[derive(Debug)]
pub struct StreamGate {
    gpu: Gpu,
    flag: *mut u32,
    prior: sys::CUevent,
    /// Recorded right after the wait: once it completes, the stream no longer reads the flag.
    passed: sys::CUevent,
    opened: bool,
}

// SAFETY: the flag is pinned host memory owned by the gate; the event is a driver handle usable from any thread.
unsafe impl Send for StreamGate {}

fn has_symbol(name: &str) -> bool {
    // SAFETY: only looks the symbol up; the driver library is loaded (a `Gpu` exists).
    unsafe { sys::culib().get::<*const ()>(name.as_bytes()).is_ok() }
}

impl StreamGate {
    /// Closes a gate on `stream` (a stream of `gpu`'s context, e.g. PyTorch's current stream).
    ///
    /// # Safety
    /// `stream` must be a live stream of `gpu`'s context for as long as the gate exists.
    pub unsafe fn close(gpu: &Gpu, stream: sys::CUstream) -> Result<StreamGate, CudaError> {
        let dev = gpu.ordinal();
        for s in ["cuStreamWaitValue32_v2", "cuMemHostGetDevicePointer_v2"] {
            if !has_symbol(s) {
                return Err(CudaError::Unavailable(format!("stream-ordered I/O needs {s}, which this driver lacks")));
            }
        }
        gpu.bind()?;
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; DEVICEMAP makes the page visible to the device.
        unsafe { sys::cuMemHostAlloc(&mut host, 4, sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE) }
            .result()
            .map_err(CudaError::driver(dev, "cuMemHostAlloc"))?;
        let flag = host as *mut u32;
        // SAFETY: `flag` points at 4 freshly allocated bytes.
        unsafe { flag.write_volatile(0) };
        let mut gate = StreamGate {
            gpu: gpu.clone(),
            flag,
            prior: std::ptr::null_mut(),
            passed: std::ptr::null_mut(),
            opened: false,
        };
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` is a DEVICEMAP allocation of this context.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0) }
            .result()
            .map_err(CudaError::driver(dev, "cuMemHostGetDevicePointer"))?;
        // SAFETY: valid out-pointer.
        unsafe { sys::cuEventCreate(&mut gate.prior, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }
            .result()
            .map_err(CudaError::driver(dev, "cuEventCreate"))?;
        // SAFETY: the event and stream belong to this context (the stream per the contract).
        unsafe { sys::cuEventRecord(gate.prior, stream) }.result().map_err(CudaError::driver(dev, "cuEventRecord"))?;
        // SAFETY: `dptr` is the device view of the flag, which lives until the gate is dropped (after it opened).
        unsafe {
            sys::cuStreamWaitValue32_v2(stream, dptr, 1, sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32)
        }
        .result()
        .map_err(CudaError::driver(dev, "cuStreamWaitValue32"))?;
        // SAFETY: valid out-pointer; the event and stream belong to this context.
        unsafe {
            sys::cuEventCreate(&mut gate.passed, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
                .result()
                .map_err(CudaError::driver(dev, "cuEventCreate"))?;
            sys::cuEventRecord(gate.passed, stream).result().map_err(CudaError::driver(dev, "cuEventRecord"))?;
        }
        Ok(gate)
    }

    /// Blocks until the work queued on the stream before the gate has finished.
    pub fn wait_for_prior_work(&self) -> Result<(), CudaError> {
        self.gpu.bind()?;
        // SAFETY: `prior` is a live event recorded in `close`.
        unsafe { sys::cuEventSynchronize(self.prior) }
            .result()
            .map_err(CudaError::driver(self.gpu.ordinal(), "cuEventSynchronize"))
    }

    /// Lets the stream run past the gate.
    pub fn open(&mut self) {
        if self.opened {
            return;
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        // SAFETY: `flag` is the gate's live pinned allocation; an aligned u32 can be stored atomically.
        unsafe { AtomicU32::from_ptr(self.flag) }.store(1, Ordering::SeqCst);
        self.opened = true;
    }
}

impl Drop for StreamGate {
    fn drop(&mut self) {
        self.open();
        let _ = self.gpu.bind();
        // The stream may still be about to read the flag: wait until it has passed the gate before freeing it.
        // SAFETY: the events were created in `close` (or are null if it failed first) and are released once, here.
        unsafe {
            if !self.passed.is_null() {
                let _ = sys::cuEventSynchronize(self.passed);
                let _ = sys::cuEventDestroy_v2(self.passed);
            }
            if !self.prior.is_null() {
                let _ = sys::cuEventDestroy_v2(self.prior);
            }
        }
        // SAFETY: allocated by cuMemHostAlloc in `close`; no stream reads it any more.
        if let Err(e) = unsafe { sys::cuMemFreeHost(self.flag.cast()) }.result() {
            tracing::warn!("freeing a stream gate: {e}");
        }
    }
}
