//! `weightlift._native`: the compiled core of the Python package. It loads byte ranges into host or device memory
//! and hands them to PyTorch through DLPack; the plain-Python package on top turns them into typed, shaped tensors
//! and offers the familiar APIs (safetensors, dstorage-gpu, torch.cuda.gds, GGUF). The GIL is released during I/O.

mod alloc;
mod blocks;
mod bridge;
mod checkpoint;
mod device;
mod dlpack;
mod engine;
mod errors;
mod inject;
mod keeper;
mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use weightlift::Settings;
use weightlift::format::DType;

use crate::bridge::SendPtr;
use crate::checkpoint::Checkpoint;
use crate::device::parse_device;
use crate::dlpack::NativeBuffer;
use crate::engine::NativeEngine;
use crate::errors::to_py;
use crate::report::{LAST_REPORT, json_to_py};

/// A cuFile-style session (see `weightlift.cufile`).
#[pyclass(module = "weightlift._native", frozen)]
struct NativeSession {
    session: std::sync::Arc<weightlift::cufile_api::Session>,
}

fn fd_path(fd: i32) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

fn op_of(s: &str) -> PyResult<weightlift::cufile_api::Op> {
    match s {
        "read" => Ok(weightlift::cufile_api::Op::Read),
        "write" => Ok(weightlift::cufile_api::Op::Write),
        _ => Err(errors::invalid_argument(&format!("operation {s:?}: expected \"read\" or \"write\""))),
    }
}

#[pymethods]
impl NativeSession {
    #[new]
    #[pyo3(signature = (use_cufile=false))]
    fn new(use_cufile: bool) -> PyResult<NativeSession> {
        let _cuda = crate::bridge::keep_callers_context();
        let settings = Settings::from_env().map_err(to_py)?;
        let session = weightlift::cufile_api::Session::open(settings, use_cufile).map_err(to_py)?;
        Ok(NativeSession { session: std::sync::Arc::new(session) })
    }

    fn backend(&self) -> String {
        let _cuda = crate::bridge::keep_callers_context();
        self.session.backend()
    }

    fn close(&self) {
        let _cuda = crate::bridge::keep_callers_context();
        self.session.close();
    }

    fn handle_register(&self, path: PathBuf, mode: &str) -> PyResult<u64> {
        let _cuda = crate::bridge::keep_callers_context();
        let mode = weightlift::cufile_api::FileMode::parse(mode).map_err(to_py)?;
        self.session.handle_register(&path, mode).map_err(to_py)
    }

    /// Registers open descriptor `fd` through `/proc/self/fd/<fd>`, so the handle reaches the file the descriptor
    /// names (even renamed or unlinked), with the descriptor's access (`read`, `write`): nothing is created or
    /// truncated.
    fn handle_register_fd(&self, fd: i32, read: bool, write: bool) -> PyResult<u64> {
        let _cuda = crate::bridge::keep_callers_context();
        let mode = weightlift::cufile_api::FileMode { read, write, ..Default::default() };
        self.session.handle_register(&fd_path(fd), mode).map_err(to_py)
    }

    /// The handle registered for descriptor `fd`, if any.
    fn handle_of_fd(&self, fd: i32) -> Option<u64> {
        let _cuda = crate::bridge::keep_callers_context();
        self.session.handle_of(&fd_path(fd))
    }

    /// `(path, readable, writable)` of a registered handle.
    fn handle_info(&self, fh: u64) -> PyResult<(PathBuf, bool, bool)> {
        let _cuda = crate::bridge::keep_callers_context();
        let mode = self.session.mode(fh).map_err(to_py)?;
        Ok((self.session.path(fh).map_err(to_py)?, mode.read, mode.write))
    }

    /// `(bytes, device)` of the buffer registered at `base`, None if there is none.
    fn buffer(&self, base: u64) -> Option<(u64, String)> {
        let _cuda = crate::bridge::keep_callers_context();
        self.session.buffer(base).map(|(len, device)| (len, device.to_string()))
    }

    /// The base of a registered buffer overlapping `len` bytes at `base`, None if there is none.
    fn buffer_overlapping(&self, base: u64, len: u64) -> Option<u64> {
        let _cuda = crate::bridge::keep_callers_context();
        self.session.buffer_overlapping(base, len)
    }

    fn handle_deregister(&self, fh: u64) -> PyResult<()> {
        let _cuda = crate::bridge::keep_callers_context();
        self.session.handle_deregister(fh).map_err(to_py)
    }

