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
    pub block: Arc<DeviceBuffer>,
    pub offset: u64,
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
    Host(HostBuffer),
    Pinned(PinnedBuffer),
    Device(DeviceTensor),
}

impl TensorData {
    pub fn len(&self) -> usize {
        match self {
            TensorData::Host(b) => b.len(),
            TensorData::Pinned(b) => b.len(),
            TensorData::Device(d) => d.len as usize,
        }
    }

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
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub data: TensorData,
}

/// The tensors of a load (in the order asked for) and what the load did.
#[derive(Debug)]
pub struct Loaded {
    pub tensors: Vec<Tensor>,
    pub report: Report,
}

/// A caller-owned destination for [`crate::Engine::read_into`].
#[derive(Clone, Copy, Debug)]
pub enum RawDest {
    /// Host memory (pageable or pinned).
    Host(*mut u8),
    /// Memory of CUDA device `ordinal`.
    Device { ordinal: u32, ptr: weightlift_cuda::CUdeviceptr },
}

/// A caller-owned source for [`crate::Engine::write_from`].
#[derive(Clone, Copy, Debug)]
pub enum RawSrc {
    Host(*const u8),
    Device { ordinal: u32, ptr: weightlift_cuda::CUdeviceptr },
}
