//! Hand-over of loaded bytes to PyTorch (or any DLPack consumer) without a copy.
//!
//! Written against the DLPack C ABI directly rather than through dlpark: weightlift exports a buffer either as a 1-D
//! byte tensor (`__dlpack__`; the Python side views it as the real dtype and shape, which sidesteps consumers'
//! uneven support for fp8 and wide unsigned DLPack codes) or, for the dtypes every consumer reads, as a capsule of
//! its dtype and shape (`typed_capsule`), and the deleter needs a device-specific step dlpark has no hook for:
//! ordering the free of device memory after the consumer stream's work.

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;
use weightlift::cuda::PinnedBuffer;
use weightlift::io::HostBuffer;
use weightlift::{DeviceTensor, TensorData};

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const KDL_CUDA_HOST: i32 = 3;
const KDL_INT: u8 = 0;
const KDL_UINT: u8 = 1;
const KDL_FLOAT: u8 = 2;
const KDL_BFLOAT: u8 = 4;
const KDL_BOOL: u8 = 6;

/// The DLPack type of a safetensors dtype name, for the types PyTorch reads from DLPack on every version weightlift
/// supports: bool, 8-64-bit signed integers, uint8, f16, bf16, f32, f64. Others (unsigned wider than 8 bits, fp8,
/// sub-byte floats, complex) are exported as bytes and viewed by the caller.
fn dl_dtype(name: &str) -> Option<DLDataType> {
    let (code, bits) = match name {
        "BOOL" => (KDL_BOOL, 8),
        "U8" => (KDL_UINT, 8),
        "I8" => (KDL_INT, 8),
        "I16" => (KDL_INT, 16),
        "I32" => (KDL_INT, 32),
        "I64" => (KDL_INT, 64),
        "F16" => (KDL_FLOAT, 16),
        "BF16" => (KDL_BFLOAT, 16),
        "F32" => (KDL_FLOAT, 32),
        "F64" => (KDL_FLOAT, 64),
        _ => return None,
    };
    Some(DLDataType { code, bits, lanes: 1 })
}

/// What keeps a tensor's memory alive while a consumer holds it.
#[derive(Clone, Debug)]
pub enum Holder {
    Host(Arc<HostBuffer>),
    Pinned(Arc<PinnedBuffer>),
    Device(DeviceTensor),
}

impl Holder {
    pub fn from_data(data: TensorData) -> Holder {
        match data {
            TensorData::Host(b) => Holder::Host(Arc::new(b)),
            TensorData::Pinned(b) => Holder::Pinned(Arc::new(b)),
            TensorData::Device(d) => Holder::Device(d),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Holder::Host(b) => b.len(),
            Holder::Pinned(b) => b.len(),
            Holder::Device(d) => d.len as usize,
        }
    }

    /// `(DLDeviceType, device id)` as `__dlpack_device__` returns it.
    pub fn dl_device(&self) -> (i32, i32) {
        match self {
            Holder::Host(_) => (KDL_CPU, 0),
            Holder::Pinned(_) => (KDL_CUDA_HOST, 0),
            Holder::Device(d) => (KDL_CUDA, d.block.gpu().ordinal() as i32),
        }
    }

    fn data_ptr(&self) -> *mut c_void {
        match self {
            Holder::Host(b) => b.as_ptr() as *mut c_void,
            Holder::Pinned(b) => b.as_ptr() as *mut c_void,
            Holder::Device(d) => d.device_ptr() as *mut c_void,
        }
    }
}

/// The manager context: the managed tensor (first, so a pointer to it is a pointer to the context), its shape
/// array, the memory owner, and the consumer's stream.
#[repr(C)]
struct Ctx {
    managed: DLManagedTensor,
    shape: Vec<i64>,
    holder: Holder,
    consumer_stream: usize,
}

const NAME: &CStr = c"dltensor";

unsafe extern "C" fn deleter(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: every DLManagedTensor weightlift hands out is the first field of a boxed `Ctx` whose pointer is also
    // stored in `manager_ctx`; the DLPack protocol calls the deleter exactly once.
    let ctx = unsafe { Box::from_raw((*managed).manager_ctx as *mut Ctx) };
    if let Holder::Device(d) = &ctx.holder {
        // The last tensor of a block frees it on the legacy default stream: first make that stream wait for what
        // the consumer queued on its own stream so far (PyTorch's side streams are non-blocking). A block of
        // torch's allocator is marked used by the consumer's stream when made, and torch orders its reuse.
        if ctx.consumer_stream > 2 && !d.block.is_external() {
            // SAFETY: the consumer passed this stream handle to `__dlpack__` for the block's device; DLPack requires
            // it to stay valid while the consumer holds the tensor.
            unsafe {
                weightlift::cuda::order_after_stream(d.block.gpu(), ctx.consumer_stream as weightlift::cuda::CUstream)
            };
        }
    }
    drop(ctx);
}

unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed. A consumer that took the tensor renamed the capsule
    // ("used_dltensor") and owns it; otherwise it was never consumed and the tensor is released here.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()) as *mut DLManagedTensor;
            deleter(managed);
        }
    }
}

