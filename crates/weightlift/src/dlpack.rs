//! Loaded tensors as DLPack managed tensors (the `dlpack` feature), for the frameworks that import DLPack (PyTorch,
//! JAX, CuPy, TVM and others, through their C or Rust bindings): [`export`] turns a [`Tensor`] into a
//! [`dlpark::Managed`] that shares the tensor's memory (no copy) and owns it until the consumer calls the deleter.
//!
//! The ABI is the caller's choice: `export::<DLManagedTensor>` gives the legacy struct,
//! `export::<DLManagedTensorVersioned>` the versioned one of DLPack 1.x (both in [`dlpark::ffi`]; `weightlift::dlpark`
//! is the dlpark this was built with). `Managed::into_raw` hands the C struct over; dropping the `Managed` instead runs
//! the deleter.
//!
//! What the descriptor holds:
//! - `data`: the address of the tensor's first byte, and `byte_offset` 0, as PyTorch and CuPy export (DLPack's
//!   256-byte alignment of `data` is not promised: host buffers are 64-byte aligned, tensors inside a device block
//!   at the load's `tensor_align`). `NULL` for a tensor of no bytes, as DLPack asks.
//! - `device`: `kDLCPU` for [`Device::Cpu`](crate::Device::Cpu), `kDLCUDAHost` for pinned memory, `kDLCUDA` with
//!   the ordinal for GPU memory.
//! - `shape` as loaded, `strides` compact row-major (in elements), both owned by the managed tensor.
//! - `dtype`: [`data_type`]; one lane.
//! - the versioned struct's `flags`: none (the memory is writable, and it is the load's, not a copy made for the
//!   consumer).
//!
//! GPU memory: a load onto a device has finished its copies when [`Engine::load`](crate::Engine::load) returns, so
//! a consumer may read the bytes on any stream. Releasing them is ordered on the legacy default stream, which waits
//! for the work of blocking streams but not of non-blocking ones: a consumer whose kernels run on a non-blocking
//! stream and may still read the tensor when it calls the deleter names that stream to [`export_for_stream`]. Small
//! tensors may share one device allocation ([`DeviceTensor`](crate::DeviceTensor)): it is freed once the last of
//! them, exported or not, is released.

use std::ffi::c_void;

use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType};
use dlpark::metadata::Dynamic;
use dlpark::{Managed, ManagedTensorBase};
use weightlift_cuda::CUstream;
use weightlift_format::DType;

use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorData};

/// The DLPack type of a checkpoint type (one lane), where DLPack has one for exactly its bytes: every integer, bool,
/// f16, bf16, f32, f64, complex64 (two f32) and the five FP8 types. `None` for the packed sub-byte floats (F6, F4:
/// a safetensors file does not fix the order of their bits, which DLPack does) and GGML's block types.
pub fn data_type(dtype: DType) -> Option<DLDataType> {
    let (code, bits) = match dtype {
        DType::Bool => (DLDataTypeCode::BOOL, 8),
        DType::U8 => (DLDataTypeCode::UINT, 8),
        DType::U16 => (DLDataTypeCode::UINT, 16),
        DType::U32 => (DLDataTypeCode::UINT, 32),
        DType::U64 => (DLDataTypeCode::UINT, 64),
        DType::I8 => (DLDataTypeCode::INT, 8),
        DType::I16 => (DLDataTypeCode::INT, 16),
        DType::I32 => (DLDataTypeCode::INT, 32),
        DType::I64 => (DLDataTypeCode::INT, 64),
        DType::F16 => (DLDataTypeCode::FLOAT, 16),
        DType::BF16 => (DLDataTypeCode::BFLOAT, 16),
        DType::F32 => (DLDataTypeCode::FLOAT, 32),
        DType::F64 => (DLDataTypeCode::FLOAT, 64),
        DType::C64 => (DLDataTypeCode::COMPLEX, 64),
        // safetensors' F8_E4M3 is OCP's E4M3FN (no infinities), PyTorch's float8_e4m3fn.
        DType::F8E4M3 => (DLDataTypeCode::FLOAT8_E4M3FN, 8),
        DType::F8E5M2 => (DLDataTypeCode::FLOAT8_E5M2, 8),
        DType::F8E8M0 => (DLDataTypeCode::FLOAT8_E8M0FNU, 8),
        DType::F8E4M3Fnuz => (DLDataTypeCode::FLOAT8_E4M3FNUZ, 8),
        DType::F8E5M2Fnuz => (DLDataTypeCode::FLOAT8_E5M2FNUZ, 8),
        DType::F6E2M3 | DType::F6E3M2 | DType::F4 | DType::Ggml(_) => return None,
    };
    Some(DLDataType::scalar(code, bits))
}

