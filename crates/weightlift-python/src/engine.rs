//! The engine as Python sees it (`weightlift._native.NativeEngine`): made from settings by keyword, shared by the
//! package's loads.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::Value;
use weightlift::{Device, Engine, LoadOpts, Overrides, RawSrc, Settings};

use crate::bridge::{SendPtr, interruptible};
use crate::device::{parse_device, raw_dest};
use crate::dlpack::NativeBuffer;
use crate::errors::to_py;
use crate::report::{json_to_py, remember};

/// The engine: its settings, persistent I/O lanes and caches. Safe to share between threads: loads run
/// concurrently on the same lanes.
#[pyclass(module = "weightlift._native", frozen)]
pub(crate) struct NativeEngine {
    pub(crate) engine: Arc<Engine>,
}

/// `settings` as overrides: each value's text form, parsed by the engine's settings table.
fn overrides(settings: Option<&Bound<'_, PyDict>>) -> PyResult<Overrides> {
    let mut o = Overrides::new();
    for (k, v) in settings.into_iter().flat_map(|d| d.iter()) {
        let name: String = k.extract()?;
        if !v.is_none() {
            o.set(name, v.str()?.to_string());
        }
    }
    Ok(o)
}

#[pymethods]
impl NativeEngine {
    /// Settings given by keyword (any of `SETTINGS`' names; None leaves one alone) override the
    /// `WEIGHTLIFT_*` variables, which override the defaults.
    #[new]
    #[pyo3(signature = (**settings))]
    fn new(settings: Option<&Bound<'_, PyDict>>) -> PyResult<NativeEngine> {
        let _cuda = crate::bridge::keep_callers_context();
        let s = Settings::resolve(&overrides(settings)?).map_err(to_py)?;
        let engine = Engine::new(s).map_err(to_py)?;
        Ok(NativeEngine { engine: Arc::new(engine) })
    }

    /// Where this engine's Python loads onto a GPU take their tensors' memory (the `device_memory` setting:
    /// "torch" or "pool").
    #[getter]
    fn device_memory(&self) -> String {
        let _cuda = crate::bridge::keep_callers_context();
        self.engine.settings().device_memory.value.to_string()
    }

    /// The settings in use and where each came from.
    fn settings(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let _cuda = crate::bridge::keep_callers_context();
        let v = Value::Object(
            self.engine
                .settings()
                .describe()
                .into_iter()
                .map(|(k, v, s)| (k.to_string(), serde_json::json!({"value": v, "source": s.to_string()})))
                .collect(),
        );
        json_to_py(py, &v)
    }

    /// Sets the engine up for loads onto `device` now (lanes' staging, and for a GPU its streams and pool), so
    /// that the first load pays for none of it; returns what was done.
    /// With `kernels`, also the GPU kernels of packed and checked loads (`kernels_secs` in the result).
    #[pyo3(signature = (device, kernels = false))]
    fn prepare(&self, py: Python<'_>, device: &str, kernels: bool) -> PyResult<Py<PyAny>> {
        let _cuda = crate::bridge::keep_callers_context();
        let device = parse_device(device)?;
        let engine = self.engine.clone();
        let (prepared, kernels_secs) = interruptible(py, move |cancel| {
            let prepared = engine.prepare_with(device, Some(cancel))?;
            let secs = if kernels { Some(engine.prepare_kernels(device)?) } else { None };
            weightlift::Result::Ok((prepared, secs))
        })?
        .map_err(to_py)?;
        let mut json = prepared.to_json();
        json["kernels_secs"] = serde_json::json!(kernels_secs);
        json_to_py(py, &json)
    }

    /// Frees what the engine keeps between loads: staging memory, freed host buffers, GPU decoder scratch, the
    /// freed device memory the driver's pool keeps (`device_cache_bytes`), cached files. Tensors already loaded stay.
    fn release_memory(&self, py: Python<'_>) {
        let _cuda = crate::bridge::keep_callers_context();
        let engine = self.engine.clone();
        py.detach(move || engine.release_memory());
    }

    /// Loads byte ranges `(file index, offset, length)` of `paths` onto `device`, through one plan.
    fn load_ranges(
        &self,
        py: Python<'_>,
        paths: Vec<PathBuf>,
        ranges: Vec<(usize, u64, u64)>,
        device: &str,
    ) -> PyResult<Vec<NativeBuffer>> {
        let _cuda = crate::bridge::keep_callers_context();
        let device = parse_device(device)?;
        let engine = self.engine.clone();
        let faults = crate::inject::from_env(&paths)?;
        let loaded = interruptible(py, move |cancel| {
            let opts = LoadOpts { faults: faults.as_ref(), cancel: Some(cancel), ..LoadOpts::default() };
            engine.load_ranges(&paths, &ranges, device, &opts)
        })?
        .map_err(to_py)?;
        remember(loaded.report.to_json());
        Ok(loaded.tensors.into_iter().map(|t| NativeBuffer::new(t.data)).collect())
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
        let _cuda = crate::bridge::keep_callers_context();
        let dest = SendPtr(raw_dest(device, ptr)?);
        let engine = self.engine.clone();
        let faults = crate::inject::from_env(std::slice::from_ref(&path))?;
        let (n, report) = interruptible(py, move |cancel| {
            let dest = dest;
            let opts = LoadOpts { faults: faults.as_ref(), cancel: Some(cancel), ..LoadOpts::default() };
            // SAFETY: the Python layer passes the data pointer and byte size of a live, contiguous tensor or
            // storage that it keeps alive (and does not hand to other work) for the duration of this call.
            unsafe { engine.read_at(&path, offset, nbytes, dest.0, &opts) }
        })?
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
        let _cuda = crate::bridge::keep_callers_context();
        let src = match parse_device(device)? {
            Device::Cpu | Device::PinnedCpu => RawSrc::Host(ptr as *const u8),
            Device::Cuda(ordinal) => RawSrc::Device { ordinal, ptr: ptr as u64 },
        };
        let src = SendPtr(src);
        let engine = self.engine.clone();
        interruptible(py, move |_| {
            let src = src;
            // SAFETY: as for `read_into`: a live, contiguous tensor or storage kept alive by the caller.
            unsafe { engine.write_from(&path, offset, nbytes, src.0, durable) }
        })?
        .map_err(to_py)
    }
}
