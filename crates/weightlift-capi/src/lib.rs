//! The C API of weightlift (`include/weightlift.h`, generated from this file by cbindgen): engines, checkpoints,
//! loads of tensors and byte ranges into host or device memory (synchronous, or ordered on a `CUstream`), writes,
//! block devices read by LBA, region tables read by kind, and the layer streamer.
//!
//! Every function catches panics (returned as `WL_ERR_INTERNAL`), checks its pointers for NULL, and leaves a
//! one-line message for `wl_last_error()` on failure. An out-pointer may be NULL only where its function says so
//! (a byte count beside an action); a call whose result would go nowhere is `WL_ERR_INVALID_ARGUMENT`. Every
//! offset and length is checked (overflow, the largest file offset, the destination's `len`) before a byte moves.
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use weightlift::cuda::{CUstream, CudaError, DeviceBuffer};
use weightlift::format::{FormatError, TensorIndex};
use weightlift::io::IoError;
use weightlift::{BlockDevice, Device, Engine, Error, LayerStreamer, RawDest, RawSrc, RegionTable, Settings};

/// Result of every call. `WL_OK` is 0; `wl_last_error()` explains any other value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum wl_status {
    WL_OK = 0,
    /// A NULL pointer, a bad setting, a destination too small, memory of the wrong device.
    WL_ERR_INVALID_ARGUMENT = 1,
    /// A file, object (or its bucket), tensor or region kind that does not exist.
    WL_ERR_NOT_FOUND = 2,
    /// Reading or writing failed (the message names the file and offset).
    WL_ERR_IO = 3,
    /// A checkpoint's headers are malformed.
    WL_ERR_FORMAT = 4,
    /// A read past the end of a file, or an LBA past the end of a device.
    WL_ERR_OUT_OF_RANGE = 5,
    /// Host or device memory ran out.
    WL_ERR_OUT_OF_MEMORY = 6,
    /// CUDA (or cuFile) is not available on this machine.
    WL_ERR_UNAVAILABLE = 7,
    /// The CUDA driver refused a call.
    WL_ERR_CUDA = 8,
    /// The operation was cancelled.
    WL_ERR_CANCELLED = 9,
    /// The path is a FIFO, socket or device where a regular file is needed.
    WL_ERR_NOT_A_FILE = 10,
    /// A bug in weightlift (a caught panic); please report it with the message.
    WL_ERR_INTERNAL = 11,
    /// The file's permissions, or the object store's answer to the credentials, refuse the access.
    WL_ERR_ACCESS_DENIED = 12,
    /// Bytes differ from their expected checksum (the message names tensor, file and chunk), or the checksums to
    /// check against are missing (no manifest beside a file, a tensor it does not list).
    WL_ERR_CHECKSUM = 13,
}

/// `wl_mem.device` for host memory.
pub const WL_HOST: i32 = -1;

/// A span of memory: host memory (`device == WL_HOST`, `ptr` a host address) or memory of CUDA device `device`
/// (`ptr` a `CUdeviceptr`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct wl_mem {
    pub device: i32,
    pub ptr: u64,
    pub len: u64,
}

/// An engine: I/O lanes, pinned staging and CUDA streams kept between loads. Thread-safe.
#[derive(Debug)]
pub struct wl_engine {
    engine: Arc<Engine>,
}

/// An opened checkpoint (safetensors, GGUF, or a shard index `*.safetensors.index.json`).
#[derive(Debug)]
pub struct wl_checkpoint {
    index: TensorIndex,
    /// Position of each tensor by name: a program that finds every tensor of 100 k by name is not quadratic.
    positions: HashMap<String, usize>,
    names: Vec<CString>,
    dtypes: Vec<CString>,
    files: Vec<CString>,
}

/// One tensor of a checkpoint. The pointers stay valid until the checkpoint is closed.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct wl_tensor_info {
    pub name: *const c_char,
    /// safetensors dtype name (`"BF16"`, `"F32"`, …) or GGML type name (`"Q4_K"`, …).
    pub dtype: *const c_char,
    pub ndim: usize,
    /// `ndim` dimensions, outermost first.
    pub shape: *const u64,
    pub nbytes: u64,
    /// The file holding it and the byte offset of its data there.
    pub file: *const c_char,
    pub offset: u64,
}

/// A read or write running in the background (`wl_read_async`, `wl_block_read_async`).
#[derive(Debug)]
pub struct wl_op {
    worker: Option<std::thread::JoinHandle<()>>,
    result: Arc<Mutex<Option<Result<u64, Error>>>>,
}

/// A block device, or a file standing for one, addressed by LBA.
#[derive(Debug)]
pub struct wl_block {
    dev: BlockDevice,
}

/// Named LBA ranges ("kinds") of one block device.
#[derive(Debug)]
pub struct wl_regions {
    table: RegionTable,
}

/// A layer streamer (see `wl_layers_open`).
#[derive(Debug)]
pub struct wl_layers {
    streamer: LayerStreamer,
}

/// A layer handed back by `wl_layers_load`: valid until the next `wl_layers_load` or `wl_layers_close`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct wl_layer {
    pub layer: u32,
    pub slot: u32,
    /// The slot's address (host or device memory, as the streamer's device).
    pub base: u64,
    /// Bytes of the slot the layer occupies.
    pub bytes: u64,
    /// Tensors of the layer: `tensors[k]` is a position in the checkpoint, at `base + offsets[k]`.
    pub count: usize,
    pub tensors: *const usize,
    pub offsets: *const u64,
}

