//! Device memory another process can map: the driver's virtual memory management, allocations made with
//! `cuMemCreate` asking for POSIX file-descriptor handles, exported as a file descriptor
//! (`cuMemExportToShareableHandle`) and mapped by the receiving process (`cuMemImportFromShareableHandle`,
//! `cuMemMap`). The physical memory lives while any process maps it or holds a handle or descriptor to it, so a
//! mapping outlives the exporter's death, which legacy IPC handles (`cuIpcGetMemHandle`) leave undefined; and the
//! stream-ordered pool the loads use cannot be exported at all. `docs/design-keeper.md` says why this way.

use std::ffi::c_void;
use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cudarc::driver::sys;

use crate::driver::missing_driver_symbols;
use crate::error::CudaError;
use crate::gpu::{ContextRestore, Gpu};

/// Driver symbols the shareable memory calls: checked apart from the loads' own, so that a driver without them
/// leaves loads working and only sharing unavailable.
pub const SHAREABLE_SYMBOLS: &[&str] = &[
    "cuMemCreate",
    "cuMemRelease",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
    "cuDeviceGetUuid_v2",
    "cuMemcpyDtoDAsync_v2",
];

fn props(ordinal: u32) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct of integers and a null pointer: all zeros is a valid value.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = ordinal as i32;
    p
}

/// Whether `gpu` can share memory through file descriptors, and if so the allocation granularity (sizes are
/// rounded up to it); the reason otherwise.
pub fn shareable_granularity(gpu: &Gpu) -> Result<u64, String> {
    let missing = missing_driver_symbols(SHAREABLE_SYMBOLS)?;
    if !missing.is_empty() {
        return Err(format!("the NVIDIA driver lacks {}", missing.join(", ")));
    }
    let ordinal = gpu.ordinal();
    let attr = |a: sys::CUdevice_attribute| -> Result<i32, String> {
        let mut v = 0;
        // SAFETY: valid out-pointer; the device ordinal exists (the Gpu was opened).
        unsafe { sys::cuDeviceGetAttribute(&mut v, a, ordinal as i32) }
            .result()
            .map_err(|e| format!("cuDeviceGetAttribute: {e}"))?;
        Ok(v)
    };
    if attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)? == 0 {
        return Err(format!("cuda:{ordinal} does not support virtual memory management"));
    }
    if attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)? == 0 {
        return Err(format!("cuda:{ordinal} cannot export memory as file descriptors"));
    }
    let p = props(ordinal);
    let mut g: usize = 0;
    // SAFETY: valid out-pointer and properties.
    unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &p,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    }
    .result()
    .map_err(|e| format!("cuMemGetAllocationGranularity: {e}"))?;
    if g == 0 || !g.is_power_of_two() {
        return Err(format!("cuda:{ordinal}: unexpected allocation granularity {g}"));
    }
    Ok(g as u64)
}

