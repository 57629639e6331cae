//! Checkpoints seen from Python: the parsed index stays in Rust, Python asks for tensors by name and gets byte
//! buffers (DLPack) plus a named [`TensorInfo`] to view them with. Streaming loads (`safe_open`) are
//! [`NativeStream`]s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use weightlift::format::{DType, Metadata, RawSpec, TensorIndex};
use weightlift::{ByteRange, Dests, Device, LoadOpts, ReadRequest, Sources, Stream};

use crate::alloc::TorchAllocator;
use crate::bridge::{SendPtr, interruptible, interruptible_with};
use crate::device::{parse_device, raw_dest};
use crate::dlpack::NativeBuffer;
use crate::engine::NativeEngine;
use crate::errors::{invalid_argument, to_py};
use crate::report::{json_to_py, remember};

/// What a checkpoint says about one tensor.
#[pyclass(module = "weightlift._native", frozen, get_all)]
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// safetensors' dtype name (`BF16`, `F32`, …) or, for GGUF, the ggml type name.
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Index of the file holding it, and where: absolute offset and byte count.
    pub file: usize,
    pub offset: u64,
    pub nbytes: u64,
    /// The shape of the stored bytes as elements of `dtype` where it has elements; for block-quantized ggml types
    /// the rows of the logical shape, each as its blocks' bytes (the layout the `gguf` package presents).
    pub storage_shape: Vec<u64>,
    /// Whether `dtype` is a block-quantized ggml type (its bytes are viewed as uint8).
    pub quantized: bool,
}

#[pymethods]
impl TensorInfo {
    fn __repr__(&self) -> String {
        let _cuda = crate::bridge::keep_callers_context();
        format!(
            "TensorInfo(name={:?}, dtype={:?}, shape={:?}, file={}, offset={}, nbytes={})",
            self.name, self.dtype, self.shape, self.file, self.offset, self.nbytes
        )
    }
}

/// A parsed checkpoint (one file, shards, an index, GGUF, or raw files).
#[pyclass(module = "weightlift._native", frozen)]
#[derive(Debug)]
pub struct Checkpoint {
    index: Arc<TensorIndex>,
    by_name: HashMap<String, usize>,
    /// For a packed checkpoint (`.wlpack`): the pack, its index read once. `index` then lists its tensors (offsets are those of the
    /// original files) and loads go through `Engine::load_pack`.
    pack: Option<Arc<weightlift::Pack>>,
    /// For a packed checkpoint: what it was packed from (`safetensors`, `safetensors-sharded` or `gguf`).
    pack_source: Option<String>,
}

impl Checkpoint {
    /// The parsed index, for reads by file offset: refused for a packed checkpoint, whose tensors are not stored at
    /// the offsets its index gives (those of the original files) and must be decoded.
    pub(crate) fn index(&self) -> PyResult<&Arc<TensorIndex>> {
        match &self.pack {
            Some(p) => Err(to_py(weightlift::Error::InvalidArgument(format!(
                "{}: a packed checkpoint is read by decoding its chunks (load_file, safe_open); this API reads \
                 tensors by file offset (unpack it first: weightlift unpack)",
                p.path().display()
            )))),
            None => Ok(&self.index),
        }
    }

    /// The faults the test hook `WEIGHTLIFT_INJECT_EIO` asks for in reads of this checkpoint's files.
    fn faults(&self) -> PyResult<Option<weightlift::io::fault::FaultPlan>> {
        let paths: Vec<PathBuf> = self.index.files.iter().map(|f| f.path.clone()).collect();
        crate::inject::from_env(&paths)
    }

    fn positions(&self, names: Option<Vec<String>>) -> PyResult<Vec<usize>> {
        match names {
            None => Ok((0..self.index.tensors.len()).collect()),
            Some(names) => names.iter().map(|n| self.position(n)).collect(),
        }
    }

    fn position(&self, name: &str) -> PyResult<usize> {
        self.by_name.get(name).copied().ok_or_else(|| {
            let files: Vec<String> = self.index.files.iter().map(|f| f.path.display().to_string()).collect();
            to_py(weightlift::Error::TensorNotFound { name: name.to_string(), where_: files.join(", ") })
        })
    }
}