/// What a layer streamer did so far.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct wl_layers_stats {
    pub loads: u64,
    pub bytes: u64,
    /// Seconds spent reading layers in the background.
    pub load_seconds: f64,
    /// Seconds `wl_layers_load` spent waiting for bytes.
    pub wait_seconds: f64,
    pub requests: u64,
    /// Requests whose layer was already in its slot.
    pub ready_hits: u64,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: String) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn status_of(e: &Error) -> wl_status {
    use wl_status::*;
    match e {
        Error::Format(f) => format_status(f),
        Error::Io(io) => match io {
            IoError::NotAFile { .. } => WL_ERR_NOT_A_FILE,
            IoError::PastEnd { .. } => WL_ERR_OUT_OF_RANGE,
            IoError::OutOfMemory { .. } => WL_ERR_OUT_OF_MEMORY,
            IoError::Cancelled => WL_ERR_CANCELLED,
            IoError::Setting { .. } => WL_ERR_INVALID_ARGUMENT,
            // What the kernel says of an offset or length no file can have (as the Python front raises it).
            io if io.raw_os_error() == Some(EINVAL) => WL_ERR_INVALID_ARGUMENT,
            // A file or object missing or refused, when opened or while read.
            io => io.io_kind().and_then(kind_status).unwrap_or(WL_ERR_IO),
        },
        Error::Cuda(c) => match c {
            CudaError::Unavailable(_) | CudaError::CufileUnavailable(_) | CudaError::NoSuchDevice { .. } => {
                WL_ERR_UNAVAILABLE
            }
            CudaError::OutOfMemory { .. } => WL_ERR_OUT_OF_MEMORY,
            CudaError::OutOfBounds { .. } => WL_ERR_INVALID_ARGUMENT,
            _ => WL_ERR_CUDA,
        },
        Error::InvalidArgument(_) => WL_ERR_INVALID_ARGUMENT,
        Error::TensorNotFound { .. } | Error::UnknownKind { .. } => WL_ERR_NOT_FOUND,
        Error::LbaOutOfRange { .. } => WL_ERR_OUT_OF_RANGE,
        Error::Verify(_) | Error::Pack(weightlift::pack::PackError::Checksum { .. }) => WL_ERR_CHECKSUM,
        _ => WL_ERR_IO,
    }
}

const EINVAL: i32 = 22;

/// The status of a failure to open a file or an object, by what it means (an object's error reads as a local
/// file's of the same meaning: see `RemoteError::io_kind`); `None` for a plain I/O error.
fn kind_status(kind: std::io::ErrorKind) -> Option<wl_status> {
    use std::io::ErrorKind as K;
    match kind {
        K::NotFound => Some(wl_status::WL_ERR_NOT_FOUND),
        K::PermissionDenied => Some(wl_status::WL_ERR_ACCESS_DENIED),
        K::InvalidInput => Some(wl_status::WL_ERR_INVALID_ARGUMENT),
        _ => None,
    }
}

fn format_status(f: &FormatError) -> wl_status {
    use weightlift::format::ErrorKind;
    match &f.kind {
        ErrorKind::Open(e) => kind_status(e.kind()).unwrap_or(wl_status::WL_ERR_IO),
        ErrorKind::Remote(r) => kind_status(r.io_kind()).unwrap_or(wl_status::WL_ERR_IO),
        ErrorKind::Read { .. } | ErrorKind::Write(_) => wl_status::WL_ERR_IO,
        ErrorKind::NotAFile { .. } => wl_status::WL_ERR_NOT_A_FILE,
        _ => wl_status::WL_ERR_FORMAT,
    }
}

/// Runs `f`, turning an error or a panic into a status and a message. Every entry point that can touch CUDA runs
/// its work through here (or [`close`]): the caller's thread keeps its current CUDA context whatever `f` binds
/// there (cudarc's safe calls, and dropping its streams, events and contexts, bind theirs on the calling thread).
/// `tests/entry_points.rs` checks that every entry point does.
fn guard(f: impl FnOnce() -> Result<(), Error>) -> wl_status {
    let _restore = weightlift::cuda::ContextRestore::save();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => wl_status::WL_OK,
        Ok(Err(e)) => {
            set_error(e.to_string());
            status_of(&e)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_error(format!("internal error (please report): {what}"));
            wl_status::WL_ERR_INTERNAL
        }
    }
}

