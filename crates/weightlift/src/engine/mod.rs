//! The engine and its lifetime: settings, persistent I/O lanes, open files, devices and the GPU path of each. Every
//! public way of reading and writing goes through it, in a file by what a reader looks for:
//!
//! - [`load`]: whole loads into memory the engine allocates (a checkpoint, some of its tensors, byte ranges as
//!   tensors), with their checksums checked as the bytes land;
//! - [`read`]: byte ranges into caller memory (host or device), through one request type, [`ReadRequest`];
//! - [`write`]: host or device memory into a file.
//!
//! Packed checkpoints (`crate::packed`), streams (`crate::stream`) and reads by LBA (`crate::block`) build on these.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use weightlift_cuda::Gpu;
use weightlift_format::{SourceFile, TensorIndex};
use weightlift_io::{DirectMode, HostCache, IoEngine, IoReport, LoadOptions, OpenFile, StagingPool};

use crate::device::Device;
use crate::error::Result;
use crate::files::FileCache;
use crate::path::{LoadOpts, PathOutcome, ResolvedPath};
use crate::report::Report;
use crate::settings::Settings;

mod load;
mod pool_cache;
pub(crate) mod read;
mod write;

/// Loads checkpoints. Keeps its I/O lanes (threads, rings, pinned staging), open files, devices and their data
/// paths between loads, so that a load pays for none of them again. Share it between threads: loads run
/// concurrently on the same lanes.
pub struct Engine {
    settings: Settings,
    io: IoEngine,
    host_cache: Arc<HostCache>,
    files: FileCache,
    gpus: Mutex<HashMap<u32, Gpu>>,
    paths: Mutex<HashMap<u32, Arc<ResolvedPath>>>,
    write_pool: Mutex<StagingPool>,
    /// GPU decoders of packed loads, one per GPU, kept between loads (their kernels are compiled once).
    unpackers: Mutex<HashMap<u32, weightlift_cuda::unpack::GpuUnpacker>>,
    /// The GPUs whose default pool this engine asked to keep freed memory (`device_cache_bytes`).
    pool_caches: Mutex<Vec<Gpu>>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The caller's thread keeps its device: what goes with the engine (its devices' streams, events and
        // contexts, its GPU decoders' kernels) binds their contexts as it goes. Dropped here, under the guard.
        let _restore = weightlift_cuda::ContextRestore::save();
        lock(&self.unpackers).clear();
        lock(&self.paths).clear();
        let keep = self.settings.device_cache_bytes.value;
        for g in lock(&self.pool_caches).drain(..) {
            if let Err(e) = pool_cache::leave(&g, keep) {
                tracing::warn!("putting back cuda:{}'s pool release threshold: {e}", g.ordinal());
            }
        }
        lock(&self.gpus).clear();
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("io", &self.io).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Engine {
    /// Makes an engine (its I/O lanes start with its first read or staging set-up).
    pub fn new(settings: Settings) -> Result<Engine> {
        settings.validate()?;
        let io = IoEngine::new(settings.io_params(), settings.backend_origin())?;
        weightlift_remote::configure(settings.remote_config());
        Ok(Engine {
            host_cache: HostCache::new(settings.host_cache_bytes.value, settings.host_pages.value),
            settings,
            io,
            files: FileCache::default(),
            gpus: Mutex::new(HashMap::new()),
            paths: Mutex::new(HashMap::new()),
            write_pool: Mutex::new(StagingPool::new()),
            unpackers: Mutex::new(HashMap::new()),
            pool_caches: Mutex::new(Vec::new()),
        })
    }

    /// The settings the engine was built with, each with its source.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The storage engine (for callers building their own sinks).
    pub fn io(&self) -> &IoEngine {
        &self.io
    }

    /// Device `n`, opened on first use (its primary context, shared with PyTorch and the CUDA runtime).
    pub fn gpu(&self, n: u32) -> Result<Gpu> {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        let mut gpus = lock(&self.gpus);
        if let Some(g) = gpus.get(&n) {
            return Ok(g.clone());
        }
        let g = Gpu::open(n)?;
        let keep = self.settings.device_cache_bytes.value;
        if keep > 0 {
            pool_cache::join(&g, keep)?;
            lock(&self.pool_caches).push(g.clone());
        }
        gpus.insert(n, g.clone());
        Ok(g)
    }

    /// The data path serving device `n`, decided on first use (see `path::decide`).
    pub fn gpu_path(&self, n: u32) -> Result<Arc<ResolvedPath>> {
        if let Some(p) = lock(&self.paths).get(&n) {
            return Ok(p.clone());
        }
        let p = Arc::new(crate::path::resolve(&self.settings)?);
        lock(&self.paths).entry(n).or_insert_with(|| p.clone());
        Ok(p)
    }

    /// Frees the lanes' staging memory, the freed host buffers kept for reuse and the GPU decoders' scratch memory
    /// (packed loads), returns the freed device memory the driver's pool keeps (`device_cache_bytes`), and closes
    /// cached files.
    pub fn release_memory(&self) {
        let _restore = weightlift_cuda::ContextRestore::save(); // dropping the decoders' kernels binds their context
        lock(&self.unpackers).clear();
        self.io.release_staging();
        self.host_cache.clear();
        lock(&self.write_pool).release();
        self.files.clear();
        if self.settings.device_cache_bytes.value > 0 {
            let gpus: Vec<Gpu> = lock(&self.pool_caches).clone();
            // On a thread of its own: binding a device's context here would change the caller's current device.
            std::thread::scope(|s| {
                s.spawn(|| {
                    for g in &gpus {
                        // Frees still queued on streams return to the pool only once they ran.
                        if let Err(e) = g.bind().and_then(|()| g.synchronize()).and_then(|()| g.trim_freed_memory()) {
                            tracing::warn!("returning the device pool's freed memory: {e}");
                        }
                    }
                });
            });
        }
    }

    fn want_direct(&self) -> bool {
        self.settings.direct.value != DirectMode::Never
    }

    pub(crate) fn open(&self, path: &Path) -> Result<Arc<OpenFile>> {
        let location = weightlift_remote::Location::new(path).map_err(weightlift_io::IoError::Remote)?;
        self.files.open(&location, self.want_direct())
    }

    /// `path` opened for reads by LBA: a regular file or a block device.
    pub(crate) fn open_device(&self, path: &Path) -> Result<Arc<OpenFile>> {
        self.files.open_device(path, self.want_direct())
    }

    /// The index's files; an object with a valid local copy (`remote_cache_dir`) is read from it.
    pub(crate) fn open_index(&self, index: &TensorIndex) -> Result<Vec<Arc<OpenFile>>> {
        self.open_files_writing(&index.files, &[])
    }

    /// Files as an index describes them (see [`Engine::open_index`]), writing a local copy of each object of file
    /// `i` where `fill[i]` (and `remote_cache_dir` is set) that has no valid copy yet.
    fn open_files_writing(&self, files: &[SourceFile], fill: &[bool]) -> Result<Vec<Arc<OpenFile>>> {
        let dir = self.settings.remote_cache_dir.value.0.as_deref();
        self.files.open_index(files, self.want_direct(), dir.map(|d| (d, fill)))
    }

    /// Freed host buffers kept for reuse by this engine's host loads.
    pub fn host_cache(&self) -> &Arc<HostCache> {
        &self.host_cache
    }

    pub(crate) fn unpackers(&self) -> &Mutex<HashMap<u32, weightlift_cuda::unpack::GpuUnpacker>> {
        &self.unpackers
    }

    pub(crate) fn report(
        &self,
        device: Device,
        files: Vec<PathBuf>,
        tensors: usize,
        bytes: u64,
        io: IoReport,
    ) -> Report {
        let mut r = Report::new(device, &files, tensors, bytes, io);
        r.settings = self.settings.describe();
        r
    }

    fn device_report(
        &self,
        device: Device,
        gpu: &Gpu,
        path: &ResolvedPath,
        outcome: PathOutcome,
        tensors: usize,
        bytes: u64,
    ) -> Report {
        let mut report = self.report(device, Vec::new(), tensors, bytes, outcome.io);
        report.path = outcome.path;
        report.path_reason = match &report.path {
            crate::report::PathUsed::Pipeline(_) => format!("{}; {}", report.io.read_engine_reason, path.reason),
            _ => path.reason.clone(),
        };
        report.copy_span_secs = outcome.copy_span_secs;
        report.nvme = outcome.nvme;
        report.gpu = Some(gpu.info().clone());
        report
    }
}

/// The end of a read that may have written local copies of objects: each is published only once the read succeeded
/// (a failure to publish is a warning: the read has its bytes); a failed read's copies go now, its reads still in
/// flight keeping the files (and the copies) alive a little longer.
fn settle_copies<T>(files: &[Arc<OpenFile>], read: Result<T>) -> Result<T> {
    let copies = files.iter().filter_map(|f| f.filling());
    match read {
        Ok(r) => {
            copies.for_each(|c| {
                c.publish();
            });
            Ok(r)
        }
        Err(e) => {
            copies.for_each(|c| c.abandon());
            Err(e)
        }
    }
}

fn io_opts<'a>(opts: &LoadOpts<'a>) -> LoadOptions<'a> {
    LoadOptions { progress: opts.progress, cancel: opts.cancel, faults: opts.faults, pinner: None }
}
