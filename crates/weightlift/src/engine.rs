//! The engine: settings, persistent I/O lanes, open files, devices and the GPU path of each; every public way of
//! reading (whole checkpoints, tensors, byte ranges, caller memory) and writing goes through here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use weightlift_cuda::{DeviceBuffer, Gpu, PinnedBuffer, Targets};
use weightlift_format::{DType, SourceFile, TensorEntry, TensorIndex};
use weightlift_io::{
    DirectMode, Extent, HostBuffer, HostCache, HostSink, IoEngine, IoReport, LoadOptions, LoadRequest, Observed,
    OpenFile, StagingPool,
};

use crate::checked::{Checks, CpuChecker, GpuChecker, HostDest, Layout, Watch};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::files::FileCache;
use crate::path::{DeviceRead, LoadOpts, PathKind, PathOutcome, ResolvedPath};
use crate::placement;
use crate::report::{CheckStats, NetworkStats, Report};
use crate::settings::Settings;
use crate::tensor::{DeviceTensor, Loaded, RawDest, RawSrc, Tensor, TensorData};

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

/// The default pool of a device is the process's, shared by every engine (and other libraries): its release
/// threshold is kept at the largest `device_cache_bytes` of the engines alive that asked for one (never below what
/// it was before the first of them), and put back as it was when the last of them goes.
mod pool_cache {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use weightlift_cuda::{CudaError, Gpu};

    /// A device's threshold before any engine changed it, and the values of the engines alive that asked.
    struct Asked {
        original: u64,
        keeps: Vec<u64>,
    }

    impl Asked {
        fn threshold(&self) -> u64 {
            self.keeps.iter().copied().fold(self.original, u64::max)
        }
    }

    static CACHES: Mutex<Option<HashMap<u32, Asked>>> = Mutex::new(None);

    pub(super) fn join(g: &Gpu, keep: u64) -> Result<(), CudaError> {
        let mut all = CACHES.lock().unwrap_or_else(|p| p.into_inner());
        let map = all.get_or_insert_with(HashMap::new);
        let original = match map.get(&g.ordinal()) {
            Some(a) => a.original,
            None => g.freed_memory_kept()?,
        };
        let asked = map.entry(g.ordinal()).or_insert(Asked { original, keeps: Vec::new() });
        asked.keeps.push(keep);
        g.keep_freed_memory(asked.threshold())
    }