/// Frees a handle the caller closes, through [`guard`].
///
/// # Safety
/// `p` must be NULL or from `Box::into_raw`, freed once, unused afterwards.
unsafe fn close<T>(p: *mut T) {
    if !p.is_null() {
        let _ = guard(|| {
            // SAFETY: per the contract, it came from Box::into_raw and is freed once.
            drop(unsafe { Box::from_raw(p) });
            Ok(())
        });
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// `&T` from a pointer the caller passed, or an error naming the argument.
///
/// # Safety
/// `p` must be NULL or point at a live `T`.
unsafe fn arg<'a, T>(p: *const T, name: &str) -> Result<&'a T, Error> {
    // SAFETY: per the contract, a non-NULL `p` points at a live `T`.
    unsafe { p.as_ref() }.ok_or_else(|| invalid(format!("{name} is NULL")))
}

/// # Safety
/// `p` must be NULL or point at a live `T` nobody else uses during the call.
unsafe fn arg_mut<'a, T>(p: *mut T, name: &str) -> Result<&'a mut T, Error> {
    // SAFETY: per the contract.
    unsafe { p.as_mut() }.ok_or_else(|| invalid(format!("{name} is NULL")))
}

/// # Safety
/// `p` must be NULL or a NUL-terminated string.
unsafe fn string(p: *const c_char, name: &str) -> Result<String, Error> {
    if p.is_null() {
        return Err(invalid(format!("{name} is NULL")));
    }
    // SAFETY: per the contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(str::to_owned).map_err(|_| invalid(format!("{name} is not UTF-8")))
}

/// Stores `v` through an optional out-pointer if it is not NULL.
///
/// # Safety
/// `out` must be NULL or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, v: T) {
    if !out.is_null() {
        // SAFETY: per the contract.
        unsafe { out.write(v) };
    }
}

fn dest_of(m: &wl_mem) -> Result<RawDest, Error> {
    match m.device {
        WL_HOST if m.ptr == 0 && m.len > 0 => Err(invalid("host destination pointer is NULL")),
        d if d >= 0 && m.ptr == 0 && m.len > 0 => Err(invalid(format!("device {d} pointer is 0"))),
        WL_HOST => Ok(RawDest::Host(m.ptr as *mut u8)),
        d if d >= 0 => Ok(RawDest::Device { ordinal: d as u32, ptr: m.ptr }),
        d => Err(invalid(format!("device {d}: expected WL_HOST (-1) or a CUDA ordinal"))),
    }
}

fn src_of(m: &wl_mem) -> Result<RawSrc, Error> {
    match dest_of(m)? {
        RawDest::Host(p) => Ok(RawSrc::Host(p as *const u8)),
        RawDest::Device { ordinal, ptr } => Ok(RawSrc::Device { ordinal, ptr }),
    }
}

fn device_of(d: i32) -> Result<Device, Error> {
    match d {
        WL_HOST => Ok(Device::Cpu),
        d if d >= 0 => Ok(Device::Cuda(d as u32)),
        d => Err(invalid(format!("device {d}: expected WL_HOST (-1) or a CUDA ordinal"))),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Library

/// The library's version (`"0.1.0"`), a static string.
#[unsafe(no_mangle)]
pub extern "C" fn wl_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The message of the calling thread's last failed call (empty if none). Valid until that thread's next call.
#[unsafe(no_mangle)]
pub extern "C" fn wl_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A static name for a status (`"WL_ERR_IO"`); `"unknown status"` for a value that is none.
///
/// It takes an integer, not `enum wl_status`: a C caller may pass any value, and an out-of-range enum would be
/// undefined behaviour on this side.
#[unsafe(no_mangle)]
pub extern "C" fn wl_status_name(status: i32) -> *const c_char {
    use wl_status::*;
    const ALL: [wl_status; 14] = [
        WL_OK,
        WL_ERR_INVALID_ARGUMENT,
        WL_ERR_NOT_FOUND,
        WL_ERR_IO,
        WL_ERR_FORMAT,
        WL_ERR_OUT_OF_RANGE,
        WL_ERR_OUT_OF_MEMORY,
        WL_ERR_UNAVAILABLE,
        WL_ERR_CUDA,
        WL_ERR_CANCELLED,
        WL_ERR_NOT_A_FILE,
        WL_ERR_INTERNAL,
        WL_ERR_ACCESS_DENIED,
        WL_ERR_CHECKSUM,
    ];
    let Some(&status) = ALL.iter().find(|&&s| s as i32 == status) else { return c"unknown status".as_ptr() };
    let s: &'static str = match status {
        WL_OK => "WL_OK\0",
        WL_ERR_INVALID_ARGUMENT => "WL_ERR_INVALID_ARGUMENT\0",
        WL_ERR_NOT_FOUND => "WL_ERR_NOT_FOUND\0",
        WL_ERR_IO => "WL_ERR_IO\0",
        WL_ERR_FORMAT => "WL_ERR_FORMAT\0",
        WL_ERR_OUT_OF_RANGE => "WL_ERR_OUT_OF_RANGE\0",
        WL_ERR_OUT_OF_MEMORY => "WL_ERR_OUT_OF_MEMORY\0",
        WL_ERR_UNAVAILABLE => "WL_ERR_UNAVAILABLE\0",
        WL_ERR_CUDA => "WL_ERR_CUDA\0",
        WL_ERR_CANCELLED => "WL_ERR_CANCELLED\0",
        WL_ERR_NOT_A_FILE => "WL_ERR_NOT_A_FILE\0",
        WL_ERR_INTERNAL => "WL_ERR_INTERNAL\0",
        WL_ERR_ACCESS_DENIED => "WL_ERR_ACCESS_DENIED\0",
        WL_ERR_CHECKSUM => "WL_ERR_CHECKSUM\0",
    };
    s.as_ptr().cast()
}

// ---------------------------------------------------------------------------------------------------------------
// Engines

/// Opens an engine. `settings` is NULL or `"name=value,name=value"` with names of weightlift's settings table
/// (`threads`, `io`, `chunk_size`, …); unnamed settings come from the `WEIGHTLIFT_*` environment variables.
///
/// # Safety
/// `settings` must be NULL or a NUL-terminated string; `out` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_engine_open(settings: *const c_char, out: *mut *mut wl_engine) -> wl_status {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let mut overrides = weightlift::Overrides::new();
        if !settings.is_null() {
            // SAFETY: per the contract.
            let text = unsafe { string(settings, "settings") }?;
            for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let (k, v) =
                    item.split_once('=').ok_or_else(|| invalid(format!("setting {item:?}: expected name=value")))?;
                overrides.set(k.trim(), v.trim());
            }
        }
        let engine = Engine::new(Settings::resolve(&overrides)?)?;
        let b = Box::new(wl_engine { engine: Arc::new(engine) });
        // SAFETY: `out` is valid per the contract.
        unsafe { out.write(Box::into_raw(b)) };
        Ok(())
    })
}

/// Closes an engine (objects opened from it keep what they need alive).
///
/// # Safety
/// `engine` must be NULL or from `wl_engine_open`, closed once, unused afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_engine_close(engine: *mut wl_engine) {
    // SAFETY: per the contract, it came from `Box::into_raw` and is closed once.
    unsafe { close(engine) };
}

/// Sets the engine up for loads onto `device` (`WL_HOST` or a CUDA ordinal) now, so that the first load pays
/// for none of it: the I/O lanes' staging (pinned for a GPU), and for a GPU its streams and a first use of its
/// memory pool. A program's first load otherwise does this while it runs. Waits for loads in progress to leave
/// the lanes; cheap when everything is set up already.
///
/// # Safety
/// `engine` must be live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_engine_prepare(engine: *const wl_engine, device: i32) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let e = unsafe { arg(engine, "engine") }?;
        e.engine.prepare(device_of(device)?)?;
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------------------------
// Checkpoints