/// The DLPack device of memory a load put a tensor in.
pub fn device(data: &TensorData) -> DLDevice {
    match data {
        TensorData::Host(_) => DLDevice::CPU,
        TensorData::Pinned(_) => DLDevice { device_type: DLDeviceType::CUDAHOST, device_id: 0 },
        TensorData::Device(d) => DLDevice::cuda(d.block.gpu().ordinal() as i32),
    }
}

/// Exports `tensor` as a DLPack managed tensor of ABI `M` sharing its memory, which it owns from then on: the
/// memory is released when the consumer calls the deleter (or the `Managed` is dropped). Fails, dropping the
/// tensor, when DLPack has no type for its dtype ([`data_type`] says so beforehand) or a dimension exceeds `i64`.
pub fn export<M: ManagedTensorBase>(tensor: Tensor) -> Result<Managed<M>> {
    export_with(tensor, None)
}

/// [`export`], for a consumer working on the non-blocking CUDA stream `stream`: when the deleter runs, the release
/// of GPU memory is ordered after the work queued on `stream` by then (host and pinned tensors ignore it).
///
/// # Safety
/// `stream` must be a stream of the tensor's device (its primary context, which weightlift and the CUDA runtime
/// use), and must still exist when the deleter runs.
pub unsafe fn export_for_stream<M: ManagedTensorBase>(tensor: Tensor, stream: CUstream) -> Result<Managed<M>> {
    export_with(tensor, Some(stream as usize))
}

fn export_with<M: ManagedTensorBase>(tensor: Tensor, consumer_stream: Option<usize>) -> Result<Managed<M>> {
    let Tensor { name, dtype, shape, data } = tensor;
    let refuse = |why: String| Error::InvalidArgument(format!("tensor {name:?}: {why}"));
    let dl_dtype = data_type(dtype).ok_or_else(|| refuse(format!("DLPack has no type for {dtype}")))?;
    if dtype.byte_size(&shape).ok() != Some(data.len() as u64) {
        return Err(refuse(format!("{} bytes do not make a {dtype} tensor of shape {shape:?}", data.len())));
    }
    let dims = shape
        .iter()
        .map(|&d| i64::try_from(d))
        .collect::<std::result::Result<Vec<i64>, _>>()
        .map_err(|_| refuse(format!("shape {shape:?} does not fit DLPack's i64 dimensions")))?;
    let device = device(&data);
    // Taken before the memory's owner moves into the context: moving it does not move the memory.
    let ptr = match &data {
        _ if data.is_empty() => std::ptr::null_mut(),
        TensorData::Host(b) => b.as_ptr().cast_mut().cast::<c_void>(),
        TensorData::Pinned(b) => b.as_ptr().cast_mut().cast::<c_void>(),
        TensorData::Device(d) => d.device_ptr() as *mut c_void,
    };
    let owner = Box::new(Owner { data, consumer_stream });
    let mut init = Dynamic::compact(dims).initialize_as::<M>(owner).map_err(|e| refuse(e.to_string()))?;
    init.set_data(ptr).set_device(device).set_dtype(dl_dtype).set_byte_offset(0);
    // SAFETY: `ptr` addresses the tensor's `data.len()` bytes (checked above to be exactly what `dtype` and `shape`
    // take), owned by the context the managed tensor holds until its deleter runs; shape and compact strides live in
    // the managed tensor's own allocation; no flag claims a copy or read-only memory.
    Ok(unsafe { init.finish() })
}

/// What a managed tensor keeps alive: the tensor's memory, released when the deleter drops this, and the consumer's
/// stream to order a release of device memory after.
struct Owner {
    data: TensorData,
    consumer_stream: Option<usize>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        // Null, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) already synchronise with the legacy stream the
        // release is ordered on; memory of another allocator is released as that allocator orders it.
        if let (TensorData::Device(d), Some(stream)) = (&self.data, self.consumer_stream)
            && stream > 2
            && !d.block.is_external()
        {
            // SAFETY: `export_for_stream`'s contract: `stream` belongs to the block's device and still exists.
            unsafe { weightlift_cuda::order_after_stream(d.block.gpu(), stream as CUstream) };
        }
    }
}
