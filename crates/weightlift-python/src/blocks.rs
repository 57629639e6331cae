//! Native halves of `weightlift.nvme` (a block device or a file read by LBA, region tables by kind) and of
//! `weightlift.LayerStreamer` (layers of a checkpoint streamed through slots the Python side allocates as tensors).

use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::prelude::*;
use weightlift::{BlockDevice, Device, LayerStreamer, RawDest, RegionTable};

use crate::bridge::SendPtr;
use crate::bridge::interruptible;
use crate::checkpoint::Checkpoint;
use crate::device::{parse_device, raw_dest};
use crate::engine::NativeEngine;
use crate::errors::{invalid_argument, to_py};
use crate::report::remember;

/// A block device (or a file standing for one) read by LBA.
#[pyclass(module = "weightlift._native", frozen)]
#[derive(Debug)]
pub struct NativeBlockDevice {
    dev: BlockDevice,
}

#[pymethods]
impl NativeBlockDevice {
    #[new]
    #[pyo3(signature = (engine, path, block_size=None))]
    fn new(py: Python<'_>, engine: &NativeEngine, path: PathBuf, block_size: Option<u32>) -> PyResult<Self> {
        let _cuda = crate::bridge::keep_callers_context();
        let engine = engine.engine.clone();
        let dev = py.detach(|| BlockDevice::open(engine, &path, block_size)).map_err(to_py)?;
        Ok(NativeBlockDevice { dev })
    }

    #[getter]
    fn block_size(&self) -> u32 {
        let _cuda = crate::bridge::keep_callers_context();
        self.dev.block_size()
    }

    #[getter]
    fn blocks(&self) -> u64 {
        let _cuda = crate::bridge::keep_callers_context();
        self.dev.blocks()
    }

    #[getter]
    fn is_block_device(&self) -> bool {
        let _cuda = crate::bridge::keep_callers_context();
        self.dev.is_block_device()
    }

    #[getter]
    fn path(&self) -> PathBuf {
        let _cuda = crate::bridge::keep_callers_context();
        self.dev.path().to_path_buf()
    }

    /// Reads `count` blocks from `lba` into the `nbytes` of memory at `ptr` on `device`; returns the bytes read.
    fn read(&self, py: Python<'_>, lba: u64, count: u64, ptr: usize, nbytes: u64, device: &str) -> PyResult<u64> {
        let _cuda = crate::bridge::keep_callers_context();
        let (_, len) = self.dev.byte_range(lba, count).map_err(to_py)?;
        if nbytes < len {
            return Err(invalid_argument(&format!(
                "the destination holds {nbytes} bytes; {count} blocks of {} need {len}",
                self.dev.block_size()
            )));
        }
        let dest = SendPtr(raw_dest(device, ptr)?);
        let dev = self.dev.clone();
        let (n, report) = interruptible(py, move |_| {
            let dest = dest;
            // SAFETY: the Python layer passes the address and size of a live, contiguous tensor (or a pointer
            // its caller vouches for) that stays alive and unused by other work during the call.
            unsafe { dev.read(lba, count, dest.0) }
        })?
        .map_err(to_py)?;
        remember(report.to_json());
        Ok(n)
    }
}

/// Named LBA ranges of one block device.
#[pyclass(module = "weightlift._native", frozen)]
#[derive(Debug)]
pub struct NativeRegions {
    table: Mutex<RegionTable>,
}

#[pymethods]
impl NativeRegions {
    #[new]
    fn new(dev: &NativeBlockDevice) -> Self {
        let _cuda = crate::bridge::keep_callers_context();
        NativeRegions { table: Mutex::new(RegionTable::new(dev.dev.clone())) }
    }

    fn set(&self, kind: &str, start: u64, count: u64) -> PyResult<()> {
        let _cuda = crate::bridge::keep_callers_context();
        self.table.lock().unwrap_or_else(|p| p.into_inner()).insert(kind, start, count).map_err(to_py)
    }

    fn remove(&self, kind: &str) -> Option<(u64, u64)> {
        let _cuda = crate::bridge::keep_callers_context();
        self.table.lock().unwrap_or_else(|p| p.into_inner()).remove(kind).map(|r| (r.start, r.count))
    }

    /// Every kind with its `(start, count)`.
    fn items(&self) -> Vec<(String, (u64, u64))> {
        let _cuda = crate::bridge::keep_callers_context();
        let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.kinds().map(|(k, r)| (k.to_string(), (r.start, r.count))).collect()
    }

    /// The device LBA of block `index` of `kind`, checking `count` blocks from there stay inside it.
    fn resolve(&self, kind: &str, index: u64, count: u64) -> PyResult<u64> {
        let _cuda = crate::bridge::keep_callers_context();
        self.table.lock().unwrap_or_else(|p| p.into_inner()).resolve(kind, index, count).map_err(to_py)
    }
}