/// Opens a checkpoint's index (headers only; no tensor data is read). `path` is a local path or the URL of an
/// object (`s3://`, `gs://`, `az://`, `http(s)://`), whose header is fetched and whose version (ETag) is pinned.
///
/// # Safety
/// `path` must be a NUL-terminated string; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_checkpoint_open(path: *const c_char, out: *mut *mut wl_checkpoint) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let path = PathBuf::from(unsafe { string(path, "path") }?);
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let index = weightlift::format::open(&[path], None)?;
        let c = |s: &str| CString::new(s.replace('\0', "\\0")).unwrap_or_default();
        let names = index.tensors.iter().map(|t| c(&t.name)).collect();
        let dtypes = index.tensors.iter().map(|t| c(t.dtype.name())).collect();
        let files = index.files.iter().map(|f| c(&f.path.to_string_lossy())).collect();
        let mut positions = HashMap::with_capacity(index.tensors.len());
        for (i, t) in index.tensors.iter().enumerate() {
            positions.entry(t.name.clone()).or_insert(i);
        }
        let b = Box::new(wl_checkpoint { index, positions, names, dtypes, files });
        // SAFETY: `out` is valid per the contract.
        unsafe { out.write(Box::into_raw(b)) };
        Ok(())
    })
}

/// Closes a checkpoint.
///
/// # Safety
/// `ckpt` must be NULL or from `wl_checkpoint_open`, closed once, unused afterwards (including the strings and
/// shapes its `wl_tensor_info`s point at).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_checkpoint_close(ckpt: *mut wl_checkpoint) {
    // SAFETY: per the contract, it came from `Box::into_raw` and is closed once.
    unsafe { close(ckpt) };
}

/// The number of tensors (0 for NULL).
///
/// # Safety
/// `ckpt` must be NULL or a live checkpoint.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_checkpoint_len(ckpt: *const wl_checkpoint) -> usize {
    // SAFETY: per the contract.
    unsafe { ckpt.as_ref() }.map_or(0, |c| c.index.tensors.len())
}

/// Describes tensor `i` (in file order).
///
/// # Safety
/// `ckpt` must be a live checkpoint; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_checkpoint_tensor(
    ckpt: *const wl_checkpoint,
    i: usize,
    out: *mut wl_tensor_info,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let c = unsafe { arg(ckpt, "ckpt") }?;
        let t = c
            .index
            .tensors
            .get(i)
            .ok_or_else(|| invalid(format!("tensor {i} of a checkpoint with {}", c.index.tensors.len())))?;
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let info = wl_tensor_info {
            name: c.names[i].as_ptr(),
            dtype: c.dtypes[i].as_ptr(),
            ndim: t.shape.len(),
            shape: t.shape.as_ptr(),
            nbytes: t.nbytes,
            file: c.files[t.file].as_ptr(),
            offset: t.offset,
        };
        // SAFETY: `out` is valid per the contract.
        unsafe { out.write(info) };
        Ok(())
    })
}

/// The position of the tensor named `name` (`index` must not be NULL).
///
/// # Safety
/// `ckpt` must be a live checkpoint; `name` a NUL-terminated string; `index` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_checkpoint_find(
    ckpt: *const wl_checkpoint,
    name: *const c_char,
    index: *mut usize,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let (c, name) = unsafe { (arg(ckpt, "ckpt")?, string(name, "name")?) };
        if index.is_null() {
            return Err(invalid("index is NULL"));
        }
        let i = *c.positions.get(&name).ok_or_else(|| Error::TensorNotFound {
            name: name.clone(),
            where_: c.index.files.first().map(|f| f.path.display().to_string()).unwrap_or_default(),
        })?;
        // SAFETY: `index` is not NULL, and valid per the contract.
        unsafe { index.write(i) };
        Ok(())
    })
}

/// Loads tensors `which[k]` of `ckpt` into `dests[k]` (k < n) through one plan: all destinations on one device
/// (host, or one CUDA device), each at least as long as its tensor. Returns when every byte has arrived. An object's
/// bytes come from the version its header was read from (a replaced object fails the load).
///
/// # Safety
/// `engine` and `ckpt` must be live; `which` and `dests` must hold `n` entries; each destination must be valid
/// for writes of its `len` bytes and untouched by anything else until this returns.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_load_tensors(
    engine: *const wl_engine,
    ckpt: *const wl_checkpoint,
    which: *const usize,
    dests: *const wl_mem,
    n: usize,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        unsafe { load_tensors(engine, ckpt, which, dests, n, false) }
    })
}

/// `wl_load_tensors`, then every tensor checked against the checksum manifest beside its file
/// (`FILE.xxh3.json`, written by `weightlift checksum`): host memory hashed in place, device memory copied back
/// one tensor at a time. The manifests are read before anything is loaded. A tensor whose bytes differ fails with
/// `WL_ERR_CHECKSUM` naming tensor, file and chunk; so does a missing manifest or a tensor it does not list.
///
/// # Safety
/// As for `wl_load_tensors`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_load_tensors_checked(
    engine: *const wl_engine,
    ckpt: *const wl_checkpoint,
    which: *const usize,
    dests: *const wl_mem,
    n: usize,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        unsafe { load_tensors(engine, ckpt, which, dests, n, true) }
    })
}