    fn buf_register(&self, base: u64, len: u64, device: &str) -> PyResult<()> {
        let _cuda = crate::bridge::keep_callers_context();
        let device = parse_device(device)?;
        // SAFETY: the Python layer registers the data of a tensor it keeps referenced until deregistration.
        unsafe { self.session.buf_register(base, len, device) }.map_err(to_py)
    }

    fn buf_deregister(&self, base: u64) -> PyResult<()> {
        let _cuda = crate::bridge::keep_callers_context();
        self.session.buf_deregister(base).map_err(to_py)
    }

    #[allow(clippy::too_many_arguments)] // cuFile's argument list
    fn io(
        &self,
        py: Python<'_>,
        op: &str,
        fh: u64,
        base: u64,
        size: u64,
        file_offset: u64,
        buf_offset: u64,
    ) -> PyResult<u64> {
        let _cuda = crate::bridge::keep_callers_context();
        let op = op_of(op)?;
        py.detach(|| match op {
            weightlift::cufile_api::Op::Read => self.session.read(fh, base, size, file_offset, buf_offset),
            weightlift::cufile_api::Op::Write => self.session.write(fh, base, size, file_offset, buf_offset),
        })
        .map_err(to_py)
    }

    #[allow(clippy::too_many_arguments)] // pread's arguments plus where the memory lives
    fn pio(
        &self,
        py: Python<'_>,
        op: &str,
        fh: u64,
        addr: u64,
        size: u64,
        file_offset: u64,
        device: &str,
    ) -> PyResult<u64> {
        let _cuda = crate::bridge::keep_callers_context();
        let (op, device) = (op_of(op)?, parse_device(device)?);
        py.detach(|| {
            // SAFETY: the Python layer passes the data of a live, contiguous tensor it holds for the call.
            unsafe {
                match op {
                    weightlift::cufile_api::Op::Read => self.session.pread(fh, addr, size, file_offset, device),
                    weightlift::cufile_api::Op::Write => self.session.pwrite(fh, addr, size, file_offset, device),
                }
            }
        })
        .map_err(to_py)
    }

    /// Runs every entry `(op, fh, base, size, file_offset, buf_offset)`; each gets its byte count or its exception.
    fn batch(&self, py: Python<'_>, entries: Vec<(String, u64, u64, u64, u64, u64)>) -> PyResult<Vec<Py<PyAny>>> {
        let _cuda = crate::bridge::keep_callers_context();
        let mut parsed = Vec::with_capacity(entries.len());
        for (op, fh, base, size, file_offset, buf_offset) in entries {
            parsed.push(weightlift::cufile_api::BatchEntry {
                op: op_of(&op)?,
                fh,
                base,
                size,
                file_offset,
                buf_offset,
            });
        }
        let results = py.detach(|| self.session.batch(&parsed));
        results
            .into_iter()
            .map(|r| match r {
                Ok(n) => Ok(n.into_pyobject(py)?.into_any().unbind()),
                Err(e) => Ok(to_py(e).into_value(py).into_any()),
            })
            .collect()
    }

    fn vectored(&self, py: Python<'_>, op: &str, fh: u64, file_offset: u64, bufs: Vec<(u64, u64)>) -> PyResult<u64> {
        let _cuda = crate::bridge::keep_callers_context();
        let op = op_of(op)?;
        py.detach(|| match op {
            weightlift::cufile_api::Op::Read => self.session.readv(fh, file_offset, &bufs),
            weightlift::cufile_api::Op::Write => self.session.writev(fh, file_offset, &bufs),
        })
        .map_err(to_py)
    }

    #[allow(clippy::too_many_arguments)] // cuFile's argument list, plus the stream
    #[pyo3(signature = (op, fh, base, size, file_offset, buf_offset, stream=None))]
    fn submit_async(
        &self,
        op: &str,
        fh: u64,
        base: u64,
        size: u64,
        file_offset: u64,
        buf_offset: u64,
        stream: Option<usize>,
    ) -> PyResult<NativeAsync> {
        let _cuda = crate::bridge::keep_callers_context();
        let op = op_of(op)?;
        let stream = stream.map(|s| s as weightlift::cuda::CUstream);
        // SAFETY: the Python layer passes a stream handle of the tensor's device that PyTorch keeps alive.
        let io =
            unsafe { self.session.submit_async(op, fh, base, size, file_offset, buf_offset, stream) }.map_err(to_py)?;
        Ok(NativeAsync { io: Mutex::new(io) })
    }
}

/// An asynchronous cuFile-style operation.
#[pyclass(module = "weightlift._native", frozen)]
struct NativeAsync {
    io: Mutex<weightlift::cufile_api::AsyncIo>,
}