/// The device's UUID (`cuDeviceGetUuid`), as `GPU-xxxxxxxx-xxxx-…` the way nvidia-smi writes it: what names a
/// GPU across processes whose `CUDA_VISIBLE_DEVICES` differ.
pub fn gpu_uuid(gpu: &Gpu) -> Result<String, CudaError> {
    let ordinal = gpu.ordinal();
    let missing = missing_driver_symbols(&["cuDeviceGetUuid_v2"]).map_err(CudaError::Unavailable)?;
    if !missing.is_empty() {
        return Err(CudaError::Unavailable("the NVIDIA driver lacks cuDeviceGetUuid_v2".into()));
    }
    // SAFETY: CUuuid is 16 plain bytes.
    let mut u: sys::CUuuid = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; the device exists.
    unsafe { sys::cuDeviceGetUuid_v2(&mut u, ordinal as i32) }
        .result()
        .map_err(CudaError::driver(ordinal, "cuDeviceGetUuid"))?;
    let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
    let hex = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    Ok(format!("GPU-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16)))
}

/// A virtual address range with memory mapped into it, readable and writable (or read-only) by this process's
/// context of the device; unmapped and the range freed when dropped.
struct Mapping {
    gpu: Gpu,
    va: sys::CUdeviceptr,
    len: usize,
    /// Whether the device's access is read-only (asked for, and granted by the driver).
    read_only: bool,
}

impl Mapping {
    /// Reserves `len` bytes of addresses, maps `handle` there and grants this device access.
    fn map(
        gpu: &Gpu,
        handle: sys::CUmemGenericAllocationHandle,
        len: usize,
        read_only: bool,
    ) -> Result<Mapping, CudaError> {
        let dev = gpu.ordinal();
        let mut va: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; `len` is a multiple of the granularity (the caller's allocation size).
        unsafe { sys::cuMemAddressReserve(&mut va, len, 0, 0, 0) }
            .result()
            .map_err(CudaError::driver(dev, "cuMemAddressReserve"))?;
        // SAFETY: the range was just reserved, the handle is live and at least `len` bytes.
        if let Err(e) = unsafe { sys::cuMemMap(va, len, 0, handle, 0) }.result() {
            // SAFETY: reserved above, nothing mapped.
            unsafe { sys::cuMemAddressFree(va, len) };
            return Err(CudaError::driver(dev, "cuMemMap")(e));
        }
        let mut m = Mapping { gpu: gpu.clone(), va, len, read_only };
        let access = |flags| {
            // SAFETY: a plain C struct; zeros then the fields set below.
            let mut a: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
            a.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            a.location.id = dev as i32;
            a.flags = flags;
            // SAFETY: the range is mapped (dropping `m` unmaps it on failure).
            unsafe { sys::cuMemSetAccess(va, len, &a, 1) }.result()
        };
        if read_only {
            match access(sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ) {
                Ok(()) => return Ok(m),
                // A driver that grants device memory no read-only access: read-write, read-only by contract.
                Err(e) => {
                    tracing::debug!("cuda:{dev}: a read-only mapping was refused ({e}); mapped read-write");
                    m.read_only = false;
                }
            }
        }
        access(sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            .map_err(CudaError::driver(dev, "cuMemSetAccess"))?;
        Ok(m)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let _restore = ContextRestore::save();
        let _ = self.gpu.bind();
        // SAFETY: the range was reserved and mapped by `map`, and nothing uses it once the mapping is dropped.
        unsafe {
            if let Err(e) = sys::cuMemUnmap(self.va, self.len).result() {
                tracing::warn!("cuMemUnmap: {e}");
            }
            if let Err(e) = sys::cuMemAddressFree(self.va, self.len).result() {
                tracing::warn!("cuMemAddressFree: {e}");
            }
        }
    }
}

/// Device memory this process allocated to share: mapped read-write here, exportable as file descriptors.
pub struct SharedMemory {
    map: Mapping,
    handle: sys::CUmemGenericAllocationHandle,
    /// The descriptor exported first, duplicated for each later export (the driver's export costs far more than a
    /// `dup`); closed when the memory is dropped.
    exported: std::sync::Mutex<Option<OwnedFd>>,
}

// SAFETY: an address range and an allocation handle of a thread-safe context; the driver calls on them are
// thread-safe.
unsafe impl Send for SharedMemory {}
// SAFETY: as above; shared access reads the address or exports a descriptor.
unsafe impl Sync for SharedMemory {}

impl fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedMemory(cuda:{}, {:#x}, {} bytes)", self.map.gpu.ordinal(), self.map.va, self.map.len)
    }
}

impl SharedMemory {
    /// At least `len` bytes (rounded up to `granularity`, from [`shareable_granularity`]) on `gpu`'s device.
    pub fn create(gpu: &Gpu, len: u64, granularity: u64) -> Result<SharedMemory, CudaError> {
        let dev = gpu.ordinal();
        let size = len.max(1).div_ceil(granularity) * granularity;
        let _restore = ContextRestore::save();
        gpu.bind()?;
        let p = props(dev);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and properties; the size is a multiple of the granularity.
        let r = unsafe { sys::cuMemCreate(&mut handle, size as usize, &p, 0) };
        if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            let (free, total) = gpu.mem_info().unwrap_or((0, 0));
            return Err(CudaError::OutOfMemory { device: dev, bytes: size, free, total });
        }
        r.result().map_err(CudaError::driver(dev, "cuMemCreate"))?;
        match Mapping::map(gpu, handle, size as usize, false) {
            Ok(map) => Ok(SharedMemory { map, handle, exported: std::sync::Mutex::new(None) }),
            Err(e) => {
                // SAFETY: created above and mapped nowhere.
                unsafe { sys::cuMemRelease(handle) };
                Err(e)
            }
        }
    }

    /// The memory's device address in this process.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.map.va
    }

    /// Its size in bytes (a multiple of the granularity).
    pub fn len(&self) -> u64 {
        self.map.len as u64
    }

    /// Whether it has no bytes (never: sizes are rounded up to the granularity).
    pub fn is_empty(&self) -> bool {
        self.map.len == 0
    }

    /// A new file descriptor another process can map with [`ImportedMemory::import`] (send it over a Unix socket):
    /// the driver exports the memory once, and each call returns a duplicate of that descriptor.
    pub fn export(&self) -> Result<OwnedFd, CudaError> {
        let mut exported = self.exported.lock().unwrap_or_else(|p| p.into_inner());
        let fd = match &*exported {
            Some(fd) => fd,
            None => exported.insert(self.export_from_driver()?),
        };
        fd.try_clone().map_err(|e| {
            CudaError::Unavailable(format!("cuda:{}: duplicating the exported descriptor: {e}", self.map.gpu.ordinal()))
        })
    }

    fn export_from_driver(&self) -> Result<OwnedFd, CudaError> {
        let dev = self.map.gpu.ordinal();
        let mut fd: libc::c_int = -1;
        // SAFETY: for POSIX descriptors the driver writes an int through the pointer.
        unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut libc::c_int).cast::<c_void>(),
                self.handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        }
        .result()
        .map_err(CudaError::driver(dev, "cuMemExportToShareableHandle"))?;
        if fd < 0 {
            return Err(CudaError::Unavailable(format!("cuda:{dev}: cuMemExportToShareableHandle gave no descriptor")));
        }
        // SAFETY: the driver handed us a new descriptor we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // The handle is released here, the mapping unmapped and the exported descriptor closed after this body
        // (fields drop last): the driver frees the memory once it is released, unmapped and no descriptor of it is
        // open anywhere, so memory another process still maps stays until that process unmaps it.
        let _restore = ContextRestore::save();
        let _ = self.map.gpu.bind();
        // SAFETY: the handle was created by `create` and is released once.
        if let Err(e) = unsafe { sys::cuMemRelease(self.handle) }.result() {
            tracing::warn!("cuMemRelease: {e}");
        }
    }
}