/// `wl_load_tensors` and, when `checked`, `wl_load_tensors_checked`.
///
/// # Safety
/// As for `wl_load_tensors`.
unsafe fn load_tensors(
    engine: *const wl_engine,
    ckpt: *const wl_checkpoint,
    which: *const usize,
    dests: *const wl_mem,
    n: usize,
    checked: bool,
) -> Result<(), Error> {
    // SAFETY: per the contract.
    let (e, c) = unsafe { (arg(engine, "engine")?, arg(ckpt, "ckpt")?) };
    if n == 0 {
        return Ok(());
    }
    if which.is_null() || dests.is_null() {
        return Err(invalid("which or dests is NULL"));
    }
    // SAFETY: per the contract both hold `n` entries.
    let (which, dests) = unsafe { (std::slice::from_raw_parts(which, n), std::slice::from_raw_parts(dests, n)) };
    let mut ranges = Vec::with_capacity(n);
    let mut raw = Vec::with_capacity(n);
    for (k, (&i, d)) in which.iter().zip(dests).enumerate() {
        let t = c
            .index
            .tensors
            .get(i)
            .ok_or_else(|| invalid(format!("which[{k}] = {i}: the checkpoint has {}", c.index.tensors.len())))?;
        if d.len < t.nbytes {
            return Err(invalid(format!("dests[{k}] holds {} bytes; tensor {:?} needs {}", d.len, t.name, t.nbytes)));
        }
        ranges.push(weightlift::ByteRange::new(t.file, t.offset, t.nbytes, 0).into_dest(k as u32));
        raw.push((dest_of(d)?, d.len));
    }
    let checks = if checked { Some(weightlift::Checks::from_manifests(&c.index, which)?) } else { None };
    // The files as parsed: an object's bytes come from the version its header was read from.
    let req = weightlift::ReadRequest::new(
        weightlift::Sources::Described(&c.index.files),
        &ranges,
        weightlift::Dests::Memory(&raw),
    );
    // SAFETY: per the contract, each destination is valid for its length and unaliased.
    unsafe { e.engine.read(&req) }?;
    if let Some(checks) = checks {
        let at: Vec<weightlift::RawDest> = raw.iter().map(|r| r.0).collect();
        // SAFETY: per the contract, each destination holds its tensor's bytes (just read) and nothing writes it.
        unsafe { e.engine.check_memory(&checks, &c.index, which, &at) }?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------------
// Byte ranges

/// Reads up to `dest.len` bytes of `path` (a local path or an object's URL) from `offset` into `dest`, like
/// `pread`: `*bytes_read` (if not NULL) is the count, fewer at the end of the file.
///
/// # Safety
/// `engine` live; `path` NUL-terminated; `dest` valid for writes of `dest.len` bytes and untouched by anything
/// else until this returns; `bytes_read` NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_read(
    engine: *const wl_engine,
    path: *const c_char,
    offset: u64,
    dest: wl_mem,
    bytes_read: *mut u64,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let (e, path) = unsafe { (arg(engine, "engine")?, string(path, "path")?) };
        let raw = dest_of(&dest)?;
        // SAFETY: per the contract.
        let (n, _) = unsafe { e.engine.read_at(path.as_ref(), offset, dest.len, raw, &Default::default()) }?;
        // SAFETY: per the contract.
        unsafe { put(bytes_read, n) };
        Ok(())
    })
}

/// Writes `src.len` bytes of `src` into `path` at `offset` (creating the file, never truncating it), then
/// `fsync`s it if `durable` is non-zero. `*bytes_written` (if not NULL) is the count.
///
/// # Safety
/// `engine` live; `path` NUL-terminated; `src` valid for reads of `src.len` bytes and unmodified until this
/// returns; `bytes_written` NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_write(
    engine: *const wl_engine,
    path: *const c_char,
    offset: u64,
    src: wl_mem,
    durable: i32,
    bytes_written: *mut u64,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let (e, path) = unsafe { (arg(engine, "engine")?, string(path, "path")?) };
        let raw = src_of(&src)?;
        // SAFETY: per the contract.
        let n = unsafe { e.engine.write_from(path.as_ref(), offset, src.len, raw, durable != 0) }?;
        // SAFETY: per the contract.
        unsafe { put(bytes_written, n) };
        Ok(())
    })
}

/// Starts a read in the background and hands back an operation.
///
/// With a stream (a `CUstream` of `dest`'s device; `dest` must then be device memory), the copy into `dest` is
/// queued on the stream now, behind a gate, and the background thread reads the file into pinned host staging and
/// opens the gate: the copy lands after the work queued before the call, and the stream's later work sees the data
/// (as with `cuFileReadAsync`), with no CUDA call on the background thread while the stream waits. `len` is what
/// the copy carries (fixed when it is queued). Without a stream the read goes straight into `dest` in the background.
///
/// # Safety
/// `stream` must be NULL or a live stream of `dest`'s device that outlives the operation; `dest` as for `wl_read`,
/// untouched until the operation is waited for; `out` valid for a write.
unsafe fn start_op(
    dest: &wl_mem,
    len: u64,
    stream: *mut c_void,
    gpu_of: impl FnOnce(u32) -> Result<weightlift::cuda::Gpu, Error>,
    read: impl FnOnce(RawDest) -> Result<u64, Error> + Send + 'static,
    out: *mut *mut wl_op,
) -> Result<(), Error> {
    use weightlift::cuda::gate::{Direction, OrderedTransfer};
    if out.is_null() {
        return Err(invalid("out is NULL"));
    }
    let raw = dest_of(dest)?;
    let staged = match (stream.is_null(), raw) {
        (true, _) => None,
        (false, RawDest::Device { ordinal, ptr }) => {
            let gpu = gpu_of(ordinal)?;
            // SAFETY: per the contract, `stream` is a live stream of this device outliving the operation, and
            // `ptr` holds at least `len <= dest.len` writable bytes.
            Some(unsafe { OrderedTransfer::queue(&gpu, stream as CUstream, ptr, len as usize, Direction::ToDevice) }?)
        }
        (false, RawDest::Host(_)) => return Err(invalid("a stream orders reads into device memory only")),
    };
    let result = Arc::new(Mutex::new(None));
    let slot = result.clone();
    let target = SendDest(raw);
    let worker = std::thread::Builder::new()
        .name("weightlift-capi-op".into())
        .spawn(move || {
            let mut staged = staged;
            let to = match staged.as_mut() {
                Some(t) => RawDest::Host(t.staging().as_mut_ptr()),
                None => target.get(),
            };
            let r = catch_unwind(AssertUnwindSafe(|| read(to)))
                .unwrap_or_else(|_| Err(invalid("internal error (please report): the read panicked")));
            if let (Some(t), Ok(got)) = (staged.as_mut(), &r) {
                // A file that shrank since the copy was queued: the copy must not carry stale bytes.
                let got = (*got as usize).min(t.staging().len());
                t.staging()[got..].fill(0);
            }
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            if let Some(mut t) = staged {
                t.open();
                drop(t); // waits until the stream's copy no longer needs the staging buffer
            }
        })
        .map_err(|e| Error::Io(IoError::Thread(e)))?;
    let b = Box::new(wl_op { worker: Some(worker), result });
    // SAFETY: per the contract.
    unsafe { out.write(Box::into_raw(b)) };
    Ok(())
}

