//! How bytes reach GPU memory. Each data path is one implementation of `GpuPath`; which one serves a device is
//! decided once per engine and device by `resolve` (the only place that weighs them), with its reason and what
//! deciding cost. Every entry point that reads into device memory — whole loads, byte ranges, `Engine::read`, the
//! cuFile-style session — goes through the resolved path.
//!
//! ```text
//!            Engine::{load, load_ranges, read, read_at}, cufile_api::Session
//!                                   │  DeviceRead { files, extents → Targets }
//!                                   ▼
//!                          resolve(settings) ─ once per device ─▶ ResolvedPath { kind, reason }
//!              ┌────────────────────┼─────────────────────────┐
//!          Pipeline               Cufile                   NvmeSim
//!   io_uring/pread lanes →    cuFileRead per chunk     GPU kernels drive NVMe
//!   pinned slots → async      (peer-to-peer where      queues of the software
//!   H2D copies per lane       nvidia-fs runs)          controller
//! ```

mod cufile;
mod gpu_path;
mod nvme_sim;
mod pipeline;

pub(crate) use gpu_path::{DeviceRead, GpuPath, PathOutcome};

use std::time::Instant;

use weightlift_io::Extent;

use crate::error::{Error, Result};
pub use crate::opts::LoadOpts;
use crate::settings::{Backend, Settings};
use pipeline::Pipeline;

/// The path serving one device of an engine, decided once.
pub struct ResolvedPath {
    /// The path chosen.
    pub kind: PathKind,
    /// Why it was chosen, for reports.
    pub reason: String,
    /// What deciding cost (loading cuFile, where it was considered).
    pub resolve_secs: f64,
    pub(crate) imp: Box<dyn GpuPath>,
}

impl ResolvedPath {
    /// Refuses a read of objects on a path that reads local files only (objects are read through the pinned
    /// pipeline).
    pub(crate) fn refuse_objects(&self, files: &[std::sync::Arc<weightlift_io::OpenFile>]) -> Result<()> {
        match files.iter().find(|f| f.object().is_some()) {
            Some(object) if self.kind != PathKind::Pipeline => Err(Error::InvalidArgument(format!(
                "{}: objects are read through the pinned pipeline; the {:?} path ({}) reads local files only",
                object.path.display(),
                self.kind,
                self.reason
            ))),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Debug for ResolvedPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedPath").field("kind", &self.kind).field("reason", &self.reason).finish()
    }
}

/// Which path, as decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// weightlift's own: io_uring reads into pinned staging, then asynchronous copies.
    Pipeline,
    /// NVIDIA's cuFile (GPUDirect Storage): the file read straight into GPU memory.
    Cufile,
    /// GPU-initiated NVMe queues, against the software controller.
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
                crate::error::cufile_requested_but(e, &format!("cuFile was requested (backend gds, by {origin}) but is unavailable"))
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
        (PathKind::Cufile, Some(cf)) => Box::new(cufile::CufilePath::new(cf)),
        (PathKind::NvmeSim, _) => Box::new(nvme_sim::NvmePath),
        _ => Box::new(Pipeline),
    };
    let resolve_secs = t.elapsed().as_secs_f64();
    tracing::debug!(secs = resolve_secs, "data path decided");
    Ok(ResolvedPath { kind, reason, resolve_secs, imp })
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