#[pymethods]
impl Checkpoint {
    /// Parses the headers of `paths` (`raw_dtype`: read them as raw tensors of that dtype).
    #[new]
    #[pyo3(signature = (paths, raw_dtype=None, raw_count=None))]
    pub fn new(
        py: Python<'_>,
        paths: Vec<PathBuf>,
        raw_dtype: Option<String>,
        raw_count: Option<u64>,
    ) -> PyResult<Checkpoint> {
        let _cuda = crate::bridge::keep_callers_context();
        let raw = match raw_dtype {
            Some(d) => Some(RawSpec {
                dtype: DType::parse(&d).ok_or_else(|| invalid_argument(&format!("unknown dtype {d:?}")))?,
                count: raw_count,
            }),
            None => None,
        };
        let pack = match (paths.as_slice(), &raw) {
            ([p], None) if weightlift::is_pack_file(p) => {
                Some(Arc::new(py.detach(|| weightlift::Pack::open(p)).map_err(to_py)?))
            }
            _ => None,
        };
        let (index, pack_source) = match &pack {
            Some(p) => (p.tensor_index(), Some(p.source().to_string())),
            None => (py.detach(|| weightlift::format::open(&paths, raw)).map_err(|e| to_py(e.into()))?, None),
        };
        let by_name = index.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Checkpoint { index: Arc::new(index), by_name, pack, pack_source })
    }

    /// For a packed checkpoint, what it was packed from (`safetensors`, `safetensors-sharded`, `gguf`); else None.
    #[getter]
    pub fn pack_source(&self) -> Option<String> {
        let _cuda = crate::bridge::keep_callers_context();
        self.pack_source.clone()
    }

    /// `safetensors`, `gguf`, `raw`, `wlpack` or `mixed`.
    #[getter]
    pub fn format(&self) -> &'static str {
        let _cuda = crate::bridge::keep_callers_context();
        if self.pack.is_some() {
            return "wlpack";
        }
        self.index.format().map_or("mixed", |f| f.name())
    }

    /// Every tensor, in index order.
    #[getter]
    pub fn tensors(&self) -> Vec<TensorInfo> {
        let _cuda = crate::bridge::keep_callers_context();
        self.index.tensors.iter().map(info).collect()
    }

    /// The named tensor's description.
    fn tensor(&self, name: &str) -> PyResult<TensorInfo> {
        let _cuda = crate::bridge::keep_callers_context();
        Ok(info(&self.index.tensors[self.position(name)?]))
    }

    fn __contains__(&self, name: &str) -> bool {
        let _cuda = crate::bridge::keep_callers_context();
        self.by_name.contains_key(name)
    }

    /// The files: path, format, length, where tensor data starts, the ETag of an object, and metadata.
    #[getter]
    pub fn files(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        let _cuda = crate::bridge::keep_callers_context();
        let files = PyList::empty(py);
        for f in &self.index.files {
            let d = PyDict::new(py);
            d.set_item("path", f.path.to_string_lossy().into_owned())?;
            d.set_item("format", f.format.name())?;
            d.set_item("len", f.len)?;
            d.set_item("data_start", f.data_start)?;
            // An object's version (None for a local file, or an object its server gives no ETag).
            d.set_item("etag", f.etag.as_deref())?;
            match &f.metadata {
                Metadata::None => d.set_item("metadata", py.None())?,
                Metadata::Safetensors(m) => d.set_item("metadata", json_to_py(py, &serde_json::json!(m))?)?,
                Metadata::Gguf(kv) => {
                    let meta = PyDict::new(py);
                    for (k, v) in kv {
                        meta.set_item(k, gguf_to_py(py, v)?)?;
                    }
                    d.set_item("metadata", meta)?;
                }
            }
            files.append(d)?;
        }
        Ok(files.unbind())
    }

    /// Loads the named tensors (all of them by default) onto `device` through one plan, in the order asked.
    ///
    /// `verify=True` checks every loaded byte against the checksum manifests of the files (`FILE.xxh3.json`,
    /// written by `weightlift checksum FILE`): each tensor is hashed as soon as it has landed, overlapped with the
    /// rest of the load (device tensors on their GPU, host tensors on a CPU thread). A mismatch raises
    /// `ChecksumError` naming tensor and chunk. A pack's own checksums are always checked.
    ///
    /// `align` (bytes, a power of two up to 256; 0: the default placement) starts every tensor of a device load at
    /// a multiple of it, as torch's allocator places its own tensors (packed checkpoints ignore it).
    ///
    /// `allocator` (device loads of unpacked checkpoints): a callable `alloc(nbytes)` returning a contiguous uint8
    /// CUDA tensor of at least `nbytes` bytes on `device`, allocated on the stream whose handle is `stream` (0: the
    /// legacy default stream); the load's blocks are such tensors, made while the reads run. An exception it raises
    /// is raised by the load (torch's `OutOfMemoryError` as weightlift's out-of-memory error).
    ///
    /// `progress`: a callable `progress(bytes_done)` called every 50 ms while the load runs and once at its end
    /// (an exception it raises cancels the load).
    #[pyo3(signature = (engine, device, names=None, verify=false, align=0, allocator=None, stream=0, progress=None))]
    #[allow(clippy::too_many_arguments)] // a Python method's keywords
    fn load(
        &self,
        py: Python<'_>,
        engine: &NativeEngine,
        device: &str,
        names: Option<Vec<String>>,
        verify: bool,
        align: u64,
        allocator: Option<Py<PyAny>>,
        stream: usize,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Vec<NativeBuffer>> {
        let _cuda = crate::bridge::keep_callers_context();
        if align != 0 && (!align.is_power_of_two() || align > 256) {
            let why = format!("align={align}: expected 0 or a power of two up to 256");
            return Err(to_py(weightlift::Error::InvalidArgument(why)));
        }
        let device = parse_device(device)?;
        let which = self.positions(names)?;
        let checks = if verify && self.pack.is_none() {
            Some(weightlift::Checks::from_manifests(&self.index, &which).map_err(to_py)?)
        } else {
            None
        };
        let (index, engine, pack) = (self.index.clone(), engine.engine.clone(), self.pack.clone());
        let faults = self.faults()?.map(Arc::new);
        // Packed loads decode into memory of their own; host loads have no use for a device allocator.
        let torch = match (allocator, device, &pack) {
            (Some(a), Device::Cuda(_), None) => Some(TorchAllocator::new(a, stream)),
            _ => None,
        };
        let torch_ref = torch.as_ref();
        let done = AtomicU64::new(0);
        let tick = |py: Python<'_>| match &progress {
            Some(f) => f.call1(py, (done.load(Ordering::Relaxed),)).map(drop),
            None => Ok(()),
        };
        let done_ref = &done;
        let loaded = interruptible_with(py, tick, move |cancel| {
            let mut opts = LoadOpts {
                faults: faults.as_deref(),
                cancel: Some(cancel),
                checks: checks.as_ref(),
                tensor_align: (align != 0).then_some(align),
                device_alloc: torch_ref.map(|t| t as &dyn weightlift::cuda::DeviceAllocator),
                ..LoadOpts::default()
            };
            opts.progress = Some(done_ref);
            match &pack {
                Some(p) => {
                    engine.load_pack_with(p, Some(&which), device, weightlift::Decoder::Auto, &opts, faults.clone())
                }
                None => engine.load_some(&index, &which, device, &opts),
            }
        })?;
        // An exception of the allocator itself reaches the caller as it was raised.
        let loaded =
            loaded.map_err(|e| torch.as_ref().and_then(TorchAllocator::take_failure).unwrap_or_else(|| to_py(e)))?;
        remember(loaded.report.to_json());
        Ok(loaded.tensors.into_iter().map(|t| NativeBuffer::new(t.data)).collect())
    }

    /// Every tensor from a keeper only (see `weightlift keep`), as `load` would give them, or None where the
    /// engine's settings name no keeper or it does not keep every file (the reason is then the last report's
    /// `keeper`, where one was asked). `allocator` and `stream` as for `load`.
    #[pyo3(signature = (engine, device, allocator=None, stream=0))]
    fn load_kept(
        &self,
        py: Python<'_>,
        engine: &NativeEngine,
        device: &str,
        allocator: Option<Py<PyAny>>,
        stream: usize,
    ) -> PyResult<Option<Vec<NativeBuffer>>> {
        let _cuda = crate::bridge::keep_callers_context();
        let device = parse_device(device)?;
        if self.pack.is_some() || self.faults()?.is_some() {
            return Ok(None);
        }
        let which: Vec<usize> = (0..self.index.tensors.len()).collect();
        let torch = match (allocator, device) {
            (Some(a), Device::Cuda(_)) => Some(TorchAllocator::new(a, stream)),
            _ => None,
        };
        let torch_ref = torch.as_ref();
        let (index, engine) = (self.index.clone(), engine.engine.clone());
        let got = interruptible(py, move |cancel| {
            let opts = LoadOpts {
                cancel: Some(cancel),
                device_alloc: torch_ref.map(|t| t as &dyn weightlift::cuda::DeviceAllocator),
                ..LoadOpts::default()
            };
            engine.load_kept(&index, &which, device, &opts)
        })?;
        let got = got.map_err(|e| torch.as_ref().and_then(TorchAllocator::take_failure).unwrap_or_else(|| to_py(e)))?;
        match got {
            Ok(loaded) => {
                remember(loaded.report.to_json());
                Ok(Some(loaded.tensors.into_iter().map(|t| NativeBuffer::new(t.data)).collect()))
            }
            Err(_) => Ok(None),
        }
    }

    /// Rows `[start, stop)` of the named tensor (its first dimension), read alone.
    fn rows(
        &self,
        py: Python<'_>,
        engine: &NativeEngine,
        name: &str,
        start: u64,
        stop: u64,
        device: &str,
    ) -> PyResult<NativeBuffer> {
        let _cuda = crate::bridge::keep_callers_context();
        let t = &self.index.tensors[self.position(name)?];
        let rows = t.shape.first().copied().unwrap_or(0);
        if start > stop || stop > rows {
            return Err(invalid_argument(&format!("rows {start}..{stop} of {name:?}, which has {rows}")));
        }
        let row = t.nbytes.checked_div(rows).unwrap_or(0);
        if let Some(pack) = self.pack.clone() {
            // Packed chunks are decoded whole: the tensor is decoded, and the rows are a view of it (device) or a
            // copy (host).
            let (i, device, engine) = (self.position(name)?, parse_device(device)?, engine.engine.clone());
            let loaded = interruptible(py, move |cancel| {
                let opts = LoadOpts { cancel: Some(cancel), ..LoadOpts::default() };
                engine.load_pack_with(&pack, Some(&[i]), device, weightlift::Decoder::Auto, &opts, None)
            })?
            .map_err(to_py)?;
            remember(loaded.report.to_json());
            let data = loaded.tensors.into_iter().next().ok_or_else(|| invalid_argument("no rows were loaded"))?.data;
            return Ok(NativeBuffer::new(rows_of(data, start * row, (stop - start) * row).map_err(to_py)?));
        }
        // The file as parsed: an object's rows come from the version its header was read from.
        let file = self.index.files[t.file].clone();
        let range = (0usize, t.offset + start * row, (stop - start) * row);
        let device = parse_device(device)?;
        let engine = engine.engine.clone();
        let faults = self.faults()?;
        let loaded = interruptible(py, move |cancel| {
            let opts = LoadOpts { faults: faults.as_ref(), cancel: Some(cancel), ..LoadOpts::default() };
            engine.load_ranges_of(vec![file], &[range], device, &opts)
        })?
        .map_err(to_py)?;
        remember(loaded.report.to_json());
        let t = loaded.tensors.into_iter().next().ok_or_else(|| invalid_argument("no rows were loaded"))?;
        Ok(NativeBuffer::new(t.data))
    }

    /// Reads byte ranges `(file index, offset, length, destination offset)` of the checkpoint's files into the
    /// `nbytes` of memory at address `ptr` (host, or device `cuda:N`), through one plan; returns the read's report.
    /// The files as parsed: an object's bytes come from the version its header was read from, or the read fails.
    /// Honours the test hook `WEIGHTLIFT_INJECT_EIO` (see `inject`).
    fn read_ranges_into(
        &self,
        py: Python<'_>,
        engine: &NativeEngine,
        ranges: Vec<(usize, u64, u64, u64)>,
        ptr: usize,
        nbytes: u64,
        device: &str,
    ) -> PyResult<Py<PyAny>> {
        let _cuda = crate::bridge::keep_callers_context();
        let index = self.index()?.clone();
        let dest = SendPtr(raw_dest(device, ptr)?);
        let faults = self.faults()?;
        let engine = engine.engine.clone();
        let report = interruptible(py, move |cancel| {
            let dest = dest;
            let opts = LoadOpts { faults: faults.as_ref(), cancel: Some(cancel), ..LoadOpts::default() };
            let ranges: Vec<ByteRange> = ranges.iter().map(|&(f, o, l, d)| ByteRange::new(f, o, l, d)).collect();
            let dests = [(dest.0, nbytes)];
            let req =
                ReadRequest::new(Sources::Described(&index.files), &ranges, Dests::Memory(&dests)).with_opts(opts);
            // SAFETY: the Python layer passes the data pointer and byte size of a live, contiguous tensor that it
            // keeps alive (and does not hand to other work) for the duration of this call.
            unsafe { engine.read(&req) }
        })?
        .map_err(to_py)?
        .to_json();
        remember(report.clone());
        json_to_py(py, &report)
    }

    /// Starts streaming the named tensors (all by default) onto `device`, in file order; see `NativeStream`.
    /// `rows` takes rows `start..stop` of the first dimension of the tensors it names instead of all of them (only
    /// those bytes are read); `lanes` caps the lanes that read, `window` the bytes read ahead of the takes (the
    /// `prefetch_bytes` setting by default).
    #[pyo3(signature = (engine, device, names=None, rows=None, lanes=None, window=None))]
    #[allow(clippy::too_many_arguments)]
    fn stream(
        &self,
        py: Python<'_>,
        engine: &NativeEngine,
        device: &str,
        names: Option<Vec<String>>,
        rows: Option<HashMap<String, (u64, u64)>>,
        lanes: Option<usize>,
        window: Option<u64>,
    ) -> PyResult<NativeStream> {
        let _cuda = crate::bridge::keep_callers_context();
        let device = parse_device(device)?;
        let which = self.positions(names)?;
        let positions: HashMap<String, usize> =
            which.iter().enumerate().map(|(p, &i)| (self.index.tensors[i].name.clone(), p)).collect();
        let rows = rows.unwrap_or_default();
        if let Some(pack) = &self.pack {
            if !rows.is_empty() {
                return Err(invalid_argument(&format!(
                    "{}: rows of a packed checkpoint's tensors are cut after decoding (take the whole tensor)",
                    pack.path().display()
                )));
            }
            let pending = PackedPending { engine: engine.engine.clone(), pack: pack.clone(), which, device };
            let packed = Packed { state: Mutex::new(PackedState::Pending(pending)), done: Default::default() };
            return Ok(NativeStream { stream: Arc::new(Mutex::new(None)), positions, packed: Arc::new(packed) });
        }
        let index = if rows.is_empty() { self.index.clone() } else { Arc::new(self.with_rows(&rows)?) };
        let e = engine.engine.clone();
        let faults = self.faults()?.map(Arc::new);
        let limits = weightlift::StreamLimits { max_lanes: lanes.map(|l| l.max(1)), window };
        let stream = py.detach(|| e.stream_limited(&index, &which, device, faults, limits)).map_err(to_py)?;
        Ok(NativeStream { stream: Arc::new(Mutex::new(Some(stream))), positions, packed: Arc::new(Packed::default()) })
    }
}

