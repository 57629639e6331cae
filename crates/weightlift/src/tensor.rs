//! Loaded tensors and the memory they live in.

use std::sync::Arc;

use weightlift_cuda::{DeviceBuffer, PinnedBuffer};
use weightlift_format::DType;
use weightlift_io::HostBuffer;

use crate::error::{Error, Result};
use crate::report::Report;

/// A tensor's bytes inside a device allocation that neighbouring small tensors may share (see `placement`); the
/// allocation is freed when its last tensor is dropped.
#[derive(Debug, Clone)]
pub struct DeviceTensor {
    /// The allocation holding the tensor (and maybe its neighbours).
    pub block: Arc<DeviceBuffer>,
    /// Where the tensor starts in it.
    pub offset: u64,
    /// The tensor's bytes.
    pub len: u64,
}

impl DeviceTensor {
    /// The tensor's device address.
    pub fn device_ptr(&self) -> weightlift_cuda::CUdeviceptr {
        self.block.device_ptr() + self.offset
    }
}

/// A loaded tensor's bytes.
#[derive(Debug)]
pub enum TensorData {
    /// Plain host memory.
    Host(HostBuffer),
    /// Page-locked host memory, registered with CUDA.
    Pinned(PinnedBuffer),
    /// GPU memory.
    Device(DeviceTensor),
}

impl TensorData {
    /// Bytes of the tensor.
    pub fn len(&self) -> usize {
        match self {
            TensorData::Host(b) => b.len(),
            TensorData::Pinned(b) => b.len(),
            TensorData::Device(d) => d.len as usize,
        }
    }

    /// Whether the tensor has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `out.len()` bytes starting at `offset` into `out` (from device memory where the tensor lives there).
    pub fn read_back(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let past = || {
            Error::InvalidArgument(format!("{} bytes at {offset} lie past the {}-byte tensor", out.len(), self.len()))
        };
        let host: &[u8] = match self {
            TensorData::Host(b) => b,
            TensorData::Pinned(b) => b,
            TensorData::Device(d) => {
                if offset.checked_add(out.len() as u64).is_none_or(|end| end > d.len) {
                    return Err(past());
                }
                return Ok(d.block.read_back((d.offset + offset) as usize, out)?);
            }
        };
        let start = offset as usize;
        let src = host.get(start..start.saturating_add(out.len())).ok_or_else(past)?;
        out.copy_from_slice(src);
        Ok(())
    }
}

/// One loaded tensor.
#[derive(Debug)]
pub struct Tensor {
    /// Its name in the checkpoint.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its shape, row-major.
    pub shape: Vec<u64>,
    /// Its bytes, where the load put them.
    pub data: TensorData,
}

/// The tensors of a load (in the order asked for) and what the load did.
#[derive(Debug)]
pub struct Loaded {
    /// The tensors, in the order asked for.
    pub tensors: Vec<Tensor>,
    /// What the load did: data path, bytes, timings, settings.
    pub report: Report,
}

/// A caller-owned destination for [`crate::Engine::read_into`].
#[derive(Clone, Copy, Debug)]
pub enum RawDest {
    /// Host memory (pageable or pinned).
    Host(*mut u8),
    /// Memory of CUDA device `ordinal`.
    Device {
        /// The CUDA device's index.
        ordinal: u32,
        /// An address in that device's primary context.
        ptr: weightlift_cuda::CUdeviceptr,
    },
}

/// A caller-owned source for [`crate::Engine::write_from`].
#[derive(Clone, Copy, Debug)]
pub enum RawSrc {
    /// Host memory (pageable or pinned).
    Host(*const u8),
    /// Memory of CUDA device `ordinal`.
    Device {
        /// The CUDA device's index.
        ordinal: u32,
        /// An address in that device's primary context.
        ptr: weightlift_cuda::CUdeviceptr,
    },
}
