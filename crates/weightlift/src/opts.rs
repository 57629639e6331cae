//! The per-call options every load takes, whatever its destination or path.

use std::sync::atomic::{AtomicBool, AtomicU64};

use weightlift_io::fault::FaultPlan;

/// Per-call options of a load.
#[derive(Debug, Default, Clone, Copy)]
pub struct LoadOpts<'a> {
    /// Incremented with every byte read (for progress bars).
    pub progress: Option<&'a AtomicU64>,
    /// Set to abandon the load (it then fails with a cancellation error, its memory released).
    pub cancel: Option<&'a AtomicBool>,
    /// Injected faults (tests).
    pub faults: Option<&'a FaultPlan>,
    /// Expected checksums: each tensor is hashed as soon as its bytes have landed, overlapped with the rest of the
    /// load, and a mismatch fails the load naming tensor and chunk (`Report::checks` says what was checked).
    pub checks: Option<&'a crate::checked::Checks>,
    /// Device loads of safetensors and GGUF checkpoints: every tensor starts at a device address that is a multiple
    /// of this (a power of two up to 256, what device allocations guarantee), as torch's allocator places tensors
    /// (256 bytes on a GPU), where the default places small neighbours as the file lays them out (their file
    /// offsets mod 256). Small tensors then
    /// share a block only where their offsets from its first tensor are multiples of it, so a file whose tensor
    /// sizes are not multiples of it costs more allocations and copies. Packed loads and host loads ignore it.
    pub tensor_align: Option<u64>,
    /// Device loads of safetensors and GGUF checkpoints (`Engine::load`, `load_some`): their blocks come from this
    /// allocator (a framework's own, so that it accounts for and reuses the memory) instead of the device's
    /// stream-ordered pool. Each block is allocated while the reads run, as from the pool. Other loads ignore it.
    pub device_alloc: Option<&'a dyn weightlift_cuda::DeviceAllocator>,
}