impl Checkpoint {
    /// The index with the tensors `rows` names narrowed to rows `start..stop` of their first dimension: their
    /// bytes, offsets and shapes as those rows'.
    fn with_rows(&self, rows: &HashMap<String, (u64, u64)>) -> PyResult<TensorIndex> {
        let mut index = (*self.index).clone();
        for (name, &(start, stop)) in rows {
            let t = &mut index.tensors[self.position(name)?];
            let Some(&n) = t.shape.first() else {
                return Err(invalid_argument(&format!("cannot slice rows of the 0-d tensor {name}")));
            };
            if start > stop || stop > n {
                return Err(invalid_argument(&format!("rows {start}..{stop} of {name}, which has {n}")));
            }
            if n == 0 || !t.nbytes.is_multiple_of(n) {
                return Err(invalid_argument(&format!(
                    "cannot slice rows of {name}: a row is not a whole number of bytes"
                )));
            }
            let row = t.nbytes / n;
            t.offset += start * row;
            t.nbytes = (stop - start) * row;
            t.shape[0] = stop - start;
        }
        Ok(index)
    }
}

/// Bytes `offset..offset + len` of a loaded tensor: a view of its device allocation, or a copy of host bytes.
fn rows_of(data: weightlift::TensorData, offset: u64, len: u64) -> weightlift::Result<weightlift::TensorData> {
    use weightlift::TensorData;
    match data {
        TensorData::Device(t) => {
            Ok(TensorData::Device(weightlift::DeviceTensor { offset: t.offset + offset, len, ..t }))
        }
        host => {
            let mut out = weightlift::io::HostBuffer::new(len as usize, None)?;
            host.read_back(offset, &mut out)?;
            Ok(TensorData::Host(out))
        }
    }
}