/// Memory another process shared, mapped into this one (read-only if asked); unmapped when dropped. The memory
/// stays valid while mapped here, whatever becomes of the process that made it.
pub struct ImportedMemory {
    map: Mapping,
}

// SAFETY: as for SharedMemory.
unsafe impl Send for ImportedMemory {}
// SAFETY: as for SharedMemory.
unsafe impl Sync for ImportedMemory {}

impl fmt::Debug for ImportedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ImportedMemory(cuda:{}, {:#x}, {} bytes)", self.map.gpu.ordinal(), self.map.va, self.map.len)
    }
}

impl ImportedMemory {
    /// Maps the `len` bytes (the exporter's size) behind `fd` (from [`SharedMemory::export`], maybe in another
    /// process) on `gpu`'s device. The descriptor may be closed afterwards.
    pub fn import(gpu: &Gpu, fd: BorrowedFd<'_>, len: u64, read_only: bool) -> Result<ImportedMemory, CudaError> {
        let dev = gpu.ordinal();
        let _restore = ContextRestore::save();
        gpu.bind()?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: for POSIX descriptors the descriptor itself is passed as the pointer value.
        unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as usize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        }
        .result()
        .map_err(CudaError::driver(dev, "cuMemImportFromShareableHandle"))?;
        let mapped = Mapping::map(gpu, handle, len as usize, read_only);
        // The mapping holds the memory from here on; the handle's own reference is not needed.
        // SAFETY: imported above, released once.
        unsafe { sys::cuMemRelease(handle) };
        Ok(ImportedMemory { map: mapped? })
    }

    /// The memory's device address in this process.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.map.va
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.map.len as u64
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.map.len == 0
    }

    /// Whether the mapping is read-only for the device (asked for and granted; else writes are not prevented).
    pub fn is_read_only(&self) -> bool {
        self.map.read_only
    }
}

/// Queues a device-to-device copy of `len` bytes on the raw stream `stream`.
///
/// # Safety
/// Both ranges must be device memory of `gpu`'s context valid for `len` bytes until the copy completes, and
/// `stream` a live stream of that context.
pub unsafe fn copy_device_to_device(
    gpu: &Gpu,
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    len: usize,
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    // SAFETY: per the contract.
    unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, stream) }
        .result()
        .map_err(CudaError::driver(gpu.ordinal(), "cuMemcpyDtoDAsync"))
}
