//! Checkpoints as [`candle_core::Tensor`]s (the `candle` feature), keyed by name as
//! `candle_core::safetensors::load` returns them, so that code built on candle's loader (a `VarBuilder` over a
//! `HashMap<String, Tensor>`) can read through weightlift instead.
//!
//! On the CPU, weightlift reads the bytes into host memory (io_uring lanes, O_DIRECT where it pays); each tensor is
//! then copied once into the storage candle owns, since a candle CPU tensor holds a `Vec` of its element type and
//! cannot adopt a buffer of bytes. On a GPU (the `candle-cuda` feature), weightlift reads each tensor straight into
//! device memory candle allocated for it: no copy after the read.

use std::collections::HashMap;

use candle_core::{DType as CandleDType, Tensor};
use weightlift_format::{DType, TensorIndex};

use crate::device::Device;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::path::LoadOpts;
use crate::tensor::TensorData;

/// The candle type of a checkpoint type, where candle has one.
pub fn candle_dtype(dtype: DType) -> Option<CandleDType> {
    Some(match dtype {
        DType::U8 => CandleDType::U8,
        DType::U32 => CandleDType::U32,
        DType::I16 => CandleDType::I16,
        DType::I32 => CandleDType::I32,
        DType::I64 => CandleDType::I64,
        DType::BF16 => CandleDType::BF16,
        DType::F16 => CandleDType::F16,
        DType::F32 => CandleDType::F32,
        DType::F64 => CandleDType::F64,
        DType::F8E4M3 => CandleDType::F8E4M3,
        DType::F6E2M3 => CandleDType::F6E2M3,
        DType::F6E3M2 => CandleDType::F6E3M2,
        DType::F4 => CandleDType::F4,
        DType::F8E8M0 => CandleDType::F8E8M0,
        _ => return None,
    })
}

/// Loads every tensor of `index` onto `device` as candle tensors, by name. A tensor whose type candle lacks (bool,
/// i8, u16, u64, complex, GGML blocks) fails the whole load before anything is read, naming it.
///
/// On `Device::Cuda` (the `candle-cuda` feature) the tensors are candle's own allocations on that device, filled by
/// weightlift's device read while candle allocates the rest; a process without a usable driver gets
/// [`Error::Cuda`].
pub fn load(engine: &Engine, index: &TensorIndex, device: &candle_core::Device) -> Result<HashMap<String, Tensor>> {
    let types = index
        .tensors
        .iter()
        .map(|t| {
            candle_dtype(t.dtype)
                .ok_or_else(|| Error::InvalidArgument(format!("tensor {:?}: candle has no {} type", t.name, t.dtype)))
        })
        .collect::<Result<Vec<_>>>()?;
    #[cfg(feature = "candle-cuda")]
    if let candle_core::Device::Cuda(gpu) = device {
        return cuda::load(engine, index, &types, gpu);
    }
    let loaded = engine.load(index, Device::Cpu, &LoadOpts::default())?;
    let mut out = HashMap::with_capacity(loaded.tensors.len());
    for (t, dtype) in loaded.tensors.into_iter().zip(types) {
        let staged;
        let bytes: &[u8] = match &t.data {
            TensorData::Host(b) => b,
            other => {
                staged = read_back(other)?;
                &staged
            }
        };
        let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
        let tensor = Tensor::from_raw_buffer(bytes, dtype, &shape, device)
            .map_err(|e| Error::InvalidArgument(format!("tensor {:?}: candle refused it: {e}", t.name)))?;
        out.insert(t.name, tensor);
    }
    Ok(out)
}

fn read_back(data: &TensorData) -> Result<Vec<u8>> {
    let mut bytes = vec![0u8; data.len()];
    data.read_back(0, &mut bytes)?;
    Ok(bytes)
}

#[cfg(feature = "candle-cuda")]
pub use cuda::device_bytes;

#[cfg(feature = "candle-cuda")]
mod cuda {
    //! Loads onto a candle CUDA device: a thread allocates each tensor's memory through candle (on candle's stream,
    //! in file order) and publishes it, with an event following the allocations, while weightlift's device read
    //! ([`Dests::Targets`]) fills each destination as soon as it is published. candle and weightlift share one
    //! cudarc and the device's primary context, so the addresses are valid to both.

    use std::collections::HashMap;
    use std::panic::AssertUnwindSafe;