/// A host or device address that may cross to the operation's thread (the caller keeps it valid).
#[derive(Clone, Copy)]
struct SendDest(RawDest);
// SAFETY: the address is only used by the operation's thread while the caller keeps the memory alive and
// untouched (the contract of the functions starting operations).
unsafe impl Send for SendDest {}

impl SendDest {
    fn get(self) -> RawDest {
        self.0
    }
}

/// `wl_read` in the background, optionally ordered on a CUDA stream (see `wl_op_wait`).
///
/// With `stream` non-NULL (a `CUstream` of `dest`'s device; `dest` must be device memory) the read starts after
/// the work queued on the stream before this call, and work queued on the stream afterwards waits for the read,
/// as `cuFileReadAsync` orders it. With NULL the read just runs in the background.
///
/// # Safety
/// As for `wl_read`, with `dest` untouched until `wl_op_wait` returns; the engine must stay open until then;
/// `stream` NULL or a live stream of `dest`'s device that outlives the operation; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_read_async(
    engine: *const wl_engine,
    path: *const c_char,
    offset: u64,
    dest: wl_mem,
    stream: *mut c_void,
    out: *mut *mut wl_op,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let (e, path) = unsafe { (arg(engine, "engine")?, string(path, "path")?) };
        let eng = e.engine.clone();
        // What a pread would return, fixed now: a stream-ordered copy is queued with this length.
        let file_len = e.engine.len_of(path.as_ref())?;
        let len = dest.len.min(file_len.saturating_sub(offset));
        let read = move |to: RawDest| {
            let to = SendDest(to);
            // SAFETY: per the contract, the destination (or the operation's staging) stays valid and untouched until
            // the operation is waited for, and holds `len` bytes.
            unsafe { eng.read_at(path.as_ref(), offset, len, to.get(), &Default::default()) }.map(|(n, _)| n)
        };
        let gpu_engine = e.engine.clone();
        // SAFETY: per the contract.
        unsafe { start_op(&dest, len, stream, move |n| gpu_engine.gpu(n), read, out) }
    })
}

/// Whether an operation has finished (1) or not (0); 1 for NULL.
///
/// # Safety
/// `op` must be NULL or a live operation.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_op_done(op: *const wl_op) -> i32 {
    // SAFETY: per the contract.
    match unsafe { op.as_ref() } {
        None => 1,
        Some(op) => i32::from(op.result.lock().map(|r| r.is_some()).unwrap_or(true)),
    }
}

/// Waits for an operation, stores its byte count (if `bytes` is not NULL), frees it, and returns its status.
/// With a stream, call this after the stream has passed the operation (or from another thread).
///
/// # Safety
/// `op` must be from a `*_async` call and waited for once; `bytes` NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_op_wait(op: *mut wl_op, bytes: *mut u64) -> wl_status {
    guard(|| {
        if op.is_null() {
            return Err(invalid("op is NULL"));
        }
        // SAFETY: per the contract, it came from Box::into_raw and is consumed once.
        let mut op = unsafe { Box::from_raw(op) };
        if let Some(w) = op.worker.take() {
            let _ = w.join();
        }
        let r = op
            .result
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_else(|| Err(invalid("the operation produced no result")));
        let n = r?;
        // SAFETY: per the contract.
        unsafe { put(bytes, n) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------------------------
// Block devices and regions

/// Opens a block device (its logical block size from the kernel when `block_size` is 0) or a regular file
/// standing for one (512-byte blocks when `block_size` is 0) for reads by LBA.
///
/// # Safety
/// `engine` live; `path` NUL-terminated; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_block_open(
    engine: *const wl_engine,
    path: *const c_char,
    block_size: u32,
    out: *mut *mut wl_block,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let (e, path) = unsafe { (arg(engine, "engine")?, string(path, "path")?) };
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let dev = BlockDevice::open(e.engine.clone(), path.as_ref(), (block_size != 0).then_some(block_size))?;
        // SAFETY: per the contract.
        unsafe { out.write(Box::into_raw(Box::new(wl_block { dev }))) };
        Ok(())
    })
}

/// The block size and the number of addressable blocks (either out-pointer may be NULL, not both).
///
/// # Safety
/// `dev` live; the out-pointers NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_block_info(dev: *const wl_block, block_size: *mut u32, blocks: *mut u64) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let d = unsafe { arg(dev, "dev") }?;
        if block_size.is_null() && blocks.is_null() {
            return Err(invalid("block_size and blocks are both NULL"));
        }
        // SAFETY: per the contract.
        unsafe {
            put(block_size, d.dev.block_size());
            put(blocks, d.dev.blocks());
        }
        Ok(())
    })
}

/// Reads `count` blocks from `lba` into `dest` (which must hold `count` × block size bytes).
///
/// # Safety
/// `dev` live; `dest` valid for writes of `dest.len` bytes, untouched until this returns.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_block_read(dev: *const wl_block, lba: u64, count: u64, dest: wl_mem) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let d = unsafe { arg(dev, "dev") }?;
        let (raw, _) = checked_block_dest(&d.dev, lba, count, &dest)?;
        // SAFETY: per the contract; the length was checked against `count` blocks.
        unsafe { d.dev.read(lba, count, raw) }?;
        Ok(())
    })
}

