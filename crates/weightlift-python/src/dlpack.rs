//! Hand-over of loaded bytes to PyTorch (or any DLPack consumer) without a copy.
//!
//! Written against the DLPack C ABI directly rather than through dlpark: weightlift exports only one shape of tensor
//! (a 1-D byte buffer that the Python side views as the real dtype and shape, which sidesteps consumers' uneven
//! support for bf16/fp8 DLPack codes), and the deleter needs a device-specific step dlpark has no hook for: ordering
//! the free of device memory after the consumer stream's work.

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
const KDL_UINT: u8 = 1;

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
    shape: [i64; 1],
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
        // the consumer queued on its own stream so far (PyTorch's side streams are non-blocking).
        if ctx.consumer_stream > 2 {
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
    let len = holder.len() as i64;
    let (device_type, device_id) = holder.dl_device();
    let mut ctx = Box::new(Ctx {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data: holder.data_ptr(),
                device: DLDevice { device_type, device_id },
                ndim: 1,
                dtype: DLDataType { code: KDL_UINT, bits: 8, lanes: 1 },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter),
        },
        shape: [len],
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
