//! How bytes reach GPU memory. Each data path is one implementation of [`GpuPath`]; which one serves a device is
//! decided once per engine and device by [`resolve`] (the only place that weighs them), with its reason and what
//! deciding cost. Every entry point that reads into device memory — whole loads, byte ranges, `read_into`, the
//! cuFile-style session — goes through the resolved path.
//!
//! ```text
//!            Engine::{load, load_ranges, read_into, read_ranges_into}, cufile_api::Session
//!                                   │  DeviceRead { files, extents → Targets }
//!                                   ▼
//!                          resolve(settings) ─ once per device ─▶ ResolvedPath { kind, reason }
//!              ┌────────────────────┼─────────────────────────┐
//!          Pipeline               Cufile                   NvmeSim
//!   io_uring/pread lanes →    cuFileRead per chunk     GPU kernels drive NVMe
//!   pinned slots → async      (peer-to-peer where      queues of the software
//!   H2D copies per lane       nvidia-fs runs)          controller
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Instant;

use weightlift_cuda::{CudaPinner, DeviceSink, Gpu, Targets};
use weightlift_io::fault::FaultPlan;
use weightlift_io::{Extent, IoEngine, IoReport, LoadOptions, LoadRequest, Observed, OpenFile, Pinner, Sink};

use crate::error::{Error, Result};
use crate::report::PathUsed;
use crate::settings::{Backend, Settings};

/// Per-call options of a load.
#[derive(Debug, Default, Clone, Copy)]
pub struct LoadOpts<'a> {
    /// Incremented with every byte read (for progress bars).
    pub progress: Option<&'a AtomicU64>,
    /// Set to abandon the load (it then fails with a cancellation error, its memory released).
    pub cancel: Option<&'a AtomicBool>,
    /// Injected faults (tests).
    pub faults: Option<&'a FaultPlan>,
    /// Expected checksums: each tensor is hashed as soon as its bytes have landed, overlapped with the rest of the
    /// load, and a mismatch fails the load naming tensor and chunk (`Report::checks` says what was checked).
    pub checks: Option<&'a crate::checked::Checks>,
    /// Device loads of safetensors and GGUF checkpoints: every tensor starts at a device address that is a multiple
    /// of this (a power of two up to 256, what device allocations guarantee), as torch's allocator places tensors
    /// (256 bytes on a GPU), where the default places small neighbours as the file lays them out (their file
    /// offsets mod 256). Small tensors then
    /// share a block only where their offsets from its first tensor are multiples of it, so a file whose tensor
    /// sizes are not multiples of it costs more allocations and copies. Packed loads and host loads ignore it.
    pub tensor_align: Option<u64>,
    /// Device loads of safetensors and GGUF checkpoints (`Engine::load`, `load_some`): their blocks come from this
    /// allocator (a framework's own, so that it accounts for and reuses the memory) instead of the device's
    /// stream-ordered pool. Each block is allocated while the reads run, as from the pool. Other loads ignore it.
    pub device_alloc: Option<&'a dyn weightlift_cuda::DeviceAllocator>,
}

/// A read into device memory, as every path receives it: byte ranges of opened files, each landing in a
/// destination of `targets`.
pub(crate) struct DeviceRead<'a> {
    pub gpu: &'a Gpu,
    pub files: &'a [Arc<OpenFile>],
    pub extents: &'a [Extent],
    pub dest_lens: &'a [u64],
    pub targets: &'a Arc<Targets>,
    pub opts: &'a LoadOpts<'a>,
    /// Told about every landing (paths with lanes call it; the others land everything before returning).
    pub observer: Option<&'a weightlift_io::Observer<'a>>,
}

/// What a path did.
pub(crate) struct PathOutcome {
    pub path: PathUsed,
    pub io: IoReport,
    pub copy_span_secs: Option<f64>,
    pub nvme: Option<crate::nvme_sim::NvmeStats>,
    /// Where a load server was set: whether it served the read, and why not (see `Report::server`).
    pub server: Option<serde_json::Value>,
}

/// One data path into GPU memory.
pub(crate) trait GpuPath: Send + Sync {
    /// Reads every extent into its destination. `allocate` publishes the destinations into `req.targets`: the path
    /// calls it exactly once, as soon as it can overlap the allocations with its own work (the pipeline: right
    /// after its reads started; the others: first).
    fn read(
        &self,
        io: &IoEngine,
        req: &DeviceRead<'_>,
        allocate: &mut dyn FnMut() -> Result<()>,
    ) -> Result<PathOutcome>;
}

/// The path serving one device of an engine, decided once.
pub struct ResolvedPath {
    pub kind: PathKind,
    pub reason: String,
    /// What deciding cost (loading cuFile, where it was considered).
    pub resolve_secs: f64,
    pub(crate) imp: Box<dyn GpuPath>,
}

impl std::fmt::Debug for ResolvedPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedPath").field("kind", &self.kind).field("reason", &self.reason).finish()
    }
}

/// Which path, as decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    Pipeline,
    Cufile,
    NvmeSim,
}