/// A packed checkpoint's stream: its tensors are decoded together at the first take (chunks decode whole, and one
/// load keeps the reads and the decoder busy), then handed out one by one.
#[derive(Default)]
struct Packed {
    state: Mutex<PackedState>,
    /// Signalled when a decode ends (other takers wait for it).
    done: std::sync::Condvar,
}

#[derive(Default)]
enum PackedState {
    /// Not a packed stream, or closed.
    #[default]
    None,
    /// Nothing decoded yet: what the first take decodes.
    Pending(PackedPending),
    /// A take is decoding.
    Decoding,
    /// Decoded tensors not yet taken.
    Ready(HashMap<usize, weightlift::TensorData>),
}

struct PackedPending {
    engine: Arc<weightlift::Engine>,
    pack: Arc<weightlift::Pack>,
    which: Vec<usize>,
    device: weightlift::Device,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &*self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            PackedState::None => "none".to_string(),
            PackedState::Pending(_) => "pending".to_string(),
            PackedState::Decoding => "decoding".to_string(),
            PackedState::Ready(m) => format!("{} decoded", m.len()),
        };
        write!(f, "Packed({state})")
    }
}

fn info(t: &weightlift::format::TensorEntry) -> TensorInfo {
    let (storage_shape, quantized) = match t.dtype {
        DType::Ggml(g) => {
            let (rows, inner) = t.shape.split_at(t.shape.len().saturating_sub(1));
            let inner = inner.first().copied().unwrap_or(1);
            let mut s = rows.to_vec();
            s.push(inner / g.block_size().max(1) * g.type_size());
            (s, true)
        }
        // torch holds F4 two values an element (float4_e2m1fn_x2): the last dimension halved. An odd one stays, and
        // the Python side refuses it as upstream does.
        DType::F4 => {
            let mut s = t.shape.clone();
            if let Some(last) = s.last_mut().filter(|l| l.is_multiple_of(2)) {
                *last /= 2;
            }
            (s, false)
        }
        _ => (t.shape.clone(), false),
    };
    TensorInfo {
        name: t.name.clone(),
        dtype: t.dtype.name().to_string(),
        shape: t.shape.clone(),
        file: t.file,
        offset: t.offset,
        nbytes: t.nbytes,
        storage_shape,
        quantized,
    }
}

