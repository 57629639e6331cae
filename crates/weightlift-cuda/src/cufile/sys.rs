//! cuFile's C types and entry points, bound by hand: cudarc's cuFile types decode return codes into Rust enums, and a
//! code this build does not know (another cuFile version) would be undefined behaviour there; here codes stay
//! integers. Nothing here is called; [`super::result`] calls.

use std::ffi::{c_int, c_void};

use crate::library::sym;

/// `CUfileError_t`: a cuFile status and, for CUDA failures, the driver's code.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawStatus {
    /// The `CUfileOpError` (0 for success; 5000 and up for failures).
    pub err: u32,
    /// The `CUresult` of the CUDA call that failed, where `err` is a CUDA driver error.
    pub cu_err: u32,
}

#[repr(C)]
pub(crate) union DescrHandle {
    pub fd: c_int,
    pub handle: *mut c_void,
}

/// `CUfileDescr_t`.
#[repr(C)]
pub(crate) struct Descr {
    pub type_: u32,
    pub handle: DescrHandle,
    pub fs_ops: *const c_void,
}

/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD`.
pub(crate) const HANDLE_TYPE_FD: u32 = 1;

/// `CUfileDrvProps_t` (cuFile 1.1 and later), as `cuFileDriverGetProperties` fills it. Sizes are in KiB, the unit
/// of cuFile's matching setters (`cuFileDriverSetMaxDirectIOSize`, say).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DriverProps {
    /// nvidia-fs driver major version (0 where it is not loaded).
    pub nvfs_major: u32,
    /// nvidia-fs driver minor version.
    pub nvfs_minor: u32,
    /// Largest I/O, in KiB, that cuFile completes by polling rather than waiting (when polling is on).
    pub poll_thresh_size: usize,
    /// Largest single direct I/O, in KiB; cuFile splits larger requests.
    pub max_direct_io_size: usize,
    /// `CUfileDriverStatusFlags_t` bits: the storage kinds supported (NVMe, NVMe-oF, NFS, Lustre, ...).
    pub dstatusflags: u32,
    /// `CUfileDriverControlFlags_t` bits: poll mode, compat mode allowed, POSIX I/O mode.
    pub dcontrolflags: u32,
    /// `CUfileFeatureFlags_t` bits: dynamic routing, batch I/O, streams, parallel I/O, PCI P2PDMA.
    pub fflags: u32,
    /// GPU memory per device cuFile may use for its own bounce buffers, in KiB.
    pub max_device_cache_size: u32,
    /// Size of each of those bounce buffers, in KiB.
    pub per_buffer_cache_size: u32,
    /// Most device memory `cuFileBufRegister` may pin, in KiB.
    pub max_device_pinned_mem_size: u32,
    /// Most entries one batch I/O may hold.
    pub max_batch_io_size: u32,
    /// Batch I/O timeout in milliseconds.
    pub max_batch_io_timeout_msecs: u32,
}

pub(crate) type FnOpen = unsafe extern "C" fn() -> RawStatus;
pub(crate) type FnProps = unsafe extern "C" fn(*mut DriverProps) -> RawStatus;
pub(crate) type FnHandleRegister = unsafe extern "C" fn(*mut *mut c_void, *mut Descr) -> RawStatus;
pub(crate) type FnHandleDeregister = unsafe extern "C" fn(*mut c_void);
pub(crate) type FnBufRegister = unsafe extern "C" fn(*const c_void, usize, c_int) -> RawStatus;
pub(crate) type FnBufDeregister = unsafe extern "C" fn(*const c_void) -> RawStatus;
pub(crate) type FnRead = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, i64, i64) -> isize;
pub(crate) type FnWrite = unsafe extern "C" fn(*mut c_void, *const c_void, usize, i64, i64) -> isize;
pub(crate) type FnVersion = unsafe extern "C" fn(*mut c_int) -> RawStatus;

/// The cuFile entry points weightlift uses.
#[derive(Clone, Copy)]
pub(crate) struct Api {
    pub driver_open: FnOpen,
    pub props: FnProps,
    pub handle_register: FnHandleRegister,
    pub handle_deregister: FnHandleDeregister,
    pub buf_register: FnBufRegister,
    pub buf_deregister: FnBufDeregister,
    pub read: FnRead,
    pub write: FnWrite,
    pub version: Option<FnVersion>,
}

impl Api {
    /// Every entry point weightlift calls, looked up in `lib` (cuFileGetVersion is optional: older releases lack it).
    pub fn bind(lib: &'static libloading::Library) -> Result<Api, String> {
        Ok(Api {
            driver_open: sym(lib, "cuFileDriverOpen")?,
            props: sym(lib, "cuFileDriverGetProperties")?,
            handle_register: sym(lib, "cuFileHandleRegister")?,
            handle_deregister: sym(lib, "cuFileHandleDeregister")?,
            buf_register: sym(lib, "cuFileBufRegister")?,
            buf_deregister: sym(lib, "cuFileBufDeregister")?,
            read: sym(lib, "cuFileRead")?,
            write: sym(lib, "cuFileWrite")?,
            version: sym(lib, "cuFileGetVersion").ok(),
        })
    }
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cuFile API")
    }
}