/// Decides the GPU path from the settings, with the reason (for reports, `weightlift probe` and the bench alike).
/// Under `auto`, cuFile is not even loaded unless the platform can run it peer-to-peer (nvidia-fs present): in
/// compat mode it reads through host bounce buffers that the pipeline outruns, and loading it costs ~0.4 s.
pub fn decide(settings: &Settings) -> Result<(PathKind, String, Option<weightlift_cuda::cufile::Cufile>)> {
    let origin = settings.backend_origin();
    let lib = settings.cufile_lib.value.as_deref();
    Ok(match settings.backend.value {
        Backend::Gds => {
            let cf = weightlift_cuda::cufile::driver(lib).map_err(|e| {
                crate::cufile_api::requested_but(e, &format!("cuFile was requested (backend gds, by {origin}) but is unavailable"))
            })?;
            let mode = match &cf.mode {
                weightlift_cuda::cufile::CufileMode::PeerToPeer(m) => format!("peer-to-peer via {m}"),
                weightlift_cuda::cufile::CufileMode::Compat(m) => format!("compat mode: {m}"),
            };
            (PathKind::Cufile, format!("cuFile ({}) chosen by {origin}, {mode}", cf.library), Some(cf))
        }
        Backend::NvmeSim => (
            PathKind::NvmeSim,
            format!("GPU-initiated NVMe against weightlift's software controller, chosen by {origin}"),
            None,
        ),
        Backend::Uring | Backend::Pread => {
            (PathKind::Pipeline, format!("the pinned pipeline, {} chosen by {origin}", settings.backend.value), None)
        }
        Backend::Auto => match weightlift_cuda::cufile::platform_peer_to_peer() {
            None => (
                PathKind::Pipeline,
                "the pinned pipeline: no peer-to-peer path for cuFile here (/proc/driver/nvidia-fs absent), so cuFile was not loaded".into(),
                None,
            ),
            Some(p2p) => match weightlift_cuda::cufile::driver(lib) {
                Ok(cf) if cf.is_peer_to_peer() => {
                    (PathKind::Cufile, format!("cuFile ({}) runs peer-to-peer here ({p2p})", cf.library), Some(cf))
                }
                Ok(_) => (PathKind::Pipeline, "the pinned pipeline: cuFile opened in compat mode".into(), None),
                Err(e) => (PathKind::Pipeline, format!("the pinned pipeline: {p2p} present but cuFile unusable ({e})"), None),
            },
        },
    })
}

/// Resolves the path for a device: decides, and builds its implementation.
pub(crate) fn resolve(settings: &Settings) -> Result<ResolvedPath> {
    let t = Instant::now();
    let (kind, reason, cufile) = decide(settings)?;
    let imp: Box<dyn GpuPath> = match (kind, cufile) {
        (PathKind::Cufile, Some(cf)) => Box::new(crate::gds::CufilePath::new(cf)),
        (PathKind::NvmeSim, _) => Box::new(crate::nvme_sim::NvmePath),
        _ => Box::new(Pipeline),
    };
    // A load server takes the reads it can serve; the path decided above takes the others.
    // (Only in front of the pipeline: cuFile peer-to-peer and the NVMe simulator are not the server's to replace.)
    let imp: Box<dyn GpuPath> = match (kind, settings.server.value.socket()) {
        (PathKind::Pipeline, Some(socket)) => Box::new(crate::server::ServerPath { socket, local: imp }),
        _ => imp,
    };
    let resolve_secs = t.elapsed().as_secs_f64();
    tracing::debug!(secs = resolve_secs, "data path decided");
    Ok(ResolvedPath { kind, reason, resolve_secs, imp })
}

/// weightlift's pipeline: the engine's lanes read into pinned staging slots and copy each completed read to the
/// device on the lane's stream, overlapped with the next reads.
pub(crate) struct Pipeline;

impl GpuPath for Pipeline {
    fn read(
        &self,
        io: &IoEngine,
        req: &DeviceRead<'_>,
        allocate: &mut dyn FnMut() -> Result<()>,
    ) -> Result<PathOutcome> {
        let sink = DeviceSink::new(req.gpu, req.targets.clone(), io.lanes());
        let pinner: Arc<dyn Pinner> = Arc::new(CudaPinner::new(req.gpu));
        let opts = LoadOptions {
            progress: req.opts.progress,
            cancel: req.opts.cancel,
            faults: req.opts.faults,
            pinner: Some(pinner),
        };
        let lreq = LoadRequest { files: req.files, extents: req.extents, dest_lens: req.dest_lens };
        let mut allocated = Ok(());
        let observed = req.observer.map(|observer| Observed { inner: &sink, observer });
        let target: &dyn Sink = match &observed {
            Some(o) => o,
            None => &sink,
        };
        let loaded = io.load_with(&lreq, &opts, target, || {
            allocated = allocate();
            if let Err(e) = &allocated {
                req.targets.fail(format!("allocating the destinations failed: {e}"));
            }
        });
        // An allocation failure makes the lanes fail too; the allocation's own error is the one to report.
        allocated?;
        let io_report = loaded?;
        let path = PathUsed::Pipeline(io_report.read_engine);
        Ok(PathOutcome { path, io: io_report, copy_span_secs: Some(sink.copy_span_secs()), nvme: None, server: None })
    }
}

/// Fails with `Error::InvalidArgument` unless every extent lands inside its destination.
pub(crate) fn check_extents(extents: &[Extent], dest_lens: &[u64]) -> Result<()> {
    for e in extents {
        let cap = dest_lens.get(e.dest as usize).copied().unwrap_or(0);
        if e.dest_offset.checked_add(e.len).is_none_or(|end| end > cap) {
            return Err(Error::InvalidArgument(format!(
                "{} bytes at offset {} do not fit destination {} of {cap} bytes",
                e.len, e.dest_offset, e.dest
            )));
        }
    }
    Ok(())
}
