//! weightlift's CUDA layer, over cudarc with the driver loaded at run time: a machine without an NVIDIA driver
//! builds and runs everything else, and gets [`CudaError::Unavailable`] (never a panic) from here.
//!
//! FFI in layers, as cudarc does: cudarc's `sys` (raw calls) and safe types (context, streams, events) where they
//! exist; owning wrappers here for what it lacks in the shape weightlift needs (stream-ordered device buffers,
//! `cuMemHostRegister`ed staging, the device sink). The libraries cudarc does not load for weightlift — cuFile and
//! nvCOMP — are bound the same way, each in a folder of three layers: `sys` (C types and entry points, looked up by
//! `library`, the one loader and symbol lookup), calls returning `Result`, then the owners ([`cufile::Cufile`],
//! [`nvcomp::Nvcomp`]). Every error type lives in `error`.
#![deny(missing_docs)]

mod ceiling;
pub mod cufile;
mod driver;
mod error;
pub mod gate;
mod gpu;
mod kernel_cache;
mod library;
mod memory;
pub mod nvcomp;
pub mod nvrtc;
mod sink;
pub mod unpack;
pub mod vmm;

pub use ceiling::{chunked_h2d_gbps, pinned_h2d_gbps};
pub use cudarc::driver::sys::{CUdeviceptr, CUstream};
pub use driver::{DriverInfo, missing_driver_symbols};
pub use error::{CudaError, CufileError, NvcompError};
pub use gpu::{ContextRestore, Gpu, GpuInfo, available, current_context, process_stream};
pub use memory::{
    CudaPinner, DeviceAllocator, DeviceBuffer, LEGACY_STREAM, PinnedBuffer, StreamMark, copy_device_to_host,
    copy_host_to_device, free_device_memory, order_after_stream, wait_for_stream, warm_streams,
};
pub use sink::{DeviceSink, PendingCopy, Targets};