/// `dest` as a destination for `count` blocks from `lba`, and their byte length.
fn checked_block_dest(dev: &BlockDevice, lba: u64, count: u64, dest: &wl_mem) -> Result<(RawDest, u64), Error> {
    let (_, len) = dev.byte_range(lba, count)?;
    if dest.len < len {
        return Err(invalid(format!(
            "dest holds {} bytes; {count} blocks of {} need {len}",
            dest.len,
            dev.block_size()
        )));
    }
    Ok((dest_of(dest)?, len))
}

/// `wl_block_read` in the background, optionally ordered on a CUDA stream (as `wl_read_async`).
///
/// # Safety
/// As for `wl_read_async`; `dev` must stay open until the operation is waited for.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_block_read_async(
    dev: *const wl_block,
    lba: u64,
    count: u64,
    dest: wl_mem,
    stream: *mut c_void,
    out: *mut *mut wl_op,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let d = unsafe { arg(dev, "dev") }?;
        let (_, len) = checked_block_dest(&d.dev, lba, count, &dest)?;
        let blockdev = d.dev.clone();
        let read = move |to: RawDest| {
            let to = SendDest(to);
            // SAFETY: per the contract, the destination (or the operation's staging) stays valid until the
            // operation is waited for, and holds `count` blocks.
            unsafe { blockdev.read(lba, count, to.get()) }.map(|(n, _)| n)
        };
        let engine = d.dev.engine().clone();
        // SAFETY: per the contract.
        unsafe { start_op(&dest, len, stream, move |n| engine.gpu(n), read, out) }
    })
}

/// Closes a block device.
///
/// # Safety
/// `dev` must be NULL or from `wl_block_open`, closed once, with no operation on it pending.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_block_close(dev: *mut wl_block) {
    // SAFETY: per the contract, it came from `Box::into_raw` and is closed once.
    unsafe { close(dev) };
}

/// A region table over `dev` (which may be closed afterwards: the table keeps what it needs).
///
/// # Safety
/// `dev` live; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_regions_new(dev: *const wl_block, out: *mut *mut wl_regions) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let d = unsafe { arg(dev, "dev") }?;
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let table = RegionTable::new(d.dev.clone());
        // SAFETY: per the contract.
        unsafe { out.write(Box::into_raw(Box::new(wl_regions { table }))) };
        Ok(())
    })
}

/// Names `count` blocks from `start_lba` as `kind` (replacing an earlier range of that name).
///
/// # Safety
/// `regions` live and not used by another thread during the call; `kind` NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_regions_set(
    regions: *mut wl_regions,
    kind: *const c_char,
    start_lba: u64,
    count: u64,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let (r, kind) = unsafe { (arg_mut(regions, "regions")?, string(kind, "kind")?) };
        r.table.insert(&kind, start_lba, count)
    })
}

/// The range of `kind` (either out-pointer may be NULL, not both).
///
/// # Safety
/// `regions` live; `kind` NUL-terminated; out-pointers NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_regions_get(
    regions: *const wl_regions,
    kind: *const c_char,
    start_lba: *mut u64,
    count: *mut u64,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let (r, kind) = unsafe { (arg(regions, "regions")?, string(kind, "kind")?) };
        if start_lba.is_null() && count.is_null() {
            return Err(invalid("start_lba and count are both NULL"));
        }
        let range = r.table.range(&kind)?;
        // SAFETY: per the contract.
        unsafe {
            put(start_lba, range.start);
            put(count, range.count);
        }
        Ok(())
    })
}

/// Reads `count` blocks from block `index` of region `kind` into `dest`.
///
/// # Safety
/// `regions` live; `kind` NUL-terminated; `dest` as for `wl_block_read`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_regions_read(
    regions: *const wl_regions,
    kind: *const c_char,
    index: u64,
    count: u64,
    dest: wl_mem,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let (r, kind) = unsafe { (arg(regions, "regions")?, string(kind, "kind")?) };
        let lba = r.table.resolve(&kind, index, count)?;
        let (raw, _) = checked_block_dest(r.table.device(), lba, count, &dest)?;
        // SAFETY: per the contract; the length was checked.
        unsafe { r.table.device().read(lba, count, raw) }?;
        Ok(())
    })
}

/// Frees a region table.
///
/// # Safety
/// `regions` must be NULL or from `wl_regions_new`, freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_regions_free(regions: *mut wl_regions) {
    // SAFETY: per the contract, it came from `Box::into_raw` and is closed once.
    unsafe { close(regions) };
}

// ---------------------------------------------------------------------------------------------------------------
// Layer streamer

/// A layer streamer over `ckpt`: tensor `i` belongs to layer `layer_of[i]` (or to none if `UINT32_MAX`), for
/// `layers` layers; `slots` slots (2 for double buffering) allocated on `device` (`WL_HOST` or a CUDA ordinal),
/// each as large as the largest layer. Tensors keep checkpoint order inside a layer.
///
/// # Safety
/// `engine` and `ckpt` live (the streamer keeps what it needs of both); `layer_of` holds `wl_checkpoint_len`
/// entries; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_layers_open(
    engine: *const wl_engine,
    ckpt: *const wl_checkpoint,
    layer_of: *const u32,
    layers: u32,
    device: i32,
    slots: u32,
    out: *mut *mut wl_layers,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let (e, c) = unsafe { (arg(engine, "engine")?, arg(ckpt, "ckpt")?) };
        let n = c.index.tensors.len();
        if (layer_of.is_null() && n > 0) || out.is_null() {
            return Err(invalid("layer_of or out is NULL"));
        }
        // SAFETY: per the contract, `layer_of` holds one entry per tensor.
        let layer_of = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(layer_of, n) } };
        let mut groups = vec![Vec::new(); layers as usize];
        for (i, &l) in layer_of.iter().enumerate() {
            if l == u32::MAX {
                continue;
            }
            groups
                .get_mut(l as usize)
                .ok_or_else(|| invalid(format!("layer_of[{i}] = {l}, but there are {layers} layers")))?
                .push(i);
        }
        let streamer = LayerStreamer::new(e.engine.clone(), &c.index, groups, device_of(device)?, slots as usize)?;
        // SAFETY: per the contract.
        unsafe { out.write(Box::into_raw(Box::new(wl_layers { streamer }))) };
        Ok(())
    })
}