#[pymethods]
impl NativeAsync {
    fn done(&self) -> bool {
        let _cuda = crate::bridge::keep_callers_context();
        self.io.lock().unwrap_or_else(|p| p.into_inner()).is_done()
    }

    fn wait(&self, py: Python<'_>) -> PyResult<u64> {
        let _cuda = crate::bridge::keep_callers_context();
        py.detach(|| self.io.lock().unwrap_or_else(|p| p.into_inner()).wait()).map_err(to_py)
    }
}

/// Parses checkpoint headers: `{"format", "files": [...], "tensors": [TensorInfo, ...]}` (a `Checkpoint` keeps the
/// index in Rust and loads by name; this is its description as plain data).
#[pyfunction]
#[pyo3(signature = (paths, raw_dtype=None, raw_count=None))]
fn inspect(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    raw_dtype: Option<String>,
    raw_count: Option<u64>,
) -> PyResult<Py<PyAny>> {
    let _cuda = crate::bridge::keep_callers_context();
    let ckpt = Checkpoint::new(py, paths, raw_dtype, raw_count)?;
    let out = PyDict::new(py);
    out.set_item("format", ckpt.format())?;
    out.set_item("files", ckpt.files(py)?)?;
    out.set_item("tensors", ckpt.tensors())?;
    Ok(out.into_any().unbind())
}

/// The canonical form of a device string (`cpu`, `cpu:pinned`, `cuda:N`; `cuda` and `gpu` mean device 0).
#[pyfunction]
fn parse_device_string(s: &str) -> PyResult<String> {
    let _cuda = crate::bridge::keep_callers_context();
    Ok(parse_device(s)?.to_string())
}

/// A row of the settings table.
#[pyclass(module = "weightlift._native", frozen, get_all)]
struct SettingInfo {
    name: &'static str,
    env: &'static str,
    default: &'static str,
    meaning: &'static str,
    values: Vec<&'static str>,
}

#[pymethods]
impl SettingInfo {
    fn __repr__(&self) -> String {
        let _cuda = crate::bridge::keep_callers_context();
        format!("SettingInfo(name={:?}, env={:?}, default={:?})", self.name, self.env, self.default)
    }
}

/// Writes a safetensors file durably: a temporary file in the same directory, fsync, rename over `path`, fsync of
/// the directory. `tensors` are `(name, dtype, shape, address, nbytes)` of contiguous host memory that the caller
/// keeps alive for the call (addresses rather than buffer objects: the buffer protocol is not in the stable ABI
/// of Python 3.10).
#[pyfunction]
#[pyo3(signature = (path, tensors, metadata=None, align=8))]
fn save_safetensors(
    py: Python<'_>,
    path: PathBuf,
    tensors: Vec<(String, String, Vec<u64>, usize, usize)>,
    metadata: Option<BTreeMap<String, String>>,
    align: u64,
) -> PyResult<()> {
    let _cuda = crate::bridge::keep_callers_context();
    use weightlift::format::safetensors::{self, TensorSpec};
    let mut specs = Vec::with_capacity(tensors.len());
    let mut views = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, ptr, nbytes) in tensors {
        let dtype = DType::from_safetensors_name(&dtype)
            .ok_or_else(|| errors::invalid_argument(&format!("tensor {name:?}: unknown dtype {dtype:?}")))?;
        if ptr == 0 && nbytes > 0 {
            return Err(errors::invalid_argument(&format!("tensor {name:?}: null data address")));
        }
        specs.push(TensorSpec::new(name, dtype, shape));
        views.push(SendPtr((ptr as *const u8, nbytes)));
    }
    let layout = safetensors::layout(&specs, &metadata.unwrap_or_default(), align)
        .map_err(|k| to_py(weightlift::format::FormatError::new(&path, k).into()))?;
    for ((spec, view), laid) in specs.iter().zip(&views).zip(&layout.tensors) {
        if view.0.1 as u64 != laid.nbytes {
            return Err(errors::invalid_argument(&format!(
                "tensor {:?}: {} × {:?} needs {} bytes but {} were given",
                spec.name, spec.dtype, spec.shape, laid.nbytes, view.0.1
            )));
        }
    }
    py.detach(|| {
        let views = &views;
        weightlift::io::durable::write_atomically(&path, |out| {
            layout.write_to(out, 8 << 20, |i, off, dst| {
                let (ptr, len) = views[i].0;
                // SAFETY: the caller keeps each tensor's host memory alive and unchanged for the whole call; each
                // view covers exactly its tensor's bytes and `off + dst.len() <= len` by the layout.
                let src = unsafe { std::slice::from_raw_parts(ptr, len) };
                dst.copy_from_slice(&src[off as usize..off as usize + dst.len()]);
                Ok(())
            })
        })
    })
    .map_err(|e| to_py(e.into()))?;
    Ok(())
}

