//! GPU-initiated NVMe for weightlift (BaM-style): CUDA kernels write NVMe submission entries, ring doorbells and
//! poll completions themselves, with no CPU on the I/O path.
//!
//! - [`spec`]: the protocol's data (queue entries, status codes, registers, Identify), encoded and decoded;
//! - [`prp`], [`queue`], [`plan`]: PRP building and walking, queue bookkeeping and read planning, written once and
//!   shared by the CPU submitter, the GPU kernel (generated with the same constants) and the software controller;
//! - [`Bus`]: a controller's registers and DMA memory, implemented by the software controller ([`sim`]) and by
//!   VFIO for real drives ([`vfio`]); [`Controller::bring_up`] is written once against it;
//! - [`IoQueuePair`] and [`load_host`]: the CPU submitter;
//! - [`gpu`]: the kernels (tier 1: data through pinned host memory; tier 2: data straight into device memory) and
//!   [`gpu::GpuLoader`], which loads byte ranges into device memory through them.
//!
//! `unsafe` appears where memory is shared with a device: register windows, DMA buffers, the software controller's
//! IOMMU, VFIO's ioctls and mappings, and CUDA registration and launches.
#![deny(missing_docs)]

pub mod bus;
mod error;
pub mod gpu;
mod host;
mod io;
pub mod plan;
pub mod prp;
pub mod queue;
pub mod sim;
pub mod spec;
pub mod vfio;

pub use bus::{Bus, DeviceDma, DmaBuffer, DmaMapping, Mmio, MmioKind};
pub use error::NvmeError;
pub use host::{BringUp, Controller, ControllerInfo, NamespaceInfo, RawQueuePair};
pub use io::{Completion, IoQueuePair, LoadReport, QueueOptions, load_host};
pub use plan::ByteRange;
pub use sim::{Fault, SoftConfig, SoftNvme, SoftStats};