/// Hands back layer `layer` once its bytes are in a slot, and starts reading the layers after it into the other
/// slots. The layer handed back before is released: with `stream` (a `CUstream` of the streamer's device), its slot
/// is refilled only after the work queued on `stream` so far has finished; with NULL, the caller must have
/// finished with it.
///
/// # Safety
/// `layers` live and used by one thread at a time; `stream` NULL or a live stream of the streamer's device;
/// `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_layers_load(
    layers: *mut wl_layers,
    layer: u32,
    stream: *mut c_void,
    out: *mut wl_layer,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let l = unsafe { arg_mut(layers, "layers") }?;
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let view = if stream.is_null() {
            l.streamer.load_layer(layer as usize)?
        } else {
            // SAFETY: per the contract.
            unsafe { l.streamer.load_layer_after(layer as usize, stream as CUstream) }?
        };
        let v = wl_layer {
            layer: view.layer as u32,
            slot: view.slot as u32,
            base: view.base,
            bytes: view.layout.bytes,
            count: view.layout.tensors.len(),
            tensors: view.layout.tensors.as_ptr(),
            offsets: view.layout.offsets.as_ptr(),
        };
        // SAFETY: per the contract.
        unsafe { out.write(v) };
        Ok(())
    })
}

/// What the streamer did so far.
///
/// # Safety
/// `layers` live; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_layers_stats_get(layers: *const wl_layers, out: *mut wl_layers_stats) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let l = unsafe { arg(layers, "layers") }?;
        let s = l.streamer.stats();
        let v = wl_layers_stats {
            loads: s.loads,
            bytes: s.bytes,
            load_seconds: s.load_secs,
            wait_seconds: s.wait_secs,
            requests: s.requests,
            ready_hits: s.ready_hits,
        };
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        // SAFETY: per the contract.
        unsafe { out.write(v) };
        Ok(())
    })
}

/// Stops the streamer (waiting for a read in progress) and frees its slots.
///
/// # Safety
/// `layers` must be NULL or from `wl_layers_open`, closed once; work on its slots must be finished.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_layers_close(layers: *mut wl_layers) {
    // SAFETY: per the contract, it came from `Box::into_raw` and is closed once.
    unsafe { close(layers) };
}

// ---------------------------------------------------------------------------------------------------------------
// Device memory, for programs built without the CUDA toolkit (the examples use these)

fn allocations() -> &'static Mutex<HashMap<u64, DeviceBuffer>> {
    static A: std::sync::OnceLock<Mutex<HashMap<u64, DeviceBuffer>>> = std::sync::OnceLock::new();
    A.get_or_init(Default::default)
}

/// The number of CUDA devices (0 where CUDA is unavailable; `wl_last_error` then says why).
#[unsafe(no_mangle)]
pub extern "C" fn wl_cuda_device_count() -> i32 {
    let mut n = 0;
    let s = guard(|| {
        match weightlift::cuda::available() {
            Ok(info) => n = info.devices as i32,
            Err(why) => set_error(why),
        }
        Ok(())
    });
    if s == wl_status::WL_OK { n } else { 0 }
}

/// Allocates `len` bytes of device memory on `device` (stream-ordered pool, ready when this returns).
///
/// # Safety
/// `engine` live; `ptr` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_cuda_alloc(engine: *const wl_engine, device: i32, len: u64, ptr: *mut u64) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let e = unsafe { arg(engine, "engine") }?;
        let Device::Cuda(n) = device_of(device)? else { return Err(invalid("wl_cuda_alloc needs a CUDA device")) };
        if ptr.is_null() {
            return Err(invalid("ptr is NULL"));
        }
        let gpu = e.engine.gpu(n)?;
        gpu.bind()?;
        let stream = gpu.stream(0)?;
        let b = DeviceBuffer::alloc(&gpu, len.max(1) as usize, &stream)?;
        gpu.synchronize()?;
        let p = b.device_ptr();
        allocations().lock().unwrap_or_else(|p| p.into_inner()).insert(p, b);
        // SAFETY: per the contract.
        unsafe { ptr.write(p) };
        Ok(())
    })
}

/// Frees memory from `wl_cuda_alloc` (0 is ignored).
#[unsafe(no_mangle)]
pub extern "C" fn wl_cuda_free(ptr: u64) -> wl_status {
    guard(|| {
        if ptr == 0 {
            return Ok(());
        }
        let b = allocations().lock().unwrap_or_else(|p| p.into_inner()).remove(&ptr);
        b.map(drop).ok_or_else(|| invalid(format!("{ptr:#x} was not allocated by wl_cuda_alloc")))
    })
}

/// Copies `len` bytes from device memory `src` of `device` into host memory `dst` (synchronously).
///
/// # Safety
/// `engine` live; `src` readable device memory of `device` for `len` bytes; `dst` writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wl_cuda_copy_to_host(
    engine: *const wl_engine,
    device: i32,
    src: u64,
    dst: *mut c_void,
    len: u64,
) -> wl_status {
    guard(|| {
        // SAFETY: per the contract.
        let e = unsafe { arg(engine, "engine") }?;
        let Device::Cuda(n) = device_of(device)? else { return Err(invalid("the source must be a CUDA device")) };
        if dst.is_null() && len > 0 {
            return Err(invalid("dst is NULL"));
        }
        let gpu = e.engine.gpu(n)?;
        // SAFETY: per the contract, `dst` is writable for `len` bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len as usize) };
        // SAFETY: per the contract, `src` is readable device memory of this device.
        unsafe { weightlift::cuda::copy_device_to_host(&gpu, src, out) }?;
        Ok(())
    })
}