/// What this machine offers weightlift: CUDA devices, io_uring, O_DIRECT on `path`'s filesystem, cuFile.
#[pyfunction]
#[pyo3(signature = (path=None))]
fn probe(py: Python<'_>, path: Option<PathBuf>) -> PyResult<Py<PyAny>> {
    let _cuda = crate::bridge::keep_callers_context();
    let v = py.detach(|| weightlift::probe::probe(path.as_deref()));
    json_to_py(py, &v)
}

/// Whether `path` names an object (a URL of a scheme weightlift reads objects from) rather than a local file: the
/// engine's rule, which the Python modules ask instead of writing it again.
#[pyfunction]
fn is_url(path: &str) -> bool {
    let _cuda = crate::bridge::keep_callers_context();
    weightlift::remote::is_url(path)
}

/// The bytes of the small object at `url` (at most `limit` of them), in one GET where it fits the opening GET:
/// `weightlift.transformers` fetches a model's config and shard index from a bucket with it.
#[pyfunction]
fn fetch_object(py: Python<'_>, url: &str, limit: u64) -> PyResult<Py<pyo3::types::PyBytes>> {
    let _cuda = crate::bridge::keep_callers_context();
    let remote = |e| to_py(weightlift::Error::Io(weightlift::io::IoError::Remote(e)));
    let url = weightlift::remote::ObjectUrl::parse(url).map_err(remote)?;
    let bytes = py.detach(|| weightlift::remote::Head::fetch(&url, limit)).map_err(remote)?;
    Ok(pyo3::types::PyBytes::new(py, &bytes).unbind())
}

/// The report of the last load or read in this process (None before the first).
#[pyfunction]
fn last_report(py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
    let _cuda = crate::bridge::keep_callers_context();
    let r = LAST_REPORT.lock().unwrap_or_else(|p| p.into_inner()).clone();
    r.map(|v| json_to_py(py, &v)).transpose()
}

/// A file mode as weightlift's cuFile-style handles parse it: `(read, write, create, truncate, direct)`.
#[pyfunction]
fn parse_file_mode(mode: &str) -> PyResult<(bool, bool, bool, bool, bool)> {
    let _cuda = crate::bridge::keep_callers_context();
    let m = weightlift::cufile_api::FileMode::parse(mode).map_err(to_py)?;
    Ok((m.read, m.write, m.create, m.truncate, m.direct))
}

/// Every ggml tensor type: name → (id, elements per block, bytes per block).
#[pyfunction]
fn ggml_types() -> BTreeMap<&'static str, (u32, u64, u64)> {
    let _cuda = crate::bridge::keep_callers_context();
    weightlift::format::GgmlType::ALL.iter().map(|g| (g.name(), (g.id(), g.block_size(), g.type_size()))).collect()
}

/// The handle of a CUDA stream of device `ordinal` kept for the whole process (for `torch.cuda.ExternalStream`):
/// the side stream the blocks of loads through torch's allocator are made on. Made once; torch's own
/// `torch.cuda.Stream()` would first make torch's pool of streams, 3-5 ms of a fresh process's first load on the
/// H100 (bench/results/2026-11-25-h100-zc at b3a4ec8).
#[pyfunction]
fn process_stream(py: Python<'_>, ordinal: u32) -> PyResult<usize> {
    let _cuda = crate::bridge::keep_callers_context();
    py.detach(|| weightlift::cuda::process_stream(ordinal).map(|s| s as usize))
        .map_err(|e| crate::errors::to_py(weightlift::Error::Cuda(e)))
}

/// Which data path serves the drop-in cuFile fronts (`weightlift.cufile`, `weightlift.cuda_gds`).
#[pyclass(module = "weightlift._native", frozen, eq, eq_int, from_py_object)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CufilePath {
    /// weightlift's engine: io_uring reads and writes with pinned staging.
    Engine,
    /// NVIDIA's cuFile, peer-to-peer between storage and GPU memory.
    Cufile,
}

#[pymethods]
impl CufilePath {
    /// The name reports use: `engine` or `cufile`.
    fn __str__(&self) -> &'static str {
        let _cuda = crate::bridge::keep_callers_context();
        match self {
            CufilePath::Engine => "engine",
            CufilePath::Cufile => "cufile",
        }
    }
}

/// The cuFile fronts' route and why it was chosen, decided once per process.
#[pyclass(module = "weightlift._native", frozen, get_all)]
#[derive(Clone)]
struct CufileRoute {
    path: CufilePath,
    why: String,
}

