//! Finding NVIDIA's cuFile library (GPUDirect Storage) at run time. cudarc's loader does not try `libcufile.so.0`,
//! the name NVIDIA's Python wheels ship, so weightlift searches itself: the path the caller names (the engine's
//! `cufile_lib` setting), then the loader's own search path, then CUDA's library folders, then Python
//! environments' `nvidia/cu*/lib`. The first search in a process decides.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::CudaError;

/// Library names tried on the loader's search path.
const NAMES: &[&str] = &["libcufile.so", "libcufile.so.0", "libcufile.so.1"];

/// Where cuFile was found, or every place tried.
#[derive(Clone, Debug)]
pub struct CufileLocation {
    /// The name or path that loaded.
    pub found: Option<String>,
    /// Everything tried, in order.
    pub tried: Vec<String>,
    /// Why the last attempt failed.
    pub error: Option<String>,
}

/// Folders NVIDIA libraries are found in: CUDA's library folders, then the `nvidia/*/lib{,64}` folders of Python
/// environments (the active virtualenv, interpreter prefixes on PATH, and `PYTHONPATH` entries such as a
/// `pip install --target` folder). Shared with nvCOMP's loader.
pub(crate) fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/usr/local") {
        let mut cuda: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("cuda")))
            .collect();
        cuda.sort();
        dirs.extend(
            cuda.into_iter().flat_map(|c| [c.join("lib64"), c.join("lib"), c.join("targets/x86_64-linux/lib")]),
        );
    }
    // Python environments: the active virtualenv, then interpreter prefixes named on PATH.
    let mut prefixes: Vec<PathBuf> = std::env::var_os("VIRTUAL_ENV").map(PathBuf::from).into_iter().collect();
    if let Some(path) = std::env::var_os("PATH") {
        prefixes.extend(
            std::env::split_paths(&path)
                .filter(|p| p.join("python3").exists())
                .filter_map(|p| p.parent().map(Path::to_path_buf)),
        );
    }
    let mut site_dirs: Vec<PathBuf> =
        std::env::var_os("PYTHONPATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    for prefix in prefixes {
        for lib in ["lib", "lib64"] {
            let Ok(pys) = std::fs::read_dir(prefix.join(lib)) else { continue };
            site_dirs.extend(
                pys.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                    .map(|py| py.path().join("site-packages")),
            );
        }
    }
    for site in site_dirs {
        let Ok(kits) = std::fs::read_dir(site.join("nvidia")) else { continue };
        for kit in kits.flatten() {
            dirs.push(kit.path().join("lib"));
            dirs.push(kit.path().join("lib64"));
        }
    }
    dirs.retain(|d| d.is_dir());
    dirs.dedup();
    dirs
}

/// Tries to load cuFile (`explicit` first, if given); the library handle is kept for the life of the process once
/// found.
pub fn locate(explicit: Option<&Path>) -> (CufileLocation, Option<&'static libloading::Library>) {
    static FOUND: OnceLock<(CufileLocation, Option<libloading::Library>)> = OnceLock::new();
    let (loc, lib) = FOUND.get_or_init(|| {
        let mut candidates: Vec<String> = Vec::new();
        if let Some(p) = explicit {
            candidates.push(p.to_string_lossy().into_owned());
        }
        candidates.extend(NAMES.iter().map(|n| n.to_string()));
        for d in candidate_dirs() {
            for n in NAMES {
                let p = d.join(n);
                if p.exists() {
                    candidates.push(p.to_string_lossy().into_owned());
                }
            }
        }
        let mut loc = CufileLocation { found: None, tried: Vec::new(), error: None };
        for c in candidates {
            loc.tried.push(c.clone());
            // SAFETY: loading cuFile runs its initialisers, which only set up the library's own state.
            match unsafe { libloading::Library::new(&c) } {
                Ok(lib) => {
                    loc.found = Some(c);
                    loc.error = None;
                    return (loc, Some(lib));
                }
                Err(e) => loc.error = Some(e.to_string()),
            }
        }
        (loc, None)
    });
    (loc.clone(), lib.as_ref())
}

