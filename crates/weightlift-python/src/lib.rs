//! `weightlift._native`: the compiled core of the Python package. It loads byte ranges into host or device memory
//! and hands them to PyTorch through DLPack; the plain-Python package on top turns them into typed, shaped tensors
//! and offers the familiar APIs (safetensors, dstorage-gpu, torch.cuda.gds, GGUF). The GIL is released during I/O.

mod dlpack;
mod errors;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;
use weightlift::format::{DType, Metadata, RawSpec};
use weightlift::io::{Backend, DirectMode};
use weightlift::{Config, Device, Engine, LoadOpts, RawDest, RawSrc};

use crate::dlpack::Holder;
use crate::errors::to_py;

/// The last load's report, for `weightlift.last_report()`.
static LAST_REPORT: Mutex<Option<Value>> = Mutex::new(None);

fn remember(report: Value) {
    *LAST_REPORT.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
}

fn parse_device(s: &str) -> PyResult<Device> {
    s.parse::<Device>().map_err(|e| errors::invalid_argument(&e))
}

/// A byte buffer loaded into host or device memory, exported through DLPack.
#[pyclass(module = "weightlift._native", frozen)]
struct NativeBuffer {
    holder: Holder,
}

#[pymethods]
impl NativeBuffer {
    #[getter]
    fn nbytes(&self) -> usize {
        self.holder.len()
    }

    /// The DLPack protocol: a capsule sharing this buffer's memory as a 1-D uint8 tensor. The bytes are complete
    /// when the load returns, so they are ready on any consumer stream; `stream` only orders the eventual free.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<isize>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = max_version;
        if copy == Some(true) {
            return Err(pyo3::exceptions::PyBufferError::new_err("weightlift buffers are exported without copying"));
        }
        if let Some(d) = dl_device {
            if d != self.holder.dl_device() {
                return Err(pyo3::exceptions::PyBufferError::new_err("cannot export to another device without a copy"));
            }
        }
        dlpack::capsule(py, &self.holder, stream.unwrap_or(0).max(0) as usize)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        self.holder.dl_device()
    }
}

/// The engine with its settings and cached staging memory; safe to share between threads (loads take turns).
#[pyclass(module = "weightlift._native", frozen)]
struct NativeEngine {
    engine: Mutex<Engine>,
    settings: Value,
}

fn lock(m: &Mutex<Engine>) -> std::sync::MutexGuard<'_, Engine> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[pymethods]
impl NativeEngine {
    /// Settings not given (None) come from `WEIGHTLIFT_*` variables, else their defaults.
    #[new]
    #[pyo3(signature = (*, chunk_bytes=None, queue_depth=None, staging_bytes=None, threads=None, direct=None, io=None))]
    fn new(
        chunk_bytes: Option<u64>,
        queue_depth: Option<u32>,
        staging_bytes: Option<u64>,
        threads: Option<u32>,
        direct: Option<String>,
        io: Option<String>,
    ) -> PyResult<NativeEngine> {
        let mut config = Config::from_env().map_err(to_py)?;
        let mut c = config.io;
        if let Some(v) = chunk_bytes {
            c = c.chunk_bytes(v);
        }
        if let Some(v) = queue_depth {
            c = c.queue_depth(v);
        }
        if let Some(v) = staging_bytes {
            c = c.staging_bytes(v);
        }
        if let Some(v) = threads {
            c = c.threads(v);
        }
        if let Some(v) = direct {
            c = c.direct(v.parse::<DirectMode>().map_err(|e| errors::invalid_argument(&format!("direct={v:?}: {e}")))?);
        }
        if let Some(v) = io {
            c = c.backend(v.parse::<Backend>().map_err(|e| errors::invalid_argument(&format!("io={v:?}: {e}")))?);
        }
        c.validate().map_err(|e| to_py(e.into()))?;
        let settings = Value::Object(
            c.describe()
                .into_iter()
                .map(|(k, v, s)| (k.to_string(), serde_json::json!({"value": v, "source": s.to_string()})))
                .collect(),
        );
        config.io = c;
        let engine = Engine::new(config).map_err(to_py)?;
        Ok(NativeEngine { engine: Mutex::new(engine), settings })
    }

    /// The settings in use and where each came from.
    fn settings(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        json_to_py(py, &self.settings)
    }

