//! Device memory from PyTorch's caching allocator: a load's blocks are `torch.empty` byte tensors, made by a Python
//! callable on the caller's stream while the reads run. PyTorch then accounts for the weights
//! (`torch.cuda.memory_allocated`), reuses their memory when they are freed, and gives it back on `empty_cache`,
//! as for any tensor of its own; and a fresh process skips the first use of the driver's stream-ordered pool
//! (10–12 ms, bench/results/2026-11-25-h100-s), which a first load otherwise waits for.

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
        let oom = e.get_type(py).name().is_ok_and(|n| n == "OutOfMemoryError");
        let why = e.to_string();
        if oom {
            let (free, total) = gpu.mem_info().unwrap_or((0, 0));
            return CudaError::OutOfMemory { device, bytes: len as u64, free, total };
        }
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
        CudaError::Allocator { device, allocator: "torch".into(), bytes: len as u64, why }
    }
}

/// A block's tensor, dropped with the GIL where the dropping thread holds it (a tensor freed from Python gives its
/// memory back to PyTorch at once); elsewhere PyO3 defers the release to the next time it holds the GIL, since
/// taking the GIL on a thread of PyTorch's could deadlock against a Python thread waiting on that thread.
struct BlockOwner(Option<Py<PyAny>>);

// Declared here because PyO3 exposes it only outside the limited API that the abi3 wheel is built against; every
// CPython since 3.4 exports it, and the extension resolves it from the running interpreter.
unsafe extern "C" {
    fn PyGILState_Check() -> std::os::raw::c_int;
}

impl Drop for BlockOwner {
    fn drop(&mut self) {
        let Some(t) = self.0.take() else { return };
        // SAFETY: both calls only read the interpreter's state; `PyGILState_Check` is valid on any thread once
        // Python is initialised.
        let holds_gil = unsafe { pyo3::ffi::Py_IsInitialized() != 0 && PyGILState_Check() == 1 };
        if holds_gil {
            Python::attach(|_| drop(t));
        } else {
            drop(t);
        }
    }
}

impl DeviceAllocator for TorchAllocator {
    fn alloc(&self, gpu: &Gpu, len: usize) -> Result<DeviceBuffer, CudaError> {
        Python::attach(|py| {
            let made = self.alloc.call1(py, (len,)).and_then(|t| {
                let ptr: u64 = t.call_method0(py, "data_ptr")?.extract(py)?;
                let nbytes: usize = t.getattr(py, "nbytes")?.extract(py)?;
                if nbytes < len || ptr == 0 {
                    let why = format!("the allocator gave {nbytes} bytes at {ptr:#x} for {len}");
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