/// A fresh `dltensor` capsule sharing `holder`'s memory as a 1-D `uint8` tensor.
pub fn capsule(py: Python<'_>, holder: &Holder, consumer_stream: usize) -> PyResult<Py<PyAny>> {
    let bytes = DLDataType { code: KDL_UINT, bits: 8, lanes: 1 };
    new_capsule(py, holder, consumer_stream, bytes, vec![holder.len() as i64])
}

/// A fresh `dltensor` capsule sharing `holder`'s memory as a C-contiguous tensor of dtype `dtype` (a safetensors
/// name) and `shape`, or `None` when `dtype` is not one [`dl_dtype`] exports (the caller then views bytes). Fails
/// unless the shape's bytes are the buffer's. Consumers take the capsule without a `__dlpack__` call per tensor
/// (`torch._C._from_dlpack`), which costs a fraction of one; `consumer_stream` is what `__dlpack__` would get.
pub fn typed_capsule(
    py: Python<'_>,
    holder: &Holder,
    consumer_stream: usize,
    dtype: &str,
    shape: Vec<i64>,
) -> PyResult<Option<Py<PyAny>>> {
    let Some(dt) = dl_dtype(dtype) else { return Ok(None) };
    let elems = shape.iter().try_fold(1u64, |n, &d| u64::try_from(d).ok().and_then(|d| n.checked_mul(d)));
    let nbytes = elems.and_then(|n| n.checked_mul(u64::from(dt.bits / 8)));
    if nbytes != Some(holder.len() as u64) {
        return Err(crate::errors::invalid_argument(&format!(
            "shape {shape:?} of {dtype} does not take the buffer's {} bytes",
            holder.len()
        )));
    }
    new_capsule(py, holder, consumer_stream, dt, shape).map(Some)
}

fn new_capsule(
    py: Python<'_>,
    holder: &Holder,
    consumer_stream: usize,
    dtype: DLDataType,
    shape: Vec<i64>,
) -> PyResult<Py<PyAny>> {
    let (device_type, device_id) = holder.dl_device();
    let ndim = i32::try_from(shape.len()).map_err(|_| crate::errors::invalid_argument("too many dimensions"))?;
    let mut ctx = Box::new(Ctx {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data: holder.data_ptr(),
                device: DLDevice { device_type, device_id },
                ndim,
                dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter),
        },
        shape,
        holder: holder.clone(),
        consumer_stream,
    });
    ctx.managed.dl_tensor.shape = ctx.shape.as_mut_ptr();
    let raw = Box::into_raw(ctx);
    // SAFETY: `raw` is a live box; `managed` is its first field (repr(C)).
    unsafe { (*raw).managed.manager_ctx = raw as *mut c_void };
    // SAFETY: the capsule takes the pointer to the managed tensor; the destructor releases it unless a consumer
    // took ownership (DLPack's protocol). On failure the box is released here.
    let cap = unsafe { ffi::PyCapsule_New(raw as *mut c_void, NAME.as_ptr(), Some(capsule_destructor)) };
    if cap.is_null() {
        // SAFETY: the capsule was not created, so nothing else owns `raw`.
        unsafe { deleter(raw as *mut DLManagedTensor) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `cap` is a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}

/// A byte buffer loaded into host or device memory, exported through DLPack.
#[pyclass(module = "weightlift._native", frozen)]
pub(crate) struct NativeBuffer {
    holder: Holder,
}

impl NativeBuffer {
    pub(crate) fn new(data: TensorData) -> NativeBuffer {
        NativeBuffer { holder: Holder::from_data(data) }
    }
}

#[pymethods]
impl NativeBuffer {
    #[getter]
    fn nbytes(&self) -> usize {
        let _cuda = crate::bridge::keep_callers_context();
        self.holder.len()
    }

    /// The DLPack protocol: a capsule sharing this buffer's memory as a 1-D uint8 tensor. The bytes are complete
    /// when the load returns, so they are ready on any consumer stream; `stream` only orders the eventual free.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<isize>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _cuda = crate::bridge::keep_callers_context();
        let _ = max_version;
        if copy == Some(true) {
            return Err(pyo3::exceptions::PyBufferError::new_err("weightlift buffers are exported without copying"));
        }
        if let Some(d) = dl_device
            && d != self.holder.dl_device()
        {
            return Err(pyo3::exceptions::PyBufferError::new_err("cannot export to another device without a copy"));
        }
        capsule(py, &self.holder, stream.unwrap_or(0).max(0) as usize)
    }

    /// A DLPack capsule of this buffer as a C-contiguous tensor of `dtype` (a safetensors name) and `shape`, for
    /// `torch._C._from_dlpack` (no `__dlpack__` round trip per tensor); None for dtypes exported only as bytes
    /// (unsigned wider than 8 bits, fp8, sub-byte, complex). `stream`: the consumer's current stream, as
    /// `__dlpack__` gets it (it orders the eventual free).
    #[pyo3(signature = (dtype, shape, stream=0))]
    fn typed_capsule(
        &self,
        py: Python<'_>,
        dtype: &str,
        shape: Vec<i64>,
        stream: isize,
    ) -> PyResult<Option<Py<PyAny>>> {
        let _cuda = crate::bridge::keep_callers_context();
        typed_capsule(py, &self.holder, stream.max(0) as usize, dtype, shape)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        let _cuda = crate::bridge::keep_callers_context();
        self.holder.dl_device()
    }
}
