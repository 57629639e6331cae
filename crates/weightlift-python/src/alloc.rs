//! Device memory from PyTorch's caching allocator: a load's blocks are `torch.empty` byte tensors, made by a Python
//! callable (on a side stream of weightlift's own, marked used by the caller's stream) while the reads run. The
//! callable runs on the call's worker thread, whose caller waits without the GIL. PyTorch then accounts for the
//! weights
//! (`torch.cuda.memory_allocated`), reuses their memory when they are freed, and gives it back on `empty_cache`,
//! as for any tensor of its own; and a fresh process skips the first use of the driver's stream-ordered pool
//! (10–12 ms, bench/results/2026-11-25-h100-s at b3a4ec8), which a first load otherwise waits for.

use std::sync::Mutex;

use pyo3::prelude::*;
use weightlift::cuda::{CUstream, CudaError, DeviceAllocator, DeviceBuffer, Gpu};

/// The Python callable `alloc(nbytes) -> torch.Tensor` (a contiguous uint8 tensor of at least `nbytes` bytes on the
/// load's device, allocated on `stream`), and the first Python exception it raised, kept to be raised to the
/// caller in place of the load's error.
pub struct TorchAllocator {
    alloc: Py<PyAny>,
    stream: usize,
    failure: Mutex<Option<PyErr>>,
}

impl std::fmt::Debug for TorchAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TorchAllocator(stream {:#x})", self.stream)
    }
}

impl TorchAllocator {
    pub fn new(alloc: Py<PyAny>, stream: usize) -> TorchAllocator {
        TorchAllocator { alloc, stream, failure: Mutex::new(None) }
    }

    /// The exception the callable raised, if it raised one (the load's error then only reports it).
    pub fn take_failure(&self) -> Option<PyErr> {
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn fail(&self, gpu: &Gpu, len: usize, py: Python<'_>, e: PyErr) -> CudaError {
        let device = gpu.ordinal();
        let oom_type = py.import("torch").and_then(|t| t.getattr("cuda")?.getattr("OutOfMemoryError"));
        let why = e.to_string();
        if oom_type.is_ok_and(|ty| e.is_instance(py, &ty)) {
            // torch's own account (reserved against allocated, the fragmentation hint) goes to the log.
            tracing::warn!("cuda:{device}: torch's allocator is out of memory: {why}");
            let (free, total) = gpu.mem_info().unwrap_or((0, 0));
            return CudaError::OutOfMemory { device, bytes: len as u64, free, total };
        }
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
        CudaError::Allocator { device, allocator: "torch".into(), bytes: len as u64, why }
    }
}

/// A block's tensor, released with the GIL taken by whichever thread drops it, as NumPy's DLPack deleter does: a
/// consumer frees a DLPack tensor with the GIL released (PyTorch drops it while destroying the tensor), so a
/// reference left for later would keep the memory from PyTorch's allocator until weightlift's next call
/// (measured: `del` of the loaded tensors changed nothing in `torch.cuda.memory_allocated` until then).
struct BlockOwner(Option<Py<PyAny>>);

impl Drop for BlockOwner {
    fn drop(&mut self) {
        let _cuda = crate::bridge::keep_callers_context(); // torch's free may switch this thread's device
        let Some(t) = self.0.take() else { return };
        // Not while the interpreter shuts down (taking the GIL then can end or hang the thread): the tensor is then
        // left to the process's end.
        let mut t = Some(t);
        let released = Python::try_attach(|_| drop(t.take()));
        if released.is_none() {
            std::mem::forget(t);
        }
    }
}

impl DeviceAllocator for TorchAllocator {
    fn alloc(&self, gpu: &Gpu, len: usize) -> Result<DeviceBuffer, CudaError> {
        // torch may switch this thread's device inside the callable; the engine's calls after it need the context
        // they bound.
        let _restore = weightlift::cuda::ContextRestore::save();
        Python::attach(|py| {
            let made = self.alloc.call1(py, (len,)).and_then(|t| {
                let ptr: u64 = t.call_method0(py, "data_ptr")?.extract(py)?;
                let nbytes: usize = t.getattr(py, "nbytes")?.extract(py)?;
                let is_cuda: bool = t.getattr(py, "is_cuda")?.extract(py)?;
                let index: i64 = if is_cuda { t.call_method0(py, "get_device")?.extract(py)? } else { -1 };
                let contiguous: bool = t.call_method0(py, "is_contiguous")?.extract(py)?;
                if nbytes < len || ptr == 0 || index != i64::from(gpu.ordinal()) || !contiguous {
                    let why = format!(
                        "the allocator gave {nbytes} bytes at {ptr:#x} ({}, {}) for {len} contiguous bytes on cuda:{}",
                        if is_cuda { format!("cuda:{index}") } else { "not a CUDA tensor".into() },
                        if contiguous { "contiguous" } else { "not contiguous" },
                        gpu.ordinal()
                    );
                    return Err(pyo3::exceptions::PyValueError::new_err(why));
                }
                Ok((t, ptr))
            });
            match made {
                // SAFETY: a live CUDA tensor of at least `len` bytes on the load's device (the Python side asks
                // for it there), kept alive by its owner.
                Ok((t, ptr)) => Ok(unsafe { DeviceBuffer::external(gpu, ptr, len, Box::new(BlockOwner(Some(t)))) }),
                Err(e) => Err(self.fail(gpu, len, py, e)),
            }
        })
    }

    fn ready_stream(&self) -> CUstream {
        self.stream as CUstream
    }

    fn name(&self) -> String {
        "torch".into()
    }
}