/// A streaming load: `take(name)` returns a tensor's buffer once its bytes have landed (reading it at once if the
/// stream has not reached it), `close()` stops the read-ahead and returns what the stream did.
#[pyclass(module = "weightlift._native", frozen)]
#[derive(Debug)]
pub struct NativeStream {
    stream: Arc<Mutex<Option<Stream>>>,
    positions: HashMap<String, usize>,
    /// For a packed checkpoint (then `stream` is `None`).
    packed: Arc<Packed>,
}

#[pymethods]
impl NativeStream {
    /// The named tensor's buffer. A tensor can be taken once (`KeyError` if not streamed, `ValueError` if taken).
    fn take(&self, py: Python<'_>, name: &str) -> PyResult<NativeBuffer> {
        let _cuda = crate::bridge::keep_callers_context();
        let i = *self.positions.get(name).ok_or_else(|| {
            to_py(weightlift::Error::TensorNotFound { name: name.to_string(), where_: "this stream".into() })
        })?;
        if let Some(data) = self.take_packed(py, name, i)? {
            return Ok(NativeBuffer::new(data));
        }
        let stream = self.stream.clone();
        let data = interruptible(py, move |cancel| {
            let guard = stream.lock().unwrap_or_else(|p| p.into_inner());
            match guard.as_ref() {
                Some(s) => s.take_with(i, Some(cancel)),
                None => Err(weightlift::Error::InvalidArgument("the stream is closed".into())),
            }
        })?
        .map_err(to_py)?;
        Ok(NativeBuffer::new(data))
    }