    /// Loads byte ranges `(file index, offset, length)` of `paths` onto `device`, through one plan.
    fn load_ranges(
        &self,
        py: Python<'_>,
        paths: Vec<PathBuf>,
        ranges: Vec<(usize, u64, u64)>,
        device: &str,
    ) -> PyResult<Vec<NativeBuffer>> {
        let device = parse_device(device)?;
        let loaded = py
            .detach(|| lock(&self.engine).load_ranges(&paths, &ranges, device, &LoadOpts::default()))
            .map_err(to_py)?;
        remember(loaded.report.to_json());
        Ok(loaded.tensors.into_iter().map(|t| NativeBuffer { holder: Holder::from_data(t.data) }).collect())
    }

    /// Reads up to `nbytes` of `path` at `offset` into memory at address `ptr` (host, or device `cuda:N`); returns
    /// the bytes read (fewer at the end of the file).
    fn read_into(
        &self,
        py: Python<'_>,
        path: PathBuf,
        offset: u64,
        nbytes: u64,
        ptr: usize,
        device: &str,
    ) -> PyResult<u64> {
        let dest = match parse_device(device)? {
            Device::Cpu | Device::PinnedCpu => RawDest::Host(ptr as *mut u8),
            Device::Cuda(ordinal) => RawDest::Device { ordinal, ptr: ptr as u64 },
        };
        let dest = SendPtr(dest);
        let (n, report) = py
            .detach(|| {
                let dest = dest;
                // SAFETY: the Python layer passes the data pointer and byte size of a live, contiguous tensor or
                // storage that it keeps alive (and does not hand to other work) for the duration of this call.
                unsafe { lock(&self.engine).read_into(&path, offset, nbytes, dest.0) }
            })
            .map_err(to_py)?;
        remember(report.to_json());
        Ok(n)
    }

    /// Writes `nbytes` from address `ptr` (host, or device `cuda:N`) into `path` at `offset`; fsyncs when `durable`.
    #[allow(clippy::too_many_arguments)] // the Python signature: a pwrite plus where the memory lives
    fn write_from(
        &self,
        py: Python<'_>,
        path: PathBuf,
        offset: u64,
        nbytes: u64,
        ptr: usize,
        device: &str,
        durable: bool,
    ) -> PyResult<u64> {
        let src = match parse_device(device)? {
            Device::Cpu | Device::PinnedCpu => RawSrc::Host(ptr as *const u8),
            Device::Cuda(ordinal) => RawSrc::Device { ordinal, ptr: ptr as u64 },
        };
        let src = SendPtr(src);
        py.detach(|| {
            let src = src;
            // SAFETY: as for `read_into`: a live, contiguous tensor or storage kept alive by the caller.
            unsafe { lock(&self.engine).write_from(&path, offset, nbytes, src.0, durable) }
        })
        .map_err(to_py)
    }
}

/// A cuFile-style session (see `weightlift.cufile`).
#[pyclass(module = "weightlift._native", frozen)]
struct NativeSession {
    session: std::sync::Arc<weightlift::cufile_api::Session>,
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
        let config = Config::from_env().map_err(to_py)?;
        let session = weightlift::cufile_api::Session::open(config, use_cufile).map_err(to_py)?;
        Ok(NativeSession { session: std::sync::Arc::new(session) })
    }

    fn backend(&self) -> String {
        self.session.backend()
    }

    fn close(&self) {
        self.session.close();
    }

    fn handle_register(&self, path: PathBuf, mode: &str) -> PyResult<u64> {
        let mode = weightlift::cufile_api::FileMode::parse(mode).map_err(to_py)?;
        self.session.handle_register(&path, mode).map_err(to_py)
    }

    fn handle_deregister(&self, fh: u64) -> PyResult<()> {
        self.session.handle_deregister(fh).map_err(to_py)
    }

    fn buf_register(&self, base: u64, len: u64, device: &str) -> PyResult<()> {
        let device = parse_device(device)?;
        // SAFETY: the Python layer registers the data of a tensor it keeps referenced until deregistration.
        unsafe { self.session.buf_register(base, len, device) }.map_err(to_py)
    }

    fn buf_deregister(&self, base: u64) -> PyResult<()> {
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
        let op = op_of(op)?;
        let stream = stream.map(|s| s as weightlift_cuda::CUstream);
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
        self.io.lock().unwrap_or_else(|p| p.into_inner()).is_done()
    }

    fn wait(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.io.lock().unwrap_or_else(|p| p.into_inner()).wait()).map_err(to_py)
    }
}