// --- The cuFile API, bound by hand: cudarc's cuFile types decode return codes into Rust enums, and a code this
// build does not know (another cuFile version) would be undefined behaviour there; here codes stay integers.

use std::ffi::{c_int, c_void};

/// `CUfileError_t`: a cuFile status and, for CUDA failures, the driver's code.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawStatus {
    pub err: u32,
    pub cu_err: u32,
}

#[repr(C)]
union DescrHandle {
    fd: c_int,
    handle: *mut c_void,
}

/// `CUfileDescr_t`.
#[repr(C)]
struct Descr {
    type_: u32,
    handle: DescrHandle,
    fs_ops: *const c_void,
}

/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD`.
const HANDLE_TYPE_FD: u32 = 1;

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

type FnOpen = unsafe extern "C" fn() -> RawStatus;
type FnProps = unsafe extern "C" fn(*mut DriverProps) -> RawStatus;
type FnHandleRegister = unsafe extern "C" fn(*mut *mut c_void, *mut Descr) -> RawStatus;
type FnHandleDeregister = unsafe extern "C" fn(*mut c_void);
type FnBufRegister = unsafe extern "C" fn(*const c_void, usize, c_int) -> RawStatus;
type FnBufDeregister = unsafe extern "C" fn(*const c_void) -> RawStatus;
type FnRead = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, i64, i64) -> isize;
type FnWrite = unsafe extern "C" fn(*mut c_void, *const c_void, usize, i64, i64) -> isize;
type FnVersion = unsafe extern "C" fn(*mut c_int) -> RawStatus;

/// The cuFile entry points weightlift uses.
#[derive(Clone, Copy)]
struct Api {
    driver_open: FnOpen,
    props: FnProps,
    handle_register: FnHandleRegister,
    handle_deregister: FnHandleDeregister,
    buf_register: FnBufRegister,
    buf_deregister: FnBufDeregister,
    read: FnRead,
    write: FnWrite,
    version: Option<FnVersion>,
}

/// A cuFile failure: the call, cuFile's status (or the negative return of a read/write) and what it means.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cuFile {call} failed: {what} (status {code})")]
pub struct CufileError {
    pub call: &'static str,
    pub code: i64,
    pub what: String,
}

fn describe(code: i64) -> String {
    match code {
        0 => "success".into(),
        5001 => "driver not initialised".into(),
        5007 => "platform not supported".into(),
        5008 => "I/O not supported".into(),
        5009 => "device not supported".into(),
        5010 => "nvidia-fs driver error".into(),
        5011 => "CUDA driver error".into(),
        5012 => "invalid CUDA pointer".into(),
        5013 => "invalid CUDA memory type".into(),
        5014 => "CUDA pointer range error".into(),
        5018 => "invalid file type".into(),
        5019 => "invalid file open flags (O_DIRECT needed)".into(),
        5020 => "O_DIRECT not set".into(),
        5022 => "invalid value".into(),
        5023 => "memory already registered".into(),
        5024 => "memory not registered".into(),
        5025 => "permission denied".into(),
        5027 => "file handle not registered".into(),
        5028 => "file handle already registered".into(),
        5029 => "device not found".into(),
        5030 => "internal error".into(),
        5034 => "I/O disabled".into(),
        c if c < 0 && c > -5000 => std::io::Error::from_raw_os_error((-c) as i32).to_string(),
        c => format!("cuFile error {c}"),
    }
}

fn check(call: &'static str, s: RawStatus) -> Result<(), CufileError> {
    if s.err == 0 { Ok(()) } else { Err(CufileError { call, code: s.err as i64, what: describe(s.err as i64) }) }
}

/// Whether cuFile moves data peer-to-peer or through host bounce buffers here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CufileMode {
    /// nvidia-fs (or P2PDMA) moves data between storage and GPU memory directly.
    PeerToPeer(String),
    /// No peer-to-peer path: cuFile reads into host bounce buffers and copies to the GPU.
    Compat(String),
}

/// An opened cuFile driver (opened once per process and never closed: closing while another user in the process,
/// e.g. PyTorch's GdsFile, still has handles would break them).
#[derive(Clone)]
pub struct Cufile {
    api: Api,
    pub props: DriverProps,
    pub mode: CufileMode,
    pub library: String,
    pub version: Option<i32>,
}

impl std::fmt::Debug for Cufile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cufile").field("library", &self.library).field("mode", &self.mode).finish()
    }
}

fn sym<T: Copy>(lib: &'static libloading::Library, name: &str) -> Result<T, String> {
    // SAFETY: the symbol is looked up by its documented C name and used with the matching C signature (`T`).
    unsafe { lib.get::<T>(name.as_bytes()) }.map(|s| *s).map_err(|e| format!("missing {name}: {e}"))
}

/// Whether the platform can move data peer-to-peer between storage and GPU memory (nvidia-fs loaded), found
/// without loading cuFile: the reason, or `None`.
pub fn platform_peer_to_peer() -> Option<String> {
    let v = std::fs::read_to_string("/proc/driver/nvidia-fs/version").ok()?;
    Some(format!("nvidia-fs {}", v.lines().next().unwrap_or("").trim()))
}

/// cuFile, opened, or why not (`library`: a path to try first). Needs a usable CUDA driver first (cuFile calls
/// into it). Opened once per process.
pub fn driver(library: Option<&Path>) -> Result<Cufile, CudaError> {
    static OPEN: OnceLock<Result<Cufile, Opening>> = OnceLock::new();
    OPEN.get_or_init(|| open_driver(library)).clone().map_err(|e| match e {
        Opening::Missing(why) => CudaError::CufileUnavailable(format!("cuFile unavailable: {why}")),
        Opening::Status(e) => CudaError::Cufile(e),
    })
}

#[derive(Clone)]
enum Opening {
    Missing(String),
    Status(CufileError),
}

impl From<String> for Opening {
    fn from(s: String) -> Opening {
        Opening::Missing(s)
    }
}

fn open_driver(library: Option<&Path>) -> Result<Cufile, Opening> {
    {
        crate::driver::driver()?;
        let (loc, lib) = locate(library);
        let lib = lib.ok_or_else(|| format!("libcufile not found (tried {})", loc.tried.join(", ")))?;
        let api = Api {
            driver_open: sym(lib, "cuFileDriverOpen")?,
            props: sym(lib, "cuFileDriverGetProperties")?,
            handle_register: sym(lib, "cuFileHandleRegister")?,
            handle_deregister: sym(lib, "cuFileHandleDeregister")?,
            buf_register: sym(lib, "cuFileBufRegister")?,
            buf_deregister: sym(lib, "cuFileBufDeregister")?,
            read: sym(lib, "cuFileRead")?,
            write: sym(lib, "cuFileWrite")?,
            version: sym(lib, "cuFileGetVersion").ok(),
        };
        // SAFETY: cuFileDriverOpen takes no arguments; the CUDA driver it needs is initialised above.
        check("cuFileDriverOpen", unsafe { (api.driver_open)() }).map_err(Opening::Status)?;
        let mut props = DriverProps::default();
        // SAFETY: `props` has the layout of CUfileDrvProps_t and is writable.
        check("cuFileDriverGetProperties", unsafe { (api.props)(&mut props) }).map_err(Opening::Status)?;
        let version = api.version.and_then(|f| {
            let mut v = 0;
            // SAFETY: valid out-pointer.
            (unsafe { f(&mut v) }.err == 0).then_some(v)
        });
        let mode = match platform_peer_to_peer() {
            Some(v) => CufileMode::PeerToPeer(v),
            None => CufileMode::Compat("no nvidia-fs driver loaded (/proc/driver/nvidia-fs absent): cuFile reads into host bounce buffers, then copies to the GPU".into()),
        };
        Ok(Cufile { api, props, mode, library: loc.found.unwrap_or_default(), version })
    }
}

/// A file registered with cuFile (deregistered on drop; the descriptor is borrowed and must outlive it).
#[derive(Debug)]
pub struct CufileHandle {
    api: Api,
    raw: *mut c_void,
}

// SAFETY: a cuFile handle is an opaque token that cuFile allows to be used from any thread.
unsafe impl Send for CufileHandle {}
// SAFETY: as above; reads and writes through one handle from several threads are allowed by cuFile.
unsafe impl Sync for CufileHandle {}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cuFile API")
    }
}

impl Cufile {
    pub fn is_peer_to_peer(&self) -> bool {
        matches!(self.mode, CufileMode::PeerToPeer(_))
    }

    /// Registers an open descriptor (O_DIRECT unless cuFile runs in compat mode).
    ///
    /// # Safety
    /// `fd` must stay open until the returned handle is dropped.
    pub unsafe fn register(&self, fd: c_int) -> Result<CufileHandle, CufileError> {
        let mut descr = Descr { type_: HANDLE_TYPE_FD, handle: DescrHandle { fd }, fs_ops: std::ptr::null() };
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: both pointers are valid for the call; `fd` is open per the contract.
        check("cuFileHandleRegister", unsafe { (self.api.handle_register)(&mut raw, &mut descr) })?;
        Ok(CufileHandle { api: self.api, raw })
    }

    /// Registers a device buffer for peer-to-peer transfers.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be device memory that stays allocated until [`Cufile::deregister_buffer`].
    pub unsafe fn register_buffer(&self, ptr: u64, len: usize) -> Result<(), CufileError> {
        // SAFETY: per the contract.
        check("cuFileBufRegister", unsafe { (self.api.buf_register)(ptr as *const c_void, len, 0) })
    }

    /// # Safety
    /// `ptr` must have been registered with [`Cufile::register_buffer`].
    pub unsafe fn deregister_buffer(&self, ptr: u64) -> Result<(), CufileError> {
        // SAFETY: per the contract.
        check("cuFileBufDeregister", unsafe { (self.api.buf_deregister)(ptr as *const c_void) })
    }
}

impl CufileHandle {
    /// `cuFileRead`: up to `size` bytes at `file_offset` into `base + buf_offset`; returns the bytes read.
    ///
    /// # Safety
    /// `base + buf_offset .. + size` must be writable memory (device memory, or host memory cuFile accepts) of the
    /// current context, untouched by others during the call.
    pub unsafe fn read(&self, base: u64, size: usize, file_offset: u64, buf_offset: u64) -> Result<usize, CufileError> {
        // SAFETY: per the contract; `raw` is a registered handle.
        let r = unsafe { (self.api.read)(self.raw, base as *mut c_void, size, file_offset as i64, buf_offset as i64) };
        if r < 0 {
            Err(CufileError { call: "cuFileRead", code: r as i64, what: describe(r as i64) })
        } else {
            Ok(r as usize)
        }
    }

    /// `cuFileWrite`: `size` bytes from `base + buf_offset` to `file_offset`; returns the bytes written.
    ///
    /// # Safety
    /// As for [`CufileHandle::read`], with the memory readable.
    pub unsafe fn write(
        &self,
        base: u64,
        size: usize,
        file_offset: u64,
        buf_offset: u64,
    ) -> Result<usize, CufileError> {
        // SAFETY: per the contract; `raw` is a registered handle.
        let r =
            unsafe { (self.api.write)(self.raw, base as *const c_void, size, file_offset as i64, buf_offset as i64) };
        if r < 0 {
            Err(CufileError { call: "cuFileWrite", code: r as i64, what: describe(r as i64) })
        } else {
            Ok(r as usize)
        }
    }
}

impl Drop for CufileHandle {
    fn drop(&mut self) {
        // SAFETY: `raw` was returned by cuFileHandleRegister and is deregistered once.
        unsafe { (self.api.handle_deregister)(self.raw) }
    }
}
