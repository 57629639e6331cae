//! Device memory shared between processes (CUDA IPC): a process exports the allocation holding an address as a
//! 64-byte handle; another process on the same machine opens it and writes into it. weightlift's load server
//! (`weightlift serve`) uses it to read checkpoints into a client's memory with staging that is already set up.
//!
//! Only memory from `cuMemAlloc` (and so `cudaMalloc`, which PyTorch's caching allocator uses) can be exported
//! this way; stream-ordered pool memory cannot, and [`export`] says so.

use cudarc::driver::sys;

use crate::error::CudaError;
use crate::gpu::Gpu;

/// Bytes of a handle.
pub const HANDLE_BYTES: usize = 64;

/// An address of device memory as another process can open it: the allocation's handle and the offset of the
/// address inside that allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exported {
    pub handle: [u8; HANDLE_BYTES],
    pub offset: u64,
}

/// Exports the allocation holding `ptr` on `gpu` (whose context must be current on this thread).
pub fn export(gpu: &Gpu, ptr: u64) -> Result<Exported, CudaError> {
    let d = gpu.ordinal();
    let mut base: sys::CUdeviceptr = 0;
    let mut size: usize = 0;
    // SAFETY: out-pointers to locals; the driver checks `ptr`.
    unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr as sys::CUdeviceptr) }
        .result()
        .map_err(CudaError::driver(d, "cuMemGetAddressRange"))?;
    let mut h = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
    // SAFETY: `h` is a handle-sized out-parameter; `base` is the start of a live allocation of this context.
    unsafe { sys::cuIpcGetMemHandle(h.as_mut_ptr(), base) }
        .result()
        .map_err(CudaError::driver(d, "cuIpcGetMemHandle"))?;
    // SAFETY: written by the successful call above.
    let h = unsafe { h.assume_init() };
    let mut handle = [0u8; HANDLE_BYTES];
    for (out, &b) in handle.iter_mut().zip(h.reserved.iter()) {
        *out = b as u8;
    }
    Ok(Exported { handle, offset: ptr - base })
}

/// Another process's allocation, opened in this one; closed on drop.
#[derive(Debug)]
pub struct Imported {
    gpu: Gpu,
    ptr: sys::CUdeviceptr,
    len: u64,
}

impl Imported {
    /// Opens `handle` on `gpu` (made current on this thread for the call). Fails for a handle of this process, of
    /// another device, or of an allocation already freed.
    pub fn open(gpu: &Gpu, handle: &[u8; HANDLE_BYTES]) -> Result<Imported, CudaError> {
        gpu.bind()?;
        let h = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        // SAFETY: `h` is zeroed, and its bytes are set from the 64 of `handle` below before use.
        let mut h = unsafe { h.assume_init() };
        for (out, &b) in h.reserved.iter_mut().zip(handle.iter()) {
            *out = b as _;
        }
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: an out-pointer to a local; the driver validates the handle.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                h,
                sys::CUipcMem_flags_enum::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint,
            )
        }
        .result()
        .map_err(CudaError::driver(gpu.ordinal(), "cuIpcOpenMemHandle"))?;
        let mut imported = Imported { gpu: gpu.clone(), ptr, len: 0 };
        let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: out-pointers to locals; `ptr` was just mapped (closed by `imported`'s drop on failure).
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }
            .result()
            .map_err(CudaError::driver(gpu.ordinal(), "cuMemGetAddressRange"))?;
        imported.len = size as u64 - (ptr - base) as u64;
        Ok(imported)
    }

    /// The allocation's start in this process.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The allocation's bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the allocation has no bytes (never, for an allocation that could be exported).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        let _restore = crate::gpu::ContextRestore::save();
        if self.gpu.bind().is_ok() {
            // SAFETY: `ptr` came from a successful cuIpcOpenMemHandle and is closed once.
            let r = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
            if r != sys::CUresult::CUDA_SUCCESS {
                tracing::warn!(device = self.gpu.ordinal(), error = ?r, "cuIpcCloseMemHandle failed");
            }
        }
    }
}

/// The device's UUID as 32 hex digits: the same device has the same UUID in every process, whatever each
/// process's `CUDA_VISIBLE_DEVICES` numbers it.
pub fn uuid(gpu: &Gpu) -> Result<String, CudaError> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: out-pointer to a local.
    unsafe { sys::cuDeviceGet(&mut dev, gpu.ordinal() as i32) }
        .result()
        .map_err(CudaError::driver(gpu.ordinal(), "cuDeviceGet"))?;
    let mut u = std::mem::MaybeUninit::<sys::CUuuid>::zeroed();
    // SAFETY: out-pointer to a zeroed CUuuid.
    unsafe { sys::cuDeviceGetUuid_v2(u.as_mut_ptr(), dev) }
        .result()
        .map_err(CudaError::driver(gpu.ordinal(), "cuDeviceGetUuid"))?;
    // SAFETY: written by the successful call above.
    let u = unsafe { u.assume_init() };
    Ok(u.bytes.iter().map(|&b| format!("{:02x}", b as u8)).collect())
}