    pub(super) fn leave(g: &Gpu, keep: u64) -> Result<(), CudaError> {
        let mut all = CACHES.lock().unwrap_or_else(|p| p.into_inner());
        let Some(map) = all.as_mut() else { return Ok(()) };
        let Some(asked) = map.get_mut(&g.ordinal()) else { return Ok(()) };
        if let Some(i) = asked.keeps.iter().position(|&k| k == keep) {
            asked.keeps.swap_remove(i);
        }
        let value = asked.threshold();
        if asked.keeps.is_empty() {
            map.remove(&g.ordinal());
        }
        g.keep_freed_memory(value)
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

/// Device allocations are published to the lanes in batches that grow from one block to this many bytes: the
/// first reads find their destination at once, later ones cost few events.
const MAX_PUBLISH_BYTES: u64 = 256 << 20;

impl Engine {
    /// Starts an engine (its I/O lanes start now).
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

    /// Loads every tensor of `index` onto `device`.
    pub fn load(&self, index: &TensorIndex, device: Device, opts: &LoadOpts<'_>) -> Result<Loaded> {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        let all: Vec<usize> = (0..index.tensors.len()).collect();
        self.load_some(index, &all, device, opts)
    }

    /// Loads the tensors of `index` at positions `which` (in that order).
    pub fn load_some(
        &self,
        index: &TensorIndex,
        which: &[usize],
        device: Device,
        opts: &LoadOpts<'_>,
    ) -> Result<Loaded> {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        let start = Instant::now();
        let entries: Vec<&TensorEntry> = which
            .iter()
            .map(|&i| index.tensors.get(i).ok_or_else(|| Error::InvalidArgument(format!("no tensor at position {i}"))))
            .collect::<Result<_>>()?;
        // Checked whatever the destination (host loads ignore it), before any file or device is opened.
        if let Some(a) = opts.tensor_align.filter(|&a| !a.is_power_of_two() || a > placement::DEVICE_ALIGN) {
            return Err(Error::InvalidArgument(format!(
                "tensor_align {a}: expected a power of two up to {}",
                placement::DEVICE_ALIGN
            )));
        }
        let names = match opts.checks {
            Some(checks) => check_names(checks, index, &entries)?,
            None => Vec::new(),
        };
        let files = self.open_files_writing(&index.files, &whole_files(index, which))?;
        let before = NetworkStats::before(&files);
        let loaded = match device {
            Device::Cpu | Device::PinnedCpu => self.load_host(&files, &entries, device, opts, names),
            Device::Cuda(n) => self.load_device(n, &files, &entries, opts, names),
        };
        let (datas, mut report) = settle_copies(&files, loaded)?;
        let tensors: Vec<Tensor> = entries
            .iter()
            .zip(datas)
            .map(|(t, data)| Tensor { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone(), data })
            .collect();
        report.files = index.files.iter().map(|f| f.path.clone()).collect();
        report.network = NetworkStats::of(&files, &before, Some(&report.io));
        report.seconds = start.elapsed().as_secs_f64();
        Ok(Loaded { tensors, report })
    }

    /// Host destinations (plain or pinned), filled by the lanes (buffered reads land in place).
    fn load_host(
        &self,
        files: &[Arc<OpenFile>],
        entries: &[&TensorEntry],
        device: Device,
        opts: &LoadOpts<'_>,
        names: Vec<(String, PathBuf)>,
    ) -> Result<(Vec<TensorData>, Report)> {
        let dest_lens: Vec<u64> = entries.iter().map(|t| t.nbytes).collect();
        let extents = extents_of(entries);
        let t = Instant::now();
        let pinned = device == Device::PinnedCpu;
        let gpu = if pinned { Some(self.gpu(0)?) } else { None };
        let mut datas: Vec<TensorData> = dest_lens
            .iter()
            .map(|&n| match &gpu {
                Some(g) => Ok(TensorData::Pinned(PinnedBuffer::alloc(g, n as usize)?)),
                None => Ok(TensorData::Host(HostBuffer::new(n as usize, Some(&self.host_cache))?)),
            })
            .collect::<Result<_>>()?;
        let alloc_secs = t.elapsed().as_secs_f64();
        let dests: Vec<(*mut u8, usize)> = datas.iter_mut().map(host_range).collect();
        // SAFETY: each range is a distinct buffer of `datas`, which stays alive and untouched until the load below
        // has returned.
        let sink = unsafe { HostSink::new(dests.clone()) };
        let req = LoadRequest { files, extents: &extents, dest_lens: &dest_lens };
        let Some(checks) = opts.checks else {
            let io = self.io.load(&req, &io_opts(opts), &sink)?;
            let mut report = self.report(device, Vec::new(), entries.len(), dest_lens.iter().sum(), io);
            report.alloc_secs = alloc_secs;
            return Ok((datas, report));
        };
        // Each tensor is hashed on a thread of its own as soon as it has landed.
        let parts = (0..entries.len()).map(|i| vec![(i, 0)]).collect();
        let host = dests.iter().map(|&(ptr, len)| HostDest { ptr, len }).collect();
        let mut checker = CpuChecker::new(Layout { checks, parts, names }, host, "cpu".into());
        let (watch, rx) = Watch::new(dest_lens.clone());
        let observer = |p: &[weightlift_io::Piece]| watch.observe(p);
        let observed = Observed { inner: &sink, observer: &observer };
        let (io, read_end) = std::thread::scope(|scope| {
            let c = &mut checker;
            let hashing = scope.spawn(move || c.run(&rx));
            let closing = CloseOnDrop(&watch);
            let io = self.io.load(&req, &io_opts(opts), &observed);
            let read_end = Instant::now();
            drop(closing);
            let joined = hashing.join().map_err(|_| Error::Verify("the checking thread panicked".into()));
            joined.and(io.map_err(Error::from)).map(|io| (io, read_end))
        })?;
        let stats = checker.finish(read_end)?;
        let mut report = self.report(device, Vec::new(), entries.len(), dest_lens.iter().sum(), io);
        report.alloc_secs = alloc_secs;
        report.checks = Some(stats);
        Ok((datas, report))
    }

    /// Device destinations: small neighbours share blocks that mirror the file; blocks are allocated while the
    /// reads already run, and published to the lanes as they come.
    fn load_device(
        &self,
        n: u32,
        files: &[Arc<OpenFile>],
        entries: &[&TensorEntry],
        opts: &LoadOpts<'_>,
        names: Vec<(String, PathBuf)>,
    ) -> Result<(Vec<TensorData>, Report)> {
        tracing::debug!(device = n, "device load called");
        let gpu = self.gpu(n)?;
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        gpu.bind()?;
        let path = self.gpu_path(n)?;
        if let Some(object) = files.iter().find(|f| f.object().is_some()).filter(|_| path.kind != PathKind::Pipeline) {
            return Err(Error::InvalidArgument(format!(
                "{}: objects are read through the pinned pipeline; the {:?} path ({}) reads local files only",
                object.path.display(),
                path.kind,
                path.reason
            )));
        }
        // Every lane's stream and the allocation's, made now: made by the lanes as they start, beside their pinning
        // and the allocation, 17 took 9.2 ms of a first load on the H100, against 0.7 ms made together before
        // (bench/results/2026-11-25-h100-zc at b3a4ec8). Nothing to do once made.
        gpu.stream(self.io.lanes())?;
        tracing::debug!(device = n, "device and data path ready");
        let placement = placement::pack_aligned(entries, opts.tensor_align);
        let block_extents: Vec<Extent> = placement
            .blocks
            .iter()
            .enumerate()
            .map(|(i, b)| Extent { file: b.file as u32, offset: b.start, len: b.len, dest: i as u32, dest_offset: 0 })
            .collect();
        let block_lens: Vec<u64> = placement.blocks.iter().map(|b| b.len).collect();
        let targets = Targets::lazy(block_lens.len());
        let mut blocks: Vec<DeviceBuffer> = Vec::with_capacity(block_lens.len());
        let mut alloc_secs = 0.0;
        // With expected checksums, a checker hashes each block on the GPU as soon as it has landed (a watch counts
        // what landed); loads without them build neither.
        let mut checker = opts.checks.map(|checks| {
            let mut parts: Vec<Vec<(usize, u64)>> = vec![Vec::new(); block_lens.len()];
            for (i, &(b, offset)) in placement.tensors.iter().enumerate() {
                parts[b].push((i, offset));
            }
            self.gpu_checker(&gpu, Layout { checks, parts, names })
        });
        let (watch, rx) = match checker {
            Some(Ok(_)) => {
                let (w, rx) = Watch::new(block_lens.clone());
                (Some(w), Some(rx))
            }
            _ => (None, None),
        };
        let observer = |p: &[weightlift_io::Piece]| watch.iter().for_each(|w| w.observe(p));
        let read = DeviceRead {
            gpu: &gpu,
            files,
            extents: &block_extents,
            dest_lens: &block_lens,
            targets: &targets,
            opts,
            observer: watch.is_some().then_some(&observer as _),
        };
        let outcome = std::thread::scope(|scope| {
            let hashing = match (&mut checker, rx) {
                (Some(Ok(c)), Some(rx)) => {
                    let address = |d: usize| targets.wait(d as u32).ok().map(|(ptr, _, _)| ptr);
                    Some(scope.spawn(move || c.run(&rx, &address)))
                }
                _ => None,
            };
            let closing = watch.as_ref().map(CloseOnDrop);
            tracing::debug!(blocks = block_lens.len(), "device load starts");
            let outcome = path.imp.read(&self.io, &read, &mut || {
                let t = Instant::now();
                tracing::debug!("allocating");
                let r =
                    allocate_published(&gpu, &block_lens, &targets, self.io.lanes(), opts.device_alloc, &mut blocks);
                alloc_secs = t.elapsed().as_secs_f64();
                tracing::debug!(secs = alloc_secs, "allocated");
                r
            });
            let read_end = Instant::now();
            drop(closing);
            let joined = match hashing {
                Some(h) => h.join().map_err(|_| Error::Verify("the checking thread panicked".into())),
                None => Ok(()),
            };
            joined.and(outcome).map(|o| (o, read_end))
        });
        // On failure the checker (and the hashing it queued) goes before the blocks it reads. Neither a free
        // ordered on the legacy stream (the pool's) nor memory given back to another allocator waits for copies
        // still in flight on the lanes' streams, which are non-blocking: those streams finish them first.
        let (outcome, read_end) = match outcome {
            Err(e) => {
                let quiet = (0..=self.io.lanes()).try_for_each(|i| {
                    gpu.stream(i)?.synchronize().map_err(|error| weightlift_cuda::CudaError::Driver {
                        device: n,
                        call: "cuStreamSynchronize",
                        error,
                    })
                });
                if let Err(s) = quiet {
                    tracing::warn!("waiting for a failed load's copies before releasing its memory: {s}");
                    std::mem::forget(std::mem::take(&mut blocks)); // leaked rather than reused under a copy
                }
                return Err(e);
            }
            Ok(o) => o,
        };
        let checks = match checker {
            None => None,
            Some(Ok(c)) => {
                let (stats, unpacker) = c.finish(read_end, &|d| blocks.get(d).map(|b| b.device_ptr()))?;
                self.give_unpacker(n, unpacker);
                Some(stats)
            }
            Some(Err((layout, why))) => Some(check_read_back(layout, &blocks, &why)?),
        };
        let blocks: Vec<Arc<DeviceBuffer>> = blocks.into_iter().map(Arc::new).collect();
        let datas = placement
            .tensors
            .iter()
            .zip(entries)
            .map(|(&(b, offset), t)| {
                TensorData::Device(DeviceTensor { block: blocks[b].clone(), offset, len: t.nbytes })
            })
            .collect();
        let bytes = entries.iter().map(|t| t.nbytes).sum();
        let mut report = self.device_report(Device::Cuda(n), &gpu, &path, outcome, entries.len(), bytes);
        report.alloc_secs = alloc_secs;
        report.device_memory = Some(match opts.device_alloc {
            Some(a) => a.name(),
            None => "pool".into(),
        });
        report.checks = checks;
        Ok((datas, report))
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

    /// Loads byte ranges `(file, offset, len)` of `paths` as 1-D byte tensors (named `""`), in the order given,
    /// through one plan.
    pub fn load_ranges(
        &self,
        paths: &[PathBuf],
        ranges: &[(usize, u64, u64)],
        device: Device,
        opts: &LoadOpts<'_>,
    ) -> Result<Loaded> {
        let files = paths.iter().map(|p| raw_source(p)).collect::<Result<Vec<_>>>()?;
        self.load_ranges_of(files, ranges, device, opts)
    }

    /// [`Engine::load_ranges`] over files described already (as a parsed index gives them: an object's ranges are
    /// then read from the version the index was parsed from, or not at all).
    pub fn load_ranges_of(
        &self,
        files: Vec<weightlift_format::SourceFile>,
        ranges: &[(usize, u64, u64)],
        device: Device,
        opts: &LoadOpts<'_>,
    ) -> Result<Loaded> {
        let index = ranges_index(files, ranges)?;
        self.load(&index, device, opts)
    }
}

/// Per file of `index`, whether the tensors at positions `which` are the whole file: all of its tensors, covering
/// at least 15/16 of its bytes past the header (a safetensors file's tensors cover them all; GGUF leaves alignment
/// padding; byte ranges of a raw file may cover little of it). Only such a load writes its local copy
/// (`remote_cache_dir`): the copy is completed with what no GET of the load covered, which for a partial load may
/// be most of the object, so its copy is left to a whole load.
fn whole_files(index: &TensorIndex, which: &[usize]) -> Vec<bool> {
    let n = index.files.len();
    let (mut untaken, mut bytes) = (vec![0usize; n], vec![0u64; n]);
    for t in &index.tensors {
        if let (Some(u), Some(b)) = (untaken.get_mut(t.file), bytes.get_mut(t.file)) {
            *u += 1;
            *b = b.saturating_add(t.nbytes);
        }
    }
    let mut seen = vec![false; index.tensors.len()];
    for &i in which {
        if let (Some(t), Some(false)) = (index.tensors.get(i), seen.get(i).copied()) {
            seen[i] = true;
            if let Some(u) = untaken.get_mut(t.file) {
                *u -= 1;
            }
        }
    }
    index
        .files
        .iter()
        .zip(untaken.iter().zip(&bytes))
        .map(|(f, (&u, &b))| u == 0 && u128::from(b) * 16 >= u128::from(f.len.saturating_sub(f.data_start)) * 15)
        .collect()
}

/// Per file, whether byte ranges `(file, offset, len, ..)` cover at least 15/16 of its bytes past the header: the
/// rule of [`whole_files`] for reads of ranges, where a local copy's completion fetches little.
fn whole_files_of_ranges(files: &[SourceFile], ranges: &[(usize, u64, u64, u32, u64)]) -> Vec<bool> {
    let mut spans: Vec<Vec<(u64, u64)>> = vec![Vec::new(); files.len()];
    for &(file, offset, len, _, _) in ranges {
        if let Some(s) = spans.get_mut(file) {
            s.push((offset, offset.saturating_add(len)));
        }
    }
    files
        .iter()
        .zip(&mut spans)
        .map(|(f, spans)| {
            spans.sort_unstable();
            let (mut covered, mut at) = (0u64, f.data_start);
            for &(start, end) in spans.iter() {
                let (start, end) = (start.max(at), end.min(f.len));
                if end > start {
                    covered += end - start;
                    at = end;
                }
            }
            u128::from(covered) * 16 >= u128::from(f.len.saturating_sub(f.data_start)) * 15
        })
        .collect()
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

/// `path` as a raw source: its length (an object's from the GET that opens it, with its ETag; the object travels
/// on as opened).
fn raw_source(path: &Path) -> Result<weightlift_format::SourceFile> {
    let (len, object) = match weightlift_remote::Location::new(path).map_err(weightlift_io::IoError::Remote)? {
        weightlift_remote::Location::Object(url) => {
            let f = OpenFile::open_object(&url, None)?;
            (f.len, f.object().cloned())
        }
        weightlift_remote::Location::Local(_) => {
            let meta = std::fs::metadata(path)
                .map_err(|cause| Error::Io(weightlift_io::IoError::Open { path: path.to_path_buf(), cause }))?;
            (meta.len(), None)
        }
    };
    let etag = object.as_ref().and_then(|o| o.etag().map(str::to_string));
    Ok(weightlift_format::SourceFile {
        path: path.to_path_buf(),
        format: weightlift_format::Format::Raw,
        len,
        data_start: 0,
        metadata: weightlift_format::Metadata::None,
        gguf_version: None,
        etag,
        header: None,
        object,
    })
}

/// The extents of byte ranges `(file, offset, len, destination, destination offset)` of `files` into `dests`
/// destinations (empty ranges dropped), each checked to name a file and a destination and to lie inside its file.
fn extents_of_ranges(
    files: &[Arc<OpenFile>],
    ranges: &[(usize, u64, u64, u32, u64)],
    dests: usize,
) -> Result<Vec<Extent>> {
    let mut extents = Vec::with_capacity(ranges.len());
    for &(file, offset, len, dest, dest_offset) in ranges {
        let f = files.get(file).ok_or_else(|| {
            Error::InvalidArgument(format!("range ({file}, {offset}, {len}) names file {file} of {}", files.len()))
        })?;
        if len > 0 && offset.checked_add(len).is_none_or(|end| end > f.len) {
            return Err(weightlift_io::IoError::PastEnd { path: f.path.clone(), offset, len, file_len: f.len }.into());
        }
        if dest as usize >= dests {
            return Err(Error::InvalidArgument(format!(
                "range ({file}, {offset}, {len}) names destination {dest} of {dests}"
            )));
        }
        if len > 0 {
            extents.push(Extent { file: file as u32, offset, len, dest, dest_offset });
        }
    }
    Ok(extents)
}

/// Validates `checks` against the tensors of a load; each tensor's name and file, for error messages.
fn check_names(checks: &Checks, index: &TensorIndex, entries: &[&TensorEntry]) -> Result<Vec<(String, PathBuf)>> {
    if checks.tensors.len() != entries.len() {
        return Err(Error::InvalidArgument(format!(
            "checksums given for {} tensors, the load has {}",
            checks.tensors.len(),
            entries.len()
        )));
    }
    for (t, chunks) in entries.iter().zip(&checks.tensors) {
        if let Some(c) = chunks.iter().find(|c| c.start.checked_add(c.len).is_none_or(|end| end > t.nbytes)) {
            return Err(Error::Verify(format!(
                "a checksum of {:?} covers bytes {}..{}, past its {} bytes",
                t.name,
                c.start,
                c.start.saturating_add(c.len),
                t.nbytes
            )));
        }
    }
    Ok(entries.iter().map(|t| (t.name.clone(), index.files[t.file].path.clone())).collect())
}

/// Checks device blocks by copying them back and hashing on the CPU: where the GPU's hash kernels cannot run.
fn check_read_back(layout: Layout<'_>, blocks: &[DeviceBuffer], why: &str) -> Result<CheckStats> {
    let start = Instant::now();
    let none = HostDest { ptr: std::ptr::null(), len: 0 };
    let mut checker =
        CpuChecker::new(layout, vec![none; blocks.len()], format!("cpu, read back from the device: {why}"));
    // One block at a time through one buffer: host memory of the largest block, not of the whole load.
    let mut host = Vec::new();
    for (d, b) in blocks.iter().enumerate() {
        host.resize(b.len(), 0);
        b.read_back(0, &mut host)?;
        checker.check_one(d, HostDest { ptr: host.as_ptr(), len: host.len() })?;
    }
    checker.finish(start)
}

/// Closes a [`Watch`] when dropped, so that its checking thread ends whatever happens to the read (a panic too).
struct CloseOnDrop<'a>(&'a Watch);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// A byte range of host memory to fill.
fn host_range(d: &mut TensorData) -> (*mut u8, usize) {
    match d {
        TensorData::Host(b) => (b.as_mut_ptr(), b.len()),
        TensorData::Pinned(b) => (b.as_mut_ptr(), b.len()),
        TensorData::Device(_) => (std::ptr::null_mut(), 0),
    }
}

fn extents_of(entries: &[&TensorEntry]) -> Vec<Extent> {
    entries
        .iter()
        .enumerate()
        .map(|(i, t)| Extent { file: t.file as u32, offset: t.offset, len: t.nbytes, dest: i as u32, dest_offset: 0 })
        .collect()
}

fn io_opts<'a>(opts: &LoadOpts<'a>) -> LoadOptions<'a> {
    LoadOptions { progress: opts.progress, cancel: opts.cancel, faults: opts.faults, pinner: None }
}

/// An index of raw byte ranges of `paths` (each a 1-D byte tensor named `""`).
fn ranges_index(files: Vec<weightlift_format::SourceFile>, ranges: &[(usize, u64, u64)]) -> Result<TensorIndex> {
    let mut tensors = Vec::with_capacity(ranges.len());
    for &(file, offset, len) in ranges {
        let f = files
            .get(file)
            .ok_or_else(|| Error::InvalidArgument(format!("range names file {file} of {}", files.len())))?;
        if offset.checked_add(len).is_none_or(|end| end > f.len) {
            return Err(Error::Io(weightlift_io::IoError::PastEnd {
                path: f.path.clone(),
                offset,
                len,
                file_len: f.len,
            }));
        }
        tensors.push(TensorEntry {
            name: String::new(),
            dtype: DType::U8,
            shape: vec![len],
            file,
            offset,
            nbytes: len,
        });
    }
    Ok(TensorIndex { files, tensors })
}

/// Allocates one device buffer per length, in order, on a stream of its own, publishing them to `targets` in
/// growing batches (each followed by an event the lanes' streams wait for). The lanes are already reading.
pub(crate) fn allocate_published(
    gpu: &Gpu,
    lens: &[u64],
    targets: &Targets,
    lanes: usize,
    external: Option<&dyn weightlift_cuda::DeviceAllocator>,
    out: &mut Vec<DeviceBuffer>,
) -> Result<()> {
    let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
    gpu.bind()?;
    let stream = gpu.stream(lanes)?;
    tracing::debug!("allocation stream ready");
    let mut batch: Vec<(u32, u64, u64)> = Vec::new();
    let (mut batch_bytes, mut limit) = (0u64, 1u64);
    let publish = |batch: &mut Vec<(u32, u64, u64)>| -> Result<()> {
        if let Some(a) = external {
            // The allocator's memory is free to write after what its stream has queued (a block freed by its
            // last reader there): the lanes wait for that through the published event.
            // SAFETY: the allocator promises its stream lives in this context.
            unsafe { weightlift_cuda::wait_for_stream(gpu, &stream, a.ready_stream()) }?;
        }
        let event = stream.record_event(None).map_err(|error| weightlift_cuda::CudaError::Driver {
            device: gpu.ordinal(),
            call: "cuEventRecord",
            error,
        })?;
        tracing::debug!(blocks = batch.len(), first = batch.first().map(|b| b.0), "published");
        // SAFETY: every published range is a buffer of `out`, which the caller keeps alive and unused by anything
        // else until the read using `targets` has returned.
        unsafe { targets.publish(batch, Some(event)) };
        batch.clear();
        Ok(())
    };
    for (i, &len) in lens.iter().enumerate() {
        let b = match external {
            Some(a) if len > 0 => a.alloc(gpu, len as usize)?,
            _ => DeviceBuffer::alloc(gpu, len as usize, &stream)?,
        };
        batch.push((i as u32, b.device_ptr(), len));
        out.push(b);
        batch_bytes += len;
        if batch_bytes >= limit {
            publish(&mut batch)?;
            batch_bytes = 0;
            limit = (limit * 2).clamp(64 << 20, MAX_PUBLISH_BYTES);
        }
    }
    if !batch.is_empty() {
        publish(&mut batch)?;
    }
    Ok(())
}

impl Engine {
    /// A checker hashing blocks on `gpu` with the decoder's kernels, or the layout back with the reason they cannot
    /// run here (NVRTC missing, say).
    fn gpu_checker<'a>(
        &self,
        gpu: &Gpu,
        layout: Layout<'a>,
    ) -> std::result::Result<GpuChecker<'a>, (Layout<'a>, String)> {
        match self.take_unpacker(gpu) {
            Ok(u) => Ok(GpuChecker::new(layout, u, gpu.ordinal())),
            Err(e) => Err((layout, e.to_string())),
        }
    }

    /// The length of `path` (for a URL, its object's length now, from one HEAD request).
    pub fn len_of(&self, path: &Path) -> Result<u64> {
        Ok(self.open(path)?.len)
    }

    /// Reads up to `len` bytes of `path` at `offset` into caller memory, like `pread`: returns the bytes read, fewer
    /// at the end of the file (none past it).
    ///
    /// # Safety
    /// `dest` must be valid for writes of `len` bytes (device memory of the named device for `Device`) and not be
    /// accessed by anything else until this returns.
    pub unsafe fn read_into(&self, path: &Path, offset: u64, len: u64, dest: RawDest) -> Result<(u64, Report)> {
        // SAFETY: the same contract.
        unsafe { self.read_into_with(path, offset, len, dest, &LoadOpts::default()) }
    }

    /// [`Engine::read_into`] with load options (cancellation, progress, injected faults).
    ///
    /// # Safety
    /// As for [`Engine::read_into`].
    pub unsafe fn read_into_with(
        &self,
        path: &Path,
        offset: u64,
        len: u64,
        dest: RawDest,
        opts: &LoadOpts<'_>,
    ) -> Result<(u64, Report)> {
        let file_len = self.open(path)?.len;
        let n = len.min(file_len.saturating_sub(offset));
        let ranges = [(0usize, offset, n, 0u64)];
        // SAFETY: per this function's contract, `dest` holds `len >= n` writable bytes.
        let report = unsafe { self.read_ranges_into(&[path.to_path_buf()], &ranges, dest, n, opts) }?;
        Ok((n, report))
    }

    /// Reads byte ranges `(file, offset, len, dest_offset)` of `paths` into `cap` bytes of caller memory at
    /// `dest`, through one plan (host memory: the lanes; device memory: the device's data path). For paged or
    /// scattered reads (KV caches, expert weights, row segments of a tensor) and IOPS measurements.
    ///
    /// # Safety
    /// `dest` must be valid for writes of `cap` bytes (device memory of the named device for `Device`) and not be
    /// accessed by anything else until this returns.
    pub unsafe fn read_ranges_into(
        &self,
        paths: &[PathBuf],
        ranges: &[(usize, u64, u64, u64)],
        dest: RawDest,
        cap: u64,
        opts: &LoadOpts<'_>,
    ) -> Result<Report> {
        let files: Vec<Arc<OpenFile>> = paths.iter().map(|p| self.open(p)).collect::<Result<_>>()?;
        // SAFETY: the same contract.
        unsafe { self.read_open_ranges_into(&files, ranges, dest, cap, opts) }
    }

    /// [`Engine::read_ranges_into`] on files already open.
    ///
    /// # Safety
    /// As for [`Engine::read_ranges_into`].
    pub(crate) unsafe fn read_open_ranges_into(
        &self,
        files: &[Arc<OpenFile>],
        ranges: &[(usize, u64, u64, u64)],
        dest: RawDest,
        cap: u64,
        opts: &LoadOpts<'_>,
    ) -> Result<Report> {
        let ranges: Vec<_> = ranges.iter().map(|&(f, o, l, d)| (f, o, l, 0u32, d)).collect();
        // SAFETY: the same contract, for one destination.
        unsafe { self.read_open_scattered_into(files, &ranges, &[(dest, cap)], opts) }
    }

    /// Reads byte ranges `(file, offset, len, destination, destination offset)` of `paths` into several
    /// caller-owned destinations `(memory, capacity)` through one plan. Every destination must be memory of one
    /// device (host, or one CUDA device).
    ///
    /// # Safety
    /// Each destination must be valid for writes of its capacity (device memory of the named device for
    /// `Device`), the destinations must not overlap, and nothing else may access them until this returns.
    pub unsafe fn read_scattered_into(
        &self,
        paths: &[PathBuf],
        ranges: &[(usize, u64, u64, u32, u64)],
        dests: &[(RawDest, u64)],
        opts: &LoadOpts<'_>,
    ) -> Result<Report> {
        let files: Vec<Arc<OpenFile>> = paths.iter().map(|p| self.open(p)).collect::<Result<_>>()?;
        // SAFETY: the same contract.
        unsafe { self.read_open_scattered_into(&files, ranges, dests, opts) }
    }

    /// [`Engine::read_scattered_into`] over files described already (as a parsed index gives them): an object's
    /// ranges are read from the version the index was parsed from, or not at all, and from its valid local copy
    /// where there is one (`remote_cache_dir`). Ranges covering the whole of an object (as [`Engine::load`] reads
    /// it) write its local copy, published once the read has succeeded.
    ///
    /// # Safety
    /// As for [`Engine::read_scattered_into`].
    pub unsafe fn read_scattered_of_into(
        &self,
        files: &[SourceFile],
        ranges: &[(usize, u64, u64, u32, u64)],
        dests: &[(RawDest, u64)],
        opts: &LoadOpts<'_>,
    ) -> Result<Report> {
        let open = self.open_files_writing(files, &whole_files_of_ranges(files, ranges))?;
        let before = NetworkStats::before(&open);
        // SAFETY: the same contract.
        let read = unsafe { self.read_open_scattered_into(&open, ranges, dests, opts) };
        let mut report = settle_copies(&open, read)?;
        report.network = NetworkStats::of(&open, &before, Some(&report.io));
        Ok(report)
    }

    /// [`Engine::read_scattered_into`] on files already open.
    ///
    /// # Safety
    /// As for [`Engine::read_scattered_into`].
    pub(crate) unsafe fn read_open_scattered_into(
        &self,
        files: &[Arc<OpenFile>],
        ranges: &[(usize, u64, u64, u32, u64)],
        dests: &[(RawDest, u64)],
        opts: &LoadOpts<'_>,
    ) -> Result<Report> {
        if opts.checks.is_some() {
            return Err(Error::InvalidArgument("checksums are checked by tensor loads, not by raw reads".into()));
        }
        let start = Instant::now();
        let before = NetworkStats::before(files);
        let paths: Vec<PathBuf> = files.iter().map(|f| f.path.clone()).collect();
        let extents = extents_of_ranges(files, ranges, dests.len())?;
        let caps: Vec<u64> = dests.iter().map(|d| d.1).collect();
        crate::path::check_extents(&extents, &caps)?;
        let bytes = ranges.iter().map(|r| r.2).sum();
        let device = match dests.first().map(|d| d.0) {
            None | Some(RawDest::Host(_)) => None,
            Some(RawDest::Device { ordinal, .. }) => Some(ordinal),
        };
        let mut report = match device {
            None => {
                let mut host = Vec::with_capacity(dests.len());
                for (d, cap) in dests {
                    let RawDest::Host(ptr) = *d else {
                        return Err(Error::InvalidArgument("destinations mix host and device memory".into()));
                    };
                    host.push((ptr, *cap as usize));
                }
                // SAFETY: the caller guarantees each pointer is valid for its capacity and unaliased during the call.
                let sink = unsafe { HostSink::new(host) };
                let req = LoadRequest { files, extents: &extents, dest_lens: &caps };
                let io = self.io.load(&req, &io_opts(opts), &sink)?;
                self.report(Device::Cpu, paths.clone(), ranges.len(), bytes, io)
            }
            Some(ordinal) => {
                let mut dev = Vec::with_capacity(dests.len());
                for (d, cap) in dests {
                    match *d {
                        RawDest::Device { ordinal: o, ptr } if o == ordinal => dev.push((ptr, *cap)),
                        _ => {
                            return Err(Error::InvalidArgument(format!(
                                "destinations mix cuda:{ordinal} memory with other memory"
                            )));
                        }
                    }
                }
                // SAFETY: the caller guarantees each pointer is device memory of `ordinal` valid for its capacity
                // and unused by anything else until this returns.
                let targets = unsafe { Targets::fixed(dev) };
                let mut r = self.read_targets(ordinal, files, &extents, &caps, &targets, opts)?;
                r.tensors = ranges.len();
                r.files = paths;
                r
            }
        };
        report.network = NetworkStats::of(files, &before, Some(&report.io));
        report.seconds = start.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Reads byte ranges `(file, offset, len, destination, destination offset)` of `paths` into the destinations
    /// of `targets` on device `ordinal` (their lengths `dest_lens`), which may be published while the read runs
    /// (by another thread): each read waits only for its own destination. Fails if `targets` fails.
    ///
    /// # Safety
    /// Each destination published into `targets` must be device memory of `ordinal` valid for its length, the
    /// destinations must not overlap, and nothing else may access them until this returns.
    pub unsafe fn read_into_targets(
        &self,
        paths: &[PathBuf],
        ranges: &[(usize, u64, u64, u32, u64)],
        dest_lens: &[u64],
        ordinal: u32,
        targets: &Arc<Targets>,
        opts: &LoadOpts<'_>,
    ) -> Result<Report> {
        let start = Instant::now();
        let files: Vec<Arc<OpenFile>> = paths.iter().map(|p| self.open(p)).collect::<Result<_>>()?;
        let extents = extents_of_ranges(&files, ranges, dest_lens.len())?;
        crate::path::check_extents(&extents, dest_lens)?;
        let mut r = self.read_targets(ordinal, &files, &extents, dest_lens, targets, opts)?;
        r.tensors = ranges.len();
        r.files = paths.to_vec();
        r.seconds = start.elapsed().as_secs_f64();
        Ok(r)
    }

    /// The device read of [`Engine::read_scattered_into`] and [`Engine::read_into_targets`].
    fn read_targets(
        &self,
        ordinal: u32,
        files: &[Arc<OpenFile>],
        extents: &[Extent],
        dest_lens: &[u64],
        targets: &Arc<Targets>,
        opts: &LoadOpts<'_>,
    ) -> Result<Report> {
        let gpu = self.gpu(ordinal)?;
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        gpu.bind()?;
        let path = self.gpu_path(ordinal)?;
        let read = DeviceRead { gpu: &gpu, files, extents, dest_lens, targets, opts, observer: None };
        let outcome = path.imp.read(&self.io, &read, &mut || Ok(()))?;
        let bytes = extents.iter().map(|e| e.len).sum();
        Ok(self.device_report(Device::Cuda(ordinal), &gpu, &path, outcome, extents.len(), bytes))
    }

    /// Reads ranges `(file, offset, len, dest_offset)` of `paths` into a device buffer (see
    /// [`Engine::read_ranges_into`]).
    pub fn read_ranges_into_buffer(
        &self,
        paths: &[PathBuf],
        ranges: &[(usize, u64, u64, u64)],
        dest: &mut DeviceBuffer,
    ) -> Result<Report> {
        let raw = RawDest::Device { ordinal: dest.gpu().ordinal(), ptr: dest.device_ptr() };
        // SAFETY: `dest` is borrowed mutably for the whole call: allocated on its device, used by nothing else.
        unsafe { self.read_ranges_into(paths, ranges, raw, dest.len() as u64, &LoadOpts::default()) }
    }

    /// Writes a loaded tensor's bytes into `path` at `offset` (durably when asked); returns the bytes written.
    pub fn write_tensor(&self, path: &Path, offset: u64, data: &TensorData, durable: bool) -> Result<u64> {
        let src = match data {
            TensorData::Host(b) => RawSrc::Host(b.as_ptr()),
            TensorData::Pinned(b) => RawSrc::Host(b.as_ptr()),
            TensorData::Device(d) => RawSrc::Device { ordinal: d.block.gpu().ordinal(), ptr: d.device_ptr() },
        };
        // SAFETY: `data` is borrowed for the whole call: its memory stays allocated and unmodified meanwhile.
        unsafe { self.write_from(path, offset, data.len() as u64, src, durable) }
    }

    /// Writes `len` bytes of caller memory into `path` at `offset` (creating the file if needed, never truncating
    /// it), then `fsync`s it when `durable`. Returns the bytes written.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes (device memory of the named device for `Device`) and not be
    /// written by anything else until this returns.
    pub unsafe fn write_from(&self, path: &Path, offset: u64, len: u64, src: RawSrc, durable: bool) -> Result<u64> {
        // SAFETY: the same contract.
        unsafe { self.write_from_with(path, offset, len, src, durable, None) }
    }

    /// [`Engine::write_from`] with faults injected into its writes (tests).
    ///
    /// # Safety
    /// As for [`Engine::write_from`].
    pub unsafe fn write_from_with(
        &self,
        path: &Path,
        offset: u64,
        len: u64,
        src: RawSrc,
        durable: bool,
        faults: Option<&weightlift_io::fault::FaultPlan>,
    ) -> Result<u64> {
        use weightlift_io::write::{HostSource, WriteRequest, WriteSource, write_at};
        let req = WriteRequest { path, offset, len, durable, faults };
        let params = self.settings.io_params();
        let mut pool = lock(&self.write_pool);
        let report = match src {
            RawSrc::Host(ptr) => {
                // SAFETY: the caller guarantees `ptr` is valid for reads of `len` bytes during the call.
                let data = unsafe { std::slice::from_raw_parts(ptr, len as usize) };
                write_at(&params, &req, &HostSource(data), &mut pool, None)?
            }
            RawSrc::Device { ordinal, ptr } => {
                // The copies out and the pinning below bind the device on this (the caller's) thread.
                let _restore = weightlift_cuda::ContextRestore::save();
                let gpu = self.gpu(ordinal)?;
                /// Device memory copied out chunk by chunk into (pinned) staging slots.
                struct DeviceSource<'a> {
                    gpu: &'a Gpu,
                    ptr: weightlift_cuda::CUdeviceptr,
                }
                impl WriteSource for DeviceSource<'_> {
                    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), weightlift_io::SinkError> {
                        // SAFETY: `write_from`'s caller guarantees the device range is readable; `buf` lies within it.
                        Ok(unsafe { weightlift_cuda::copy_device_to_host(self.gpu, self.ptr + offset, buf) }?)
                    }
                }
                let pinner = weightlift_cuda::CudaPinner::new(&gpu);
                write_at(&params, &req, &DeviceSource { gpu: &gpu, ptr }, &mut pool, Some(&pinner))?
            }
        };
        Ok(report.bytes)
    }
}