    use candle_core::backend::BackendDevice;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, DriverError};
    use candle_core::cuda_backend::{CudaStorage, CudaStorageSlice};
    use candle_core::op::BackpropOp;
    use candle_core::{CudaDevice, DType as CandleDType, DeviceLocation, Storage, Tensor};
    use weightlift_cuda::{CudaError, Targets};
    use weightlift_format::TensorIndex;

    use crate::error::{Error, Result};
    use crate::{ByteRange, Dests, Engine, ReadRequest, Sources};

    /// Allocations published together (one event each batch): small enough that the first reads wait little.
    const BATCH_BYTES: u64 = 32 << 20;

    pub(super) fn load(
        engine: &Engine,
        index: &TensorIndex,
        types: &[CandleDType],
        gpu: &CudaDevice,
    ) -> Result<HashMap<String, Tensor>> {
        let DeviceLocation::Cuda { gpu_id } = gpu.location() else {
            return Err(Error::InvalidArgument("candle's CUDA device reports no CUDA location".into()));
        };
        let ordinal = gpu_id as u32;
        let ranges: Vec<ByteRange> = index
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| ByteRange::new(t.file, t.offset, t.nbytes, 0).into_dest(i as u32))
            .collect();
        let lens: Vec<u64> = index.tensors.iter().map(|t| t.nbytes).collect();
        let targets = Targets::lazy(lens.len());
        // Owned here, not by the allocating thread: what it published outlives the read even if it fails.
        let mut slices = Vec::with_capacity(lens.len());
        let (read, allocated) = std::thread::scope(|scope| {
            let allocating = scope.spawn(|| {
                let allocated = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    allocate(gpu, ordinal, types, &lens, &targets, &mut slices)
                }))
                .unwrap_or_else(|_| Err(Error::InvalidArgument("allocating the candle tensors panicked".into())));
                if let Err(e) = &allocated {
                    targets.fail(format!("allocating the candle tensors failed: {e}")); // the read stops waiting
                }
                allocated
            });
            let req = ReadRequest::new(
                Sources::Described(&index.files),
                &ranges,
                Dests::Targets { ordinal, targets: &targets, lens: &lens },
            );
            // SAFETY: each destination is published only once candle has allocated it for exactly its tensor's
            // length (distinct allocations, which never overlap); they live in `slices`, which nothing reads before
            // the read has returned and which is dropped only after it (below, also when it fails).
            let read = unsafe { engine.read(&req) };
            let allocated = allocating
                .join()
                .unwrap_or_else(|_| Err(Error::InvalidArgument("the allocating thread panicked".into())));
            (read, allocated)
        });
        if let (Err(e), _) | (Ok(_), Err(e)) = (read, allocated) {
            // A failed read's copies may still be in flight on the lanes' streams, and candle frees on its own
            // stream only: every stream of the context finishes first.
            if let Err(sync) = gpu.cuda_stream().context().synchronize() {
                tracing::warn!("waiting for a failed candle load's copies before freeing its memory: {sync}");
                std::mem::forget(slices); // leaked rather than reused under a copy
            }
            return Err(e);
        }
        Ok(index
            .tensors
            .iter()
            .zip(slices)
            .map(|(t, slice)| {
                let storage = Storage::Cuda(CudaStorage { slice, device: gpu.clone() });
                let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
                (t.name.clone(), Tensor::from_storage(storage, shape, BackpropOp::none(), false))
            })
            .collect())
    }

    /// Allocates every tensor through candle into `slices`, in order, publishing each batch into `targets` with an
    /// event recorded after it on candle's stream.
    fn allocate(
        gpu: &CudaDevice,
        ordinal: u32,
        types: &[CandleDType],
        lens: &[u64],
        targets: &Targets,
        slices: &mut Vec<CudaStorageSlice>,
    ) -> Result<()> {
        let stream = gpu.cuda_stream();
        let mut batch = Vec::new();
        let mut batch_bytes = 0;
        for (i, (&dtype, &len)) in types.iter().zip(lens).enumerate() {
            let (slice, ptr) = alloc(gpu, dtype, len).map_err(|e| CudaError::Allocator {
                device: ordinal,
                allocator: "candle".into(),
                bytes: len,
                why: e.to_string().lines().next().unwrap_or_default().to_string(), // not candle's backtrace
            })?;
            slices.push(slice);
            batch.push((i as u32, ptr, len));
            batch_bytes += len;
            if batch_bytes >= BATCH_BYTES || i + 1 == lens.len() {
                let after = stream.record_event(None).map_err(CudaError::driver(ordinal, "cuEventRecord"))?;
                // SAFETY: each address is a fresh candle allocation of exactly `len` bytes, kept in `slices` until
                // the read has returned.
                unsafe { targets.publish(&batch, Some(after)) };
                batch.clear();
                batch_bytes = 0;
            }
        }
        // candle's stream may be this thread's own (per-thread) stream: the allocations are complete before the
        // tensors are used from another thread's.
        stream.synchronize().map_err(CudaError::driver(ordinal, "cuStreamSynchronize"))?;
        Ok(())
    }

    /// candle's storage for `len` bytes of type `dtype`, and its address.
    fn alloc(gpu: &CudaDevice, dtype: CandleDType, len: u64) -> candle_core::Result<(CudaStorageSlice, u64)> {
        use CudaStorageSlice as S;
        match dtype {
            CandleDType::U8 => alloc_as(gpu, len, S::U8),
            CandleDType::U32 => alloc_as(gpu, len, S::U32),
            CandleDType::I16 => alloc_as(gpu, len, S::I16),
            CandleDType::I32 => alloc_as(gpu, len, S::I32),
            CandleDType::I64 => alloc_as(gpu, len, S::I64),
            CandleDType::BF16 => alloc_as(gpu, len, S::BF16),
            CandleDType::F16 => alloc_as(gpu, len, S::F16),
            CandleDType::F32 => alloc_as(gpu, len, S::F32),
            CandleDType::F64 => alloc_as(gpu, len, S::F64),
            CandleDType::F8E4M3 => alloc_as(gpu, len, S::F8E4M3),
            // candle keeps its MX types as raw bytes, as its own loader does.
            CandleDType::F6E2M3 => alloc_as(gpu, len, S::F6E2M3),
            CandleDType::F6E3M2 => alloc_as(gpu, len, S::F6E3M2),
            CandleDType::F4 => alloc_as(gpu, len, S::F4),
            CandleDType::F8E8M0 => alloc_as(gpu, len, S::F8E8M0),
            other => Err(candle_core::Error::Msg(format!("no CUDA storage for {other:?} in this candle"))),
        }
    }

    /// `len` bytes as elements of `T` (the type `wrap` takes), allocated through candle, and their address.
    fn alloc_as<T: DeviceRepr>(
        gpu: &CudaDevice,
        len: u64,
        wrap: fn(CudaSlice<T>) -> CudaStorageSlice,
    ) -> candle_core::Result<(CudaStorageSlice, u64)> {
        let elems = len as usize / std::mem::size_of::<T>();
        // SAFETY: the memory is handed out only after weightlift's read has written every byte of it.
        let slice = unsafe { gpu.alloc::<T>(elems) }?;
        let ptr = slice.device_ptr(&gpu.cuda_stream()).0;
        Ok((wrap(slice), ptr))
    }

    /// The bytes of a contiguous tensor on a candle CUDA device, copied to the host as they are stored: what a
    /// check against the file compares (candle's own conversions refuse its MX types, which it keeps as bytes).
    pub fn device_bytes(t: &Tensor) -> Result<Vec<u8>> {
        let (storage, layout) = t.storage_and_layout();
        if !layout.is_contiguous() || layout.start_offset() != 0 {
            return Err(Error::InvalidArgument("device_bytes: the tensor is not contiguous from its start".into()));
        }
        let Storage::Cuda(cuda) = &*storage else {
            return Err(Error::InvalidArgument(format!("device_bytes: the tensor is on {:?}, not CUDA", t.device())));
        };
        let ordinal = match cuda.device.location() {
            DeviceLocation::Cuda { gpu_id } => gpu_id as u32,
            _ => 0,
        };
        let stream = cuda.device.cuda_stream();
        let host = |elems: std::result::Result<Vec<u8>, DriverError>| {
            elems.map_err(|e| Error::Cuda(CudaError::driver(ordinal, "cuMemcpyDtoH")(e)))
        };
        use CudaStorageSlice as S;
        match &cuda.slice {
            S::U8(s) | S::F6E2M3(s) | S::F6E3M2(s) | S::F4(s) | S::F8E8M0(s) => host(stream.clone_dtoh(s)),
            S::U32(s) => host(as_bytes(stream.clone_dtoh(s))),
            S::I16(s) => host(as_bytes(stream.clone_dtoh(s))),
            S::I32(s) => host(as_bytes(stream.clone_dtoh(s))),
            S::I64(s) => host(as_bytes(stream.clone_dtoh(s))),
            S::BF16(s) => host(as_bytes(stream.clone_dtoh(s))),
            S::F16(s) => host(as_bytes(stream.clone_dtoh(s))),
            S::F32(s) => host(as_bytes(stream.clone_dtoh(s))),
            S::F64(s) => host(as_bytes(stream.clone_dtoh(s))),
            S::F8E4M3(s) => host(as_bytes(stream.clone_dtoh(s))),
        }
    }

    /// Elements copied to the host, as their bytes.
    fn as_bytes<T: DeviceRepr, E>(elems: std::result::Result<Vec<T>, E>) -> std::result::Result<Vec<u8>, E> {
        elems.map(|v| {
            let len = std::mem::size_of_val(v.as_slice());
            // SAFETY: `v` holds `len` initialised bytes of plain numbers (DeviceRepr types), read as bytes while
            // it lives.
            unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), len) }.to_vec()
        })
    }
}