/// Each layer's `(bytes, [slot offsets])`, and the slot size.
type Plan = (Vec<(u64, Vec<u64>)>, u64);

/// A layer streamer over caller-allocated slots.
#[pyclass(module = "weightlift._native", frozen)]
#[derive(Debug)]
pub struct NativeLayerStreamer {
    // Dropped first: stopping the streamer waits for its reader before the slots below may be freed.
    streamer: Mutex<LayerStreamer>,
    device: Device,
    /// The Python objects owning the slots, kept alive as long as the streamer.
    _slots_owner: Py<PyAny>,
}

impl Drop for NativeLayerStreamer {
    /// Stops the reader without the GIL: the lanes it waits for may need the GIL to go on (another load's blocks
    /// come from torch's allocator).
    fn drop(&mut self) {
        let _cuda = crate::bridge::keep_callers_context();
        let s = self.streamer.get_mut().unwrap_or_else(|p| p.into_inner());
        if Python::try_attach(|py| py.detach(|| s.shutdown())).is_none() {
            s.shutdown();
        }
    }
}

#[pymethods]
impl NativeLayerStreamer {
    /// Plans `layers` (lists of positions in the checkpoint): returns each layer's `(bytes, [slot offsets])` and
    /// the slot size they need.
    #[staticmethod]
    fn plan(ckpt: &Checkpoint, layers: Vec<Vec<usize>>) -> PyResult<Plan> {
        let _cuda = crate::bridge::keep_callers_context();
        let (layouts, slot_bytes) = weightlift::layers::plan_layers(ckpt.index()?, &layers).map_err(to_py)?;
        Ok((layouts.into_iter().map(|l| (l.bytes, l.offsets)).collect(), slot_bytes))
    }

    /// A streamer filling the slots at addresses `slots` (each `slot_bytes` long, memory of `device`), owned by
    /// `owner` (e.g. the list of slot tensors), which the streamer keeps alive.
    #[new]
    #[allow(clippy::too_many_arguments)] // the Python constructor's arguments
    fn new(
        py: Python<'_>,
        engine: &NativeEngine,
        ckpt: &Checkpoint,
        layers: Vec<Vec<usize>>,
        device: &str,
        slots: Vec<usize>,
        slot_bytes: u64,
        owner: Py<PyAny>,
    ) -> PyResult<Self> {
        let _cuda = crate::bridge::keep_callers_context();
        let device = parse_device(device)?;
        let (layouts, _) = weightlift::layers::plan_layers(ckpt.index()?, &layers).map_err(to_py)?;
        let dests = slots.iter().map(|&p| raw_dest(&device.to_string(), p)).collect::<PyResult<Vec<RawDest>>>()?;
        let (engine, index) = (engine.engine.clone(), ckpt.index()?.clone());
        let dests = SendPtr(dests);
        let streamer = py
            .detach(move || {
                let dests = dests;
                // SAFETY: the Python side allocated each slot as a tensor of `slot_bytes` bytes on `device`; `owner`
                // (kept by this object, dropped after the streamer) keeps them alive, and nothing else writes them.
                unsafe { LayerStreamer::with_slots(engine, &index, layouts, dests.0, slot_bytes, device) }
            })
            .map_err(to_py)?;
        Ok(NativeLayerStreamer { streamer: Mutex::new(streamer), device, _slots_owner: owner })
    }

    /// Waits for layer `layer` (prefetching the next ones) and returns its slot. `stream`: the CUDA stream the
    /// caller computes on (its work so far must finish before the previous layer's slot is refilled).
    #[pyo3(signature = (layer, stream=None))]
    fn load_layer(&self, py: Python<'_>, layer: usize, stream: Option<usize>) -> PyResult<usize> {
        let _cuda = crate::bridge::keep_callers_context();
        let stream = SendPtr(stream);
        let device = self.device;
        py.detach(|| {
            let stream = stream;
            let mut s = self.streamer.lock().unwrap_or_else(|p| p.into_inner());
            let view = match (stream.0, device) {
                (Some(h), Device::Cuda(_)) => {
                    // SAFETY: the Python side passes the handle of a live stream of the streamer's device (torch's
                    // current stream there).
                    unsafe { s.load_layer_after(layer, h as weightlift::cuda::CUstream) }
                }
                _ => s.load_layer(layer),
            };
            view.map(|v| v.slot)
        })
        .map_err(to_py)
    }

    /// `(loads, bytes, load_secs, wait_secs, requests, ready_hits)`.
    fn stats(&self) -> (u64, u64, f64, f64, u64, u64) {
        let _cuda = crate::bridge::keep_callers_context();
        let s = self.streamer.lock().unwrap_or_else(|p| p.into_inner()).stats();
        (s.loads, s.bytes, s.load_secs, s.wait_secs, s.requests, s.ready_hits)
    }
}