/// A raw address crossing into a GIL-free section; the Python caller keeps the memory alive meanwhile.
struct SendPtr<T>(T);
// SAFETY: the wrapped value is an address, used only by the call it is passed to while its owner stays alive.
unsafe impl<T> Send for SendPtr<T> {}

fn json_to_py(py: Python<'_>, v: &Value) -> PyResult<Py<PyAny>> {
    let json = py.import("json")?;
    Ok(json.call_method1("loads", (v.to_string(),))?.unbind())
}

/// Parses checkpoint headers: `{"format", "files": [...], "tensors": [(name, dtype, shape, file, offset, nbytes)]}`.
#[pyfunction]
#[pyo3(signature = (paths, raw_dtype=None, raw_count=None))]
fn inspect(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    raw_dtype: Option<String>,
    raw_count: Option<u64>,
) -> PyResult<Py<PyAny>> {
    let raw = match raw_dtype {
        Some(d) => Some(RawSpec {
            dtype: DType::parse(&d).ok_or_else(|| errors::invalid_argument(&format!("unknown dtype {d:?}")))?,
            count: raw_count,
        }),
        None => None,
    };
    let index = py.detach(|| weightlift::format::open(&paths, raw)).map_err(|e| to_py(e.into()))?;
    let out = PyDict::new(py);
    out.set_item("format", index.format().map_or("mixed", |f| f.name()))?;
    let files = PyList::empty(py);
    for f in &index.files {
        let d = PyDict::new(py);
        d.set_item("path", f.path.to_string_lossy().into_owned())?;
        d.set_item("format", f.format.name())?;
        d.set_item("len", f.len)?;
        d.set_item("data_start", f.data_start)?;
        let meta: Value = match &f.metadata {
            Metadata::None => Value::Null,
            Metadata::Safetensors(m) => serde_json::json!(m),
            Metadata::Gguf(kv) => Value::Object(kv.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
        };
        d.set_item("metadata", json_to_py(py, &meta)?)?;
        files.append(d)?;
    }
    out.set_item("files", files)?;
    let tensors = PyList::empty(py);
    for t in &index.tensors {
        tensors.append((t.name.as_str(), t.dtype.name(), t.shape.clone(), t.file, t.offset, t.nbytes))?;
    }
    out.set_item("tensors", tensors)?;
    Ok(out.into_any().unbind())
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

// SAFETY: see `SendPtr`; a `(*const u8, usize)` view of a Python buffer held alive by the caller.
unsafe impl Sync for SendPtr<(*const u8, usize)> {}

/// What this machine offers weightlift: CUDA devices, io_uring, O_DIRECT on `path`'s filesystem, cuFile.
#[pyfunction]
#[pyo3(signature = (path=None))]
fn probe(py: Python<'_>, path: Option<PathBuf>) -> PyResult<Py<PyAny>> {
    let v = py.detach(|| weightlift::probe::probe(path.as_deref()));
    json_to_py(py, &v)
}

/// The report of the last load or read in this process (None before the first).
#[pyfunction]
fn last_report(py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
    let r = LAST_REPORT.lock().unwrap_or_else(|p| p.into_inner()).clone();
    r.map(|v| json_to_py(py, &v)).transpose()
}

/// Every ggml tensor type: name → (id, elements per block, bytes per block).
#[pyfunction]
fn ggml_types() -> BTreeMap<&'static str, (u32, u64, u64)> {
    weightlift::format::GgmlType::ALL.iter().map(|g| (g.name(), (g.id(), g.block_size(), g.type_size()))).collect()
}

/// Whether CUDA is usable, and why not.
#[pyfunction]
fn cuda_status() -> (bool, String) {
    match weightlift_cuda::available() {
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
    m.add_class::<NativeBuffer>()?;
    m.add_class::<NativeSession>()?;
    m.add_class::<NativeAsync>()?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(save_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(probe, m)?)?;
    m.add_function(wrap_pyfunction!(last_report, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_status, m)?)?;
    m.add_function(wrap_pyfunction!(ggml_types, m)?)?;
    let settings = PyList::empty(m.py());
    for s in weightlift::io::config::SETTINGS {
        settings.append((s.name, s.env, s.default, s.meaning))?;
    }
    m.add("SETTINGS", settings)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
