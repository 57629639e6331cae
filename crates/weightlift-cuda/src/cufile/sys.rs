//! cuFile's C types and entry points, bound by hand: cudarc's cuFile types decode return codes into Rust enums, and a
//! code this build does not know (another cuFile version) would be undefined behaviour there; here codes stay
//! integers. Nothing here is called; [`super::result`] calls.

use std::ffi::{c_int, c_void};

use crate::library::sym;

/// `CUfileError_t`: a cuFile status and, for CUDA failures, the driver's code.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawStatus {
    pub err: u32,
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

/// `CUfileDrvProps_t` (cuFile 1.1 and later).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DriverProps {
    pub nvfs_major: u32,
    pub nvfs_minor: u32,
    pub poll_thresh_size: usize,
    pub max_direct_io_size: usize,
    pub dstatusflags: u32,
    pub dcontrolflags: u32,
    pub fflags: u32,
    pub max_device_cache_size: u32,
    pub per_buffer_cache_size: u32,
    pub max_device_pinned_mem_size: u32,
    pub max_batch_io_size: u32,
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
