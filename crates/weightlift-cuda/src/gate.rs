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
    crate::driver::missing_driver_symbols(&[name]).is_ok_and(|missing| missing.is_empty())
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
        let _restore = crate::ContextRestore::save(); // the caller's thread keeps its device
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
        let _restore = crate::ContextRestore::save(); // the caller's thread keeps its device
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
        let _restore = crate::ContextRestore::save(); // the caller's thread keeps its device
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

/// Which way an [`OrderedTransfer`] moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// File → device: the host fills the staging buffer, then the stream copies it to the device.
    ToDevice,
    /// Device → file: the stream copies the device bytes to the staging buffer, then the host writes them out.
    FromDevice,
}

/// Stream-ordered file I/O on device memory, staged in pinned host memory so that the host side needs no CUDA
/// call while the stream waits for it: every copy is queued on the caller's stream when the transfer is set up, and
/// the host thread only reads or writes the staging buffer and opens a gate.
///
/// Doing the device copies from the host thread while the stream waits would deadlock against any other thread that
/// synchronises the device meanwhile (an allocator's `cudaMalloc`, a `cudaDeviceSynchronize`): that sync waits for
/// the gated stream, and the copies queue behind it.
///
/// `ToDevice`: stream = [earlier work] → wait(gate) → copy staging → device → [later work]. The host fills
/// [`OrderedTransfer::staging`] and calls [`OrderedTransfer::open`].
/// `FromDevice`: stream = [earlier work] → copy device → staging → wait(gate) → [later work]. The host waits with
/// [`OrderedTransfer::wait_staged`], writes the staging bytes out, and opens.
#[derive(Debug)]
pub struct OrderedTransfer {
    gate: StreamGate,
    staging: crate::memory::PinnedBuffer,
    /// Recorded after the copy: the staging buffer is free once it completes.
    copied: sys::CUevent,
    direction: Direction,
}

// SAFETY: the event is a driver handle usable from any thread; the rest is Send.
unsafe impl Send for OrderedTransfer {}

impl OrderedTransfer {
    /// Queues the transfer of `len` bytes at device address `dev` on `stream`.
    ///
    /// # Safety
    /// `stream` must be a live stream of `gpu`'s context outliving the transfer; `dev..dev + len` must be device
    /// memory of `gpu` that the stream's work may use (written for `ToDevice`, read for `FromDevice`).
    pub unsafe fn queue(
        gpu: &Gpu,
        stream: sys::CUstream,
        dev: sys::CUdeviceptr,
        len: usize,
        direction: Direction,
    ) -> Result<OrderedTransfer, CudaError> {
        let d = gpu.ordinal();
        let staging = crate::memory::PinnedBuffer::alloc(gpu, len)?;
        let _restore = crate::ContextRestore::save(); // the caller's thread keeps its device
        gpu.bind()?;
        let mut copied: sys::CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { sys::cuEventCreate(&mut copied, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }
            .result()
            .map_err(CudaError::driver(d, "cuEventCreate"))?;
        let host = staging.as_ptr() as *mut c_void;
        // Each step's failure leaves the gate open (its Drop) and the event destroyed (below).
        let setup = || -> Result<StreamGate, CudaError> {
            match direction {
                Direction::ToDevice => {
                    // SAFETY: per the contract.
                    let gate = unsafe { StreamGate::close(gpu, stream) }?;
                    if len > 0 {
                        // SAFETY: `host` is `len` bytes of pinned memory kept until `copied` completes; `dev` per
                        // the contract.
                        unsafe { sys::cuMemcpyHtoDAsync_v2(dev, host, len, stream) }
                            .result()
                            .map_err(CudaError::driver(d, "cuMemcpyHtoDAsync"))?;
                    }
                    // SAFETY: the event and stream belong to this context.
                    unsafe { sys::cuEventRecord(copied, stream) }
                        .result()
                        .map_err(CudaError::driver(d, "cuEventRecord"))?;
                    Ok(gate)
                }
                Direction::FromDevice => {
                    if len > 0 {
                        // SAFETY: as above, the other way.
                        unsafe { sys::cuMemcpyDtoHAsync_v2(host, dev, len, stream) }
                            .result()
                            .map_err(CudaError::driver(d, "cuMemcpyDtoHAsync"))?;
                    }
                    // SAFETY: as above.
                    unsafe { sys::cuEventRecord(copied, stream) }
                        .result()
                        .map_err(CudaError::driver(d, "cuEventRecord"))?;
                    // SAFETY: per the contract.
                    unsafe { StreamGate::close(gpu, stream) }
                }
            }
        };
        match setup() {
            Ok(gate) => Ok(OrderedTransfer { gate, staging, copied, direction }),
            Err(e) => {
                // SAFETY: created above; any record of it is on a stream that will pass it (the gate, if it was
                // closed, opened when dropped).
                unsafe {
                    let _ = sys::cuEventSynchronize(copied);
                    let _ = sys::cuEventDestroy_v2(copied);
                }
                Err(e)
            }
        }
    }

    /// The staging bytes: for `ToDevice`, fill them before [`OrderedTransfer::open`]; for `FromDevice`, valid after
    /// [`OrderedTransfer::wait_staged`].
    pub fn staging(&mut self) -> &mut [u8] {
        &mut self.staging
    }

    /// Which way this transfer moves bytes.
    pub fn direction(&self) -> Direction {
        self.direction
    }

    /// `FromDevice`: blocks until the device bytes are in the staging buffer (the stream's earlier work included).
    /// Needs no progress from the host, so it cannot deadlock against the gate.
    pub fn wait_staged(&self) -> Result<(), CudaError> {
        let _restore = crate::ContextRestore::save(); // the caller's thread keeps its device
        self.gate.gpu.bind()?;
        // SAFETY: `copied` is live until drop.
        unsafe { sys::cuEventSynchronize(self.copied) }
            .result()
            .map_err(CudaError::driver(self.gate.gpu.ordinal(), "cuEventSynchronize"))
    }

    /// Lets the stream run past the gate.
    pub fn open(&mut self) {
        self.gate.open();
    }
}

impl Drop for OrderedTransfer {
    fn drop(&mut self) {
        self.gate.open();
        let _restore = crate::ContextRestore::save(); // the caller's thread keeps its device
        let _ = self.gate.gpu.bind();
        // The staging buffer may still be the source or target of the stream's copy: wait for it before freeing.
        // SAFETY: `copied` was created in `queue` and is destroyed once, here.
        unsafe {
            let _ = sys::cuEventSynchronize(self.copied);
            let _ = sys::cuEventDestroy_v2(self.copied);
        }
    }
}
