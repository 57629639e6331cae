//! NVIDIA's cuFile library (GPUDirect Storage), found at run time, in cudarc's layers: `sys` (C types and entry
//! points), `result` (calls returning `Result`), and here the owners ([`Cufile`], [`CufileHandle`]). cudarc's
//! loader does not try `libcufile.so.0`, the name NVIDIA's Python wheels ship, so weightlift searches itself: the
//! path the caller names (the engine's `cufile_lib` setting), then the loader's own search path, then CUDA's library
//! folders, then Python environments' `nvidia/cu*/lib`. The first search in a process decides.

mod result;
mod sys;

use std::ffi::{c_int, c_void};
use std::path::Path;
use std::sync::OnceLock;

pub use sys::{DriverProps, RawStatus};

use crate::error::CudaError;
pub use crate::error::CufileError;
use sys::Api;

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

/// Tries to load cuFile (`explicit` first, if given); the library handle is kept for the life of the process once
/// found.
pub fn locate(explicit: Option<&Path>) -> (CufileLocation, Option<&'static libloading::Library>) {
    static FOUND: OnceLock<(CufileLocation, Option<libloading::Library>)> = OnceLock::new();
    let (loc, lib) = FOUND.get_or_init(|| {
        let tried = crate::library::candidates(explicit, NAMES);
        match crate::library::load_first(&tried) {
            Ok((name, lib)) => (CufileLocation { found: Some(name), tried, error: None }, Some(lib)),
            Err(last) => (CufileLocation { found: None, tried, error: Some(last) }, None),
        }
    });
    (loc.clone(), lib.as_ref())
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
    /// The driver's properties (`cuFileDriverGetProperties`).
    pub props: DriverProps,
    /// Whether data moves peer-to-peer or through cuFile's compat path, and why.
    pub mode: CufileMode,
    /// The library file that was loaded.
    pub library: String,
    /// cuFile's version as `cuFileGetVersion` reports it (e.g. 1150 for 1.15), where the library has that call.
    pub version: Option<i32>,
}

impl std::fmt::Debug for Cufile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cufile").field("library", &self.library).field("mode", &self.mode).finish()
    }
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
    crate::driver::driver()?;
    let (loc, lib) = locate(library);
    let lib = lib.ok_or_else(|| format!("libcufile not found (tried {})", loc.tried.join(", ")))?;
    let api = Api::bind(lib)?;
    let (props, version) = result::open(&api).map_err(Opening::Status)?;
    let mode = match platform_peer_to_peer() {
        Some(v) => CufileMode::PeerToPeer(v),
        None => CufileMode::Compat("no nvidia-fs driver loaded (/proc/driver/nvidia-fs absent): cuFile reads into host bounce buffers, then copies to the GPU".into()),
    };
    Ok(Cufile { api, props, mode, library: loc.found.unwrap_or_default(), version })
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

impl Cufile {
    /// Whether data moves between storage and GPU memory peer-to-peer ([`CufileMode::PeerToPeer`]).
    pub fn is_peer_to_peer(&self) -> bool {
        matches!(self.mode, CufileMode::PeerToPeer(_))
    }

    /// Registers an open descriptor (O_DIRECT unless cuFile runs in compat mode).
    ///
    /// # Safety
    /// `fd` must stay open until the returned handle is dropped.
    pub unsafe fn register(&self, fd: c_int) -> Result<CufileHandle, CufileError> {
        // SAFETY: `fd` stays open until the handle is dropped, per this function's contract.
        let raw = unsafe { result::handle_register(&self.api, fd) }?;
        Ok(CufileHandle { api: self.api, raw })
    }

    /// Registers a device buffer for peer-to-peer transfers.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be device memory that stays allocated until [`Cufile::deregister_buffer`].
    pub unsafe fn register_buffer(&self, ptr: u64, len: usize) -> Result<(), CufileError> {
        // SAFETY: per the contract.
        result::check("cuFileBufRegister", unsafe { (self.api.buf_register)(ptr as *const c_void, len, 0) })
    }

    /// # Safety
    /// `ptr` must have been registered with [`Cufile::register_buffer`].
    pub unsafe fn deregister_buffer(&self, ptr: u64) -> Result<(), CufileError> {
        // SAFETY: per the contract.
        result::check("cuFileBufDeregister", unsafe { (self.api.buf_deregister)(ptr as *const c_void) })
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
        result::transferred("cuFileRead", r)
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
        result::transferred("cuFileWrite", r)
    }
}

impl Drop for CufileHandle {
    fn drop(&mut self) {
        // SAFETY: `raw` was returned by cuFileHandleRegister and is deregistered once.
        unsafe { (self.api.handle_deregister)(self.raw) }
    }
}