#[pymethods]
impl CufileRoute {
    fn __repr__(&self) -> String {
        let _cuda = crate::bridge::keep_callers_context();
        format!("CufileRoute(path={}, why={:?})", self.path.__str__(), self.why)
    }
}

/// cuFile serves the drop-in fronts only where it runs peer-to-peer: in compat mode it bounces through host memory
/// as the engine does, slower than the engine's pipeline.
fn decide_cufile_route() -> CufileRoute {
    use weightlift::cuda::cufile::{CufileMode, driver, locate};
    let engine = |why: String| CufileRoute { path: CufilePath::Engine, why };
    let lib = Settings::from_env().ok().and_then(|s| s.cufile_lib.value);
    if locate(lib.as_deref()).0.found.is_none() {
        return engine("cuFile not found".into());
    }
    if let Err(why) = weightlift::cuda::available() {
        return engine(format!("CUDA unavailable: {why}"));
    }
    match driver(lib.as_deref()) {
        Ok(c) => match c.mode {
            CufileMode::PeerToPeer(d) => {
                CufileRoute { path: CufilePath::Cufile, why: format!("cuFile runs peer-to-peer: {d}") }
            }
            CufileMode::Compat(d) => engine(format!("cuFile not peer-to-peer here (compat: {d})")),
        },
        Err(e) => engine(format!("cuFile driver not opened: {e}")),
    }
}

#[pyfunction]
fn cufile_route() -> CufileRoute {
    let _cuda = crate::bridge::keep_callers_context();
    static ROUTE: std::sync::OnceLock<CufileRoute> = std::sync::OnceLock::new();
    ROUTE.get_or_init(decide_cufile_route).clone()
}

/// Runs the `weightlift` command line `argv` (the program's name first) in this process, as the `weightlift`
/// binary runs it, and returns its exit status. Its log records reach `logging` (logger `weightlift`).
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>) -> PyResult<u8> {
    let _cuda = crate::bridge::keep_callers_context();
    bridge::with_logs(py, move || weightlift_cli::run(argv))
}

/// Whether CUDA is usable, and why not.
#[pyfunction]
fn cuda_status() -> (bool, String) {
    let _cuda = crate::bridge::keep_callers_context();
    match weightlift::cuda::available() {
        Ok(d) => (
            true,
            format!("{} device(s), driver supports CUDA {}.{}", d.devices, d.version / 1000, d.version % 1000 / 10),
        ),
        Err(e) => (false, e),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeEngine>()?;
    m.add_class::<keeper::NativeKeeper>()?;
    m.add_function(wrap_pyfunction!(keeper::keeper_status, m)?)?;
    m.add_function(wrap_pyfunction!(keeper::keeper_socket, m)?)?;
    m.add_class::<NativeBuffer>()?;
    m.add_class::<NativeSession>()?;
    m.add_class::<NativeAsync>()?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(save_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(probe, m)?)?;
    m.add_function(wrap_pyfunction!(last_report, m)?)?;
    m.add_function(wrap_pyfunction!(is_url, m)?)?;
    m.add_function(wrap_pyfunction!(fetch_object, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_status, m)?)?;
    m.add_function(wrap_pyfunction!(cufile_route, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_class::<CufilePath>()?;
    m.add_class::<CufileRoute>()?;
    m.add_function(wrap_pyfunction!(process_stream, m)?)?;
    m.add_function(wrap_pyfunction!(ggml_types, m)?)?;
    m.add_function(wrap_pyfunction!(parse_device_string, m)?)?;
    m.add_function(wrap_pyfunction!(parse_file_mode, m)?)?;
    m.add_class::<checkpoint::Checkpoint>()?;
    m.add_class::<checkpoint::TensorInfo>()?;
    m.add_class::<checkpoint::NativeStream>()?;
    m.add_class::<SettingInfo>()?;
    m.add_class::<blocks::NativeBlockDevice>()?;
    m.add_class::<blocks::NativeRegions>()?;
    m.add_class::<blocks::NativeLayerStreamer>()?;
    let settings = PyList::empty(m.py());
    for s in weightlift::settings::SETTINGS {
        let row =
            SettingInfo { name: s.name, env: s.env, default: s.default, meaning: s.meaning, values: s.values.to_vec() };
        settings.append(Py::new(m.py(), row)?)?;
    }
    m.add("SETTINGS", settings)?;
    bridge::install();
    // Importing the package is usually well before the first load, often in a process with one thread: the
    // descriptor table grown now keeps the kernel's wait for it out of that load (see `weightlift::io::fdtable`).
    weightlift::io::fdtable::grow_early();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