    /// Whether the stream still runs (not closed).
    #[getter]
    fn open(&self) -> bool {
        let _cuda = crate::bridge::keep_callers_context();
        let packed = !matches!(*self.packed.state.lock().unwrap_or_else(|p| p.into_inner()), PackedState::None);
        packed || self.stream.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Stops reading ahead; returns what the stream read, on demand and ahead (and how much of that nobody took).
    fn close(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let _cuda = crate::bridge::keep_callers_context();
        // A decode under way stores nothing once it sees the stream closed.
        *self.packed.state.lock().unwrap_or_else(|p| p.into_inner()) = PackedState::None;
        self.packed.done.notify_all();
        let stream = self.stream.lock().unwrap_or_else(|p| p.into_inner()).take();
        let stats = match stream {
            Some(s) => py.detach(|| s.close()).map_err(to_py)?,
            None => weightlift::StreamStats::default(),
        };
        json_to_py(py, &stats.to_json())
    }
}

impl Drop for NativeStream {
    /// A stream freed unclosed stops its read-ahead without the GIL: the lanes it waits for may need the GIL to go
    /// on (another load's blocks come from torch's allocator).
    fn drop(&mut self) {
        let _cuda = crate::bridge::keep_callers_context();
        let stream = self.stream.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(s) = stream {
            let mut s = Some(s);
            let _ = Python::try_attach(|py| py.detach(|| drop(s.take())));
            drop(s);
        }
    }
}

impl NativeStream {
    /// For a packed checkpoint: decodes every streamed tensor at the first take, then hands out tensor `i`
    /// (`None`: not a packed stream). A take that finds another decoding waits for it; a decode that fails or is
    /// interrupted leaves the stream as it was, so the next take decodes again.
    fn take_packed(&self, py: Python<'_>, name: &str, i: usize) -> PyResult<Option<weightlift::TensorData>> {
        let packed = self.packed.clone();
        let closed = || {
            to_py(weightlift::Error::InvalidArgument(format!(
                "tensor {name:?} was already taken from this stream, or the stream is closed"
            )))
        };
        loop {
            let pending = {
                let mut state = packed.state.lock().unwrap_or_else(|p| p.into_inner());
                match std::mem::take(&mut *state) {
                    PackedState::None => {
                        let plain = self.stream.lock().unwrap_or_else(|p| p.into_inner()).is_some();
                        return if plain { Ok(None) } else { Err(closed()) };
                    }
                    PackedState::Ready(mut m) => {
                        let data = m.remove(&i);
                        *state = PackedState::Ready(m);
                        return data.map(Some).ok_or_else(closed);
                    }
                    PackedState::Decoding => {
                        *state = PackedState::Decoding;
                        drop(state);
                        // Wait for the other take's decode without holding the GIL.
                        let p = packed.clone();
                        py.detach(move || {
                            let s = p.state.lock().unwrap_or_else(|e| e.into_inner());
                            let _wait = p
                                .done
                                .wait_while(s, |s| matches!(s, PackedState::Decoding))
                                .unwrap_or_else(|e| e.into_inner());
                        });
                        continue;
                    }
                    PackedState::Pending(p) => {
                        *state = PackedState::Decoding;
                        p
                    }
                }
            };
            let (engine, pack, which, device) =
                (pending.engine.clone(), pending.pack.clone(), pending.which.clone(), pending.device);
            let outcome = interruptible(py, move |cancel| {
                let opts = LoadOpts { cancel: Some(cancel), ..LoadOpts::default() };
                engine.load_pack_with(&pack, Some(&which), device, weightlift::Decoder::Auto, &opts, None)
            })
            .and_then(|r| r.map_err(to_py));
            let mut state = packed.state.lock().unwrap_or_else(|p| p.into_inner());
            // Closed meanwhile (state None): keep nothing.
            let open = matches!(*state, PackedState::Decoding);
            let result = match outcome {
                Ok(loaded) => {
                    remember(loaded.report.to_json());
                    if open {
                        *state = PackedState::Ready(loaded.tensors.into_iter().map(|t| t.data).enumerate().collect());
                    }
                    Ok(())
                }
                Err(e) => {
                    if open {
                        *state = PackedState::Pending(pending);
                    }
                    Err(e)
                }
            };
            drop(state);
            packed.done.notify_all();
            result?;
            if !open {
                return Err(closed());
            }
        }
    }
}

/// A GGUF metadata value as Python: scalars as `int`, `float`, `bool`, `str`; numeric arrays as `array.array` of
/// their element type, made from the vector's bytes at once, so that an array costs about its size in the file (a
/// list of 16 M small ints cost 115× the file through JSON); arrays of strings, of bools and of arrays as lists.
fn gguf_to_py(py: Python<'_>, v: &weightlift::format::gguf::GgufValue) -> PyResult<Py<PyAny>> {
    use weightlift::format::gguf::GgufValue as V;
    Ok(match v {
        V::U8(x) => x.into_pyobject(py)?.into_any().unbind(),
        V::I8(x) => x.into_pyobject(py)?.into_any().unbind(),
        V::U16(x) => x.into_pyobject(py)?.into_any().unbind(),
        V::I16(x) => x.into_pyobject(py)?.into_any().unbind(),
        V::U32(x) => x.into_pyobject(py)?.into_any().unbind(),
        V::I32(x) => x.into_pyobject(py)?.into_any().unbind(),
        V::U64(x) => x.into_pyobject(py)?.into_any().unbind(),
        V::I64(x) => x.into_pyobject(py)?.into_any().unbind(),
        V::F32(x) => x.into_pyobject(py)?.into_any().unbind(),
        V::F64(x) => x.into_pyobject(py)?.into_any().unbind(),
        V::Bool(x) => pyo3::types::PyBool::new(py, *x).to_owned().into_any().unbind(),
        V::String(x) => x.into_pyobject(py)?.into_any().unbind(),
        V::Array(a) => gguf_array_to_py(py, a)?,
    })
}

fn gguf_array_to_py(py: Python<'_>, a: &weightlift::format::gguf::GgufArray) -> PyResult<Py<PyAny>> {
    use weightlift::format::gguf::GgufArray as A;
    fn typed<T: Copy, const N: usize>(
        py: Python<'_>,
        code: &str,
        v: &[T],
        bytes: impl Fn(T) -> [u8; N],
    ) -> PyResult<Py<PyAny>> {
        let raw: Vec<u8> = v.iter().flat_map(|&x| bytes(x)).collect();
        let array = py.import("array")?.getattr("array")?.call1((code,))?;
        // The machine's byte order is little-endian on every platform weightlift builds for, as GGUF's is.
        array.call_method1("frombytes", (pyo3::types::PyBytes::new(py, &raw),))?;
        Ok(array.unbind())
    }
    Ok(match a {
        A::U8(v) => typed(py, "B", v, |x| [x])?,
        A::I8(v) => typed(py, "b", v, i8::to_le_bytes)?,
        A::U16(v) => typed(py, "H", v, u16::to_le_bytes)?,
        A::I16(v) => typed(py, "h", v, i16::to_le_bytes)?,
        A::U32(v) => typed(py, "I", v, u32::to_le_bytes)?,
        A::I32(v) => typed(py, "i", v, i32::to_le_bytes)?,
        A::U64(v) => typed(py, "Q", v, u64::to_le_bytes)?,
        A::I64(v) => typed(py, "q", v, i64::to_le_bytes)?,
        A::F32(v) => typed(py, "f", v, f32::to_le_bytes)?,
        A::F64(v) => typed(py, "d", v, f64::to_le_bytes)?,
        A::Bool(v) => PyList::new(py, v.iter().copied())?.into_any().unbind(),
        A::String(v) => PyList::new(py, v.iter().map(String::as_str))?.into_any().unbind(),
        A::Array(v) => PyList::new(py, v.iter().map(|a| gguf_array_to_py(py, a)).collect::<PyResult<Vec<_>>>()?)?
            .into_any()
            .unbind(),
    })
}
