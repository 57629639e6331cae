//! One load through the storage engine: probe residency, decide what the page cache keeps, plan, size the lanes'
//! staging, hand the job to the lanes, report.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Instant;

use crate::engine::{IoEngine, ReadEngineUsed};
use crate::error::IoError;
use crate::fault::FaultPlan;
use crate::file::OpenFile;
use crate::job::{Gate, Held, Job, JobParts, LOOKAHEAD, LaneTotals, Priority};
use crate::pacer::{GetsReport, Pacer};
use crate::params::{CachePages, CachePolicy, DirectMode};
use crate::plan::{self, Extent, Plan, PlanError, PlanFile, PlanOptions, ReadKind};
use crate::reading::LaneStats;
use crate::residency::Residency;
use crate::sink::Sink;
use crate::staging::Pinner;

/// Reads of cold pages are this many chunks long: cold storage is faster with large requests (measured on a virtio
/// disk: 4 MiB requests 2.05 GB/s, 1 MiB requests 1.74 GB/s, at the same bytes in flight), page-cache copies with
/// small ones.
const DIRECT_CHUNK_FACTOR: u64 = 4;
/// Slots per read in flight for an asynchronous sink: one being read, one being copied.
const ASYNC_SLOTS_PER_READ: usize = 2;
/// Reads whose pages are at least this resident are read as cached under `DirectMode::Auto`.
const RESIDENT_ENOUGH: f64 = 0.5;
/// The largest read of an object: a part of a GET, the staging a GET in flight holds at a time (it holds
/// [`LOOKAHEAD`] of them), so that the staging bound allows many GETs (256 with the default 256 MiB), each
/// covering `remote_range_bytes`. With 1 MiB parts a load onto an H100 kept at most 78 of its 128 GETs in flight
/// (the slots of parts still being copied to the device held the rest back): 0.69 of curl's 128 GETs.
const OBJECT_PIECE: u64 = 512 << 10;

/// What to load: byte ranges of opened files and the sizes of the destinations they fill.
#[derive(Debug)]
pub struct LoadRequest<'a> {
    /// The inputs; an extent's `file` is an index into this.
    pub files: &'a [Arc<OpenFile>],
    /// The byte ranges to read and where each lands. Destination ranges must not overlap.
    pub extents: &'a [Extent],
    /// Each destination's length in bytes; an extent's `dest` is an index into this.
    pub dest_lens: &'a [u64],
}

/// How to load it (borrowed for the duration of [`IoEngine::load`]).
#[derive(Default)]
pub struct LoadOptions<'a> {
    /// Incremented by the bytes of every completed read.
    pub progress: Option<&'a AtomicU64>,
    /// Set to stop the load early (it then fails with `IoError::Cancelled`).
    pub cancel: Option<&'a AtomicBool>,
    /// Injected faults (tests).
    pub faults: Option<&'a FaultPlan>,
    /// Pins staging memory for device DMA.
    pub pinner: Option<Arc<dyn Pinner>>,
}

impl std::fmt::Debug for LoadOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions").field("pinned", &self.pinner.is_some()).finish()
    }
}

/// Options of a load that outlives the call starting it (a streaming load): everything owned.
#[derive(Default)]
pub struct StreamOptions {
    /// Incremented by the bytes of every completed read.
    pub progress: Option<Arc<AtomicU64>>,
    /// Set to stop the load early (it then fails with `IoError::Cancelled`).
    pub cancel: Option<Arc<AtomicBool>>,
    /// Holds reads back, or skips them, op by op (see [`Gate`]); `None` reads everything as fast as it can.
    pub gate: Option<Arc<dyn Gate>>,
    /// Pins staging memory for device DMA.
    pub pinner: Option<Arc<dyn Pinner>>,
    /// Injected faults (tests).
    pub faults: Option<Arc<FaultPlan>>,
    /// At most this many lanes read for this load (None: as many as the staging bound allows), to leave CPUs to
    /// work that runs beside the reads.
    pub max_lanes: Option<usize>,
}

impl std::fmt::Debug for StreamOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamOptions").field("gated", &self.gate.is_some()).finish()
    }
}

/// What a load did, and why.
#[derive(Clone, Debug)]
pub struct IoReport {
    /// The kernel interface the lanes used.
    pub read_engine: ReadEngineUsed,
    /// Why that one: who chose it, or what the io_uring probe found.
    pub read_engine_reason: String,
    /// Whether io_uring read into registered (fixed) buffers.
    pub fixed_buffers: bool,
    /// Why the kernel refused to register the staging as fixed buffers, where it did.
    pub fixed_refusal: Option<String>,
    /// The page-cache decision: which reads were buffered or O_DIRECT, and why.
    pub direct_reason: String,
    /// The cache policy in effect for cold ranges (`keep` or `bypass`; `auto` resolved).
    pub cache: CachePolicy,
    /// The folio size asked for cold ranges read through the page cache.
    pub cache_pages: CachePages,
    /// Why cold ranges could not be populated in 2 MiB folios (the first refusal), where they could not.
    pub populate_refusal: Option<String>,
    /// Bytes the caller asked for.
    pub requested_bytes: u64,
    /// Bytes read through the O_DIRECT and buffered descriptors (alignment and coalesced gaps included).
    pub direct_bytes: u64,
    /// See `direct_bytes`.
    pub buffered_bytes: u64,
    /// Bytes of the input files in the page cache before the load (where probed). Where a load of most of a large
    /// span of a file was judged from samples, an estimate from them: the whole span, or none of it.
    pub resident_bytes: Option<u64>,
    /// Reads issued (retries of one read not counted again).
    pub ops: u64,
    /// Ops a streaming load's gate skipped (their destinations were read another way).
    pub skipped_ops: u64,
    /// Lanes that took part in the load.
    pub lanes: usize,
    /// Reads in flight per lane (1 for `pread` lanes).
    pub queue_depth: usize,
    /// Staging slots each lane used.
    pub slots_per_lane: usize,
    /// Bytes of each staging slot.
    pub slot_bytes: u64,
    /// Staging memory this load could use at most.
    pub peak_staging_bytes: u64,
    /// Seconds spent probing the page cache and planning the reads.
    pub plan_secs: f64,
    /// Seconds from handing the job to the lanes until its last byte landed.
    pub io_secs: f64,
    /// The lanes' counters, summed.
    pub stats: LaneStats,
    /// For a load of objects: how many GETs were in flight, and why.
    pub gets: Option<GetsReport>,
}

impl IoReport {
    fn new(engine: &IoEngine) -> IoReport {
        let (read_engine, reason) = engine.read_engine();
        IoReport::blank(read_engine, reason.to_string())
    }

    /// An empty report, for paths that stand in for the pipeline (they fill in what they did).
    pub fn blank(read_engine: ReadEngineUsed, read_engine_reason: String) -> IoReport {
        IoReport {
            read_engine,
            read_engine_reason,
            fixed_buffers: false,
            fixed_refusal: None,
            direct_reason: String::new(),
            cache: CachePolicy::Bypass,
            cache_pages: CachePages::Base,
            populate_refusal: None,
            requested_bytes: 0,
            direct_bytes: 0,
            buffered_bytes: 0,
            resident_bytes: None,
            ops: 0,
            skipped_ops: 0,
            lanes: 0,
            queue_depth: 0,
            slots_per_lane: 0,
            slot_bytes: 0,
            peak_staging_bytes: 0,
            plan_secs: 0.0,
            io_secs: 0.0,
            stats: LaneStats::default(),
            gets: None,
        }
    }

    fn finish(&mut self, totals: &LaneTotals, skipped: u64) {
        self.stats = totals.stats.clone();
        self.ops = totals.stats.ops;
        self.direct_bytes = totals.stats.direct_bytes;
        self.buffered_bytes = totals.stats.buffered_bytes;
        self.fixed_buffers = totals.fixed_buffers;
        self.fixed_refusal.clone_from(&totals.fixed_refusal);
        self.populate_refusal.clone_from(&totals.populate_refusal);
        self.lanes = totals.lanes;
        self.skipped_ops = skipped;
        self.gets.clone_from(&totals.gets);
    }
}

/// A planned load, ready to hand to the lanes.
struct Prepared {
    report: IoReport,
    plan: Plan,
    slots_per_lane: usize,
    max_lanes: usize,
    /// How many GETs to keep in flight (a load of objects), and the setting.
    pacer: Option<(Pacer, String)>,
}

impl IoEngine {
    /// For slots of `slot_bytes`: reads in flight per lane, slots per lane (as many as reads in flight, twice that
    /// for an `asynchronous` sink's copies to overlap, as far as the lane's share of the staging bound allows: at
    /// least one) and how many lanes the staging bound lets read.
    pub(crate) fn staging_shape(&self, slot_bytes: u64, asynchronous: bool) -> (usize, usize, usize) {
        let params = self.params();
        let qd = if self.read_engine().0 == ReadEngineUsed::Uring { params.queue_depth as usize } else { 1 };
        let per_lane = self.shared().staging_per_lane();
        let slots =
            (qd * if asynchronous { ASYNC_SLOTS_PER_READ } else { 1 }).min((per_lane / slot_bytes).max(1) as usize);
        let lanes = ((params.staging_bytes / (slot_bytes * slots as u64).max(1)) as usize).clamp(1, self.lanes());
        (qd, slots, lanes)
    }

    /// Plans a load and sizes its staging. `in_place`: the sink, where every read that can land in place (host
    /// destinations) will (a load that is not gated: a gate decides per destination as the load runs).
    fn prepare(
        &self,
        req: &LoadRequest<'_>,
        asynchronous: bool,
        gated: bool,
        in_place: Option<&dyn Sink>,
    ) -> Result<Prepared, IoError> {
        let t0 = Instant::now();
        let params = self.params();
        let mut report = IoReport::new(self);
        let mode = params.direct;
        // Each file's span of requested bytes, and how many of them: a load of most of a large span is probed by
        // samples (see `residency`).
        let mut spans = vec![(u64::MAX, 0u64, 0u64); req.files.len()];
        for e in req.extents {
            if let Some((lo, hi, n)) = spans.get_mut(e.file as usize) {
                *lo = (*lo).min(e.offset);
                *hi = (*hi).max(e.offset.saturating_add(e.len));
                *n = n.saturating_add(e.len);
            }
        }
        let residency: Vec<Option<Residency>> = req
            .files
            .iter()
            .zip(&spans)
            .map(|(f, &(lo, hi, n))| {
                let local = f.local().filter(|_| mode == DirectMode::Auto);
                local.and_then(|file| Residency::probe_for(file, f.len, lo, hi, n))
            })
            .collect();
        if mode == DirectMode::Auto {
            report.resident_bytes = Some(residency.iter().flatten().map(Residency::resident_bytes).sum());
        }
        tracing::debug!(secs = t0.elapsed().as_secs_f64(), "page cache probed");
        let total: u64 = req.files.iter().map(|f| f.len).sum();
        let (cache, cache_why) = resolve_cache(params.cache, total);
        report.cache = cache;
        report.cache_pages = params.cache_pages;
        let sampled = residency.iter().flatten().any(Residency::is_sampled);
        report.direct_reason = direct_reason(mode, cache, &cache_why, req.files, report.resident_bytes, sampled);

        let objects: Vec<bool> = req.files.iter().map(|f| f.object().is_some()).collect();
        let chunk = params.chunk_bytes;
        let max_block = req.files.iter().filter(|f| f.supports_direct()).map(|f| f.block).max().unwrap_or(0);
        let direct_chunk = chunk * DIRECT_CHUNK_FACTOR;
        let mut kind = |file: u32, offset: u64, len: u64| match mode {
            _ if objects.get(file as usize).copied().unwrap_or(false) => ReadKind::Object,
            DirectMode::Never => ReadKind::Cached,
            DirectMode::Always => ReadKind::Direct,
            DirectMode::Auto => {
                let cached =
                    residency[file as usize].as_ref().is_some_and(|r| r.fraction(offset, len) >= RESIDENT_ENOUGH);
                match (cached, cache) {
                    (true, _) => ReadKind::Cached,
                    (false, CachePolicy::Keep) => ReadKind::ColdBuffered,
                    (false, _) => ReadKind::Direct,
                }
            }
        };
        // Staging per lane must hold the largest read (a cold read widened by a block at each end).
        let per_lane = self.shared().staging_per_lane();
        let widest = direct_chunk + 2 * max_block;
        let (chunk, direct_chunk) = if widest <= per_lane {
            (chunk, direct_chunk)
        } else {
            let room = (per_lane.saturating_sub(2 * max_block) / 4096 * 4096).max(4096);
            (chunk.min(room), room)
        };
        let piece =
            OBJECT_PIECE.min(params.remote_range_bytes).min(per_lane / LOOKAHEAD as u64 / 4096 * 4096).max(4096);
        let opts = PlanOptions {
            chunk,
            direct_chunk,
            coalesce_gap: (64 << 10).min(chunk),
            separate_destinations: gated,
            object_piece: piece,
            object_get: params.remote_range_bytes.max(piece),
            // The GETs the pacer keeps in flight from the start (`Self::pacer`: a fixed count, or the adaptive
            // start, within what the staging holds). Spreading for the most it may reach instead (256) cut a 4.2 GiB
            // load onto an H100 into 505 GETs of 8.5 MiB, of which at most 156 flew at once: 0.48 s against 0.43 s
            // with 268 GETs of 16 MiB (each GET's first byte is paid once more per 8.5 MiB).
            object_gets_in_flight: {
                let bound = ((per_lane / piece) as usize * self.lanes() / LOOKAHEAD).max(1);
                params.remote_concurrency.map_or(crate::pacer::START, |n| n as usize).min(bound)
            },
        };
        let plan = make_plan(req, &opts, &mut kind)?;
        report.requested_bytes = plan.requested_bytes;
        let mut slot_bytes = plan.slot_bytes.max(4096);
        let (qd, slots_per_lane, max_lanes) = if plan.groups.is_empty() {
            self.staging_shape(slot_bytes, asynchronous)
        } else {
            // Parts of GETs cost no CPU while in flight: every slot may hold one, on every lane.
            let slots = (per_lane / slot_bytes).max(1) as usize;
            // Where every read lands in place (objects into host memory), the slots only count the parts in
            // flight and hold no bytes: made as small as staging allows (the staging of a one-shot load into host
            // memory was otherwise a quarter of its time, zeroing pages nobody reads).
            let objects_only = plan.groups.iter().map(|g| g.len()).sum::<usize>() == plan.ops.len();
            let all_in_place = in_place.is_some_and(|sink| {
                plan.ops.iter().all(|op| crate::reading::in_place_targets(&plan, op, sink).is_some())
            });
            if objects_only && all_in_place {
                slot_bytes = 4096;
            }
            (slots, slots, self.lanes())
        };
        let pacer =
            (!plan.groups.is_empty()).then(|| self.pacer(plan.slot_bytes.max(4096), slots_per_lane * max_lanes));
        let lane_bytes = slot_bytes * slots_per_lane as u64;
        report.queue_depth = qd;
        report.slots_per_lane = slots_per_lane;
        report.slot_bytes = slot_bytes;
        report.peak_staging_bytes = lane_bytes * max_lanes.min(plan.ops.len().max(1)) as u64;
        report.plan_secs = t0.elapsed().as_secs_f64();
        Ok(Prepared { report, plan, slots_per_lane, max_lanes, pacer })
    }

    /// The pacer of a load of objects whose lanes have `slots` slots of `slot_bytes` in all, and the setting.
    fn pacer(&self, slot_bytes: u64, slots: usize) -> (Pacer, String) {
        let params = self.params();
        let bound = (slots / LOOKAHEAD).max(1);
        let why = format!(
            "staging_bytes={} holds {slots} parts of {} KiB, {LOOKAHEAD} per GET",
            params.staging_bytes,
            slot_bytes >> 10
        );
        match params.remote_concurrency {
            Some(n) => (Pacer::fixed(n as usize, bound, why), n.to_string()),
            None => {
                let cap = crate::params::defaults::MAX_REMOTE_CONCURRENCY as usize;
                let why = if cap < bound { format!("the most found at run time, {cap}") } else { why };
                (Pacer::adaptive(bound.min(cap), why), "auto".into())
            }
        }
    }

    fn job(&self, req: &LoadRequest<'_>, p: Prepared, parts: JobHeld) -> (Arc<Job>, IoReport) {
        let Prepared { report, plan, slots_per_lane, max_lanes, pacer } = p;
        let slot_bytes = report.slot_bytes;
        let job = Job::new(JobParts {
            plan,
            files: req.files.to_vec(),
            sink: parts.sink,
            gate: parts.gate,
            progress: parts.progress,
            cancel: parts.cancel,
            faults: parts.faults,
            pinner: parts.pinner,
            priority: parts.priority,
            queue_depth: report.queue_depth,
            slots_per_lane,
            slot_bytes,
            max_lanes,
            lanes: self.lanes(),
            populate: self.params().cache_pages == CachePages::Huge,
            pacer,
        });
        (Arc::new(job), report)
    }

    /// Loads `req`'s extents into `sink`, on the engine's lanes; returns when every byte has landed (or on the
    /// first error, once every read has drained and no delivery still reads staging).
    pub fn load(&self, req: &LoadRequest<'_>, opts: &LoadOptions<'_>, sink: &dyn Sink) -> Result<IoReport, IoError> {
        self.load_with(req, opts, sink, || {})
    }

    /// [`IoEngine::load`], running `during` on the calling thread once the lanes have the job (to overlap work
    /// such as allocating the destinations with the reads).
    pub fn load_with(
        &self,
        req: &LoadRequest<'_>,
        opts: &LoadOptions<'_>,
        sink: &dyn Sink,
        during: impl FnOnce(),
    ) -> Result<IoReport, IoError> {
        let prepared = self.prepare(req, sink.asynchronous(), false, Some(sink))?;
        tracing::debug!(secs = prepared.report.plan_secs, ops = prepared.plan.ops.len(), "planned");
        let erase = |s: &dyn Sink| -> *const (dyn Sink + 'static) {
            // SAFETY: only the lifetime is erased; `load` waits until the job has completed (no lane uses the sink
            // any more) before returning, also when unwinding (`Completion`'s drop), so the sink outlives every use.
            unsafe { std::mem::transmute::<*const dyn Sink, *const (dyn Sink + 'static)>(s) }
        };
        let parts = JobHeld {
            sink: Held::Borrowed(erase(sink)),
            gate: None,
            progress: opts.progress.map(|p| Held::Borrowed(p as *const AtomicU64)),
            cancel: opts.cancel.map(|c| Held::Borrowed(c as *const AtomicBool)),
            faults: opts.faults.map(|f| Held::Borrowed(f as *const FaultPlan)),
            pinner: opts.pinner.clone(),
            priority: Priority::Foreground,
        };
        let (job, mut report) = self.job(req, prepared, parts);
        let t = Instant::now();
        let guard = Completion(&job);
        self.submit(job.clone())?;
        tracing::debug!("submitted");
        during();
        let (result, skipped) = guard.wait();
        report.io_secs = t.elapsed().as_secs_f64();
        report.finish(&result?, skipped);
        Ok(report)
    }

    /// Starts a load that owns what it uses and runs in the background (lower priority than other loads); the
    /// returned handle waits for it or cancels it.
    pub fn start(&self, req: &LoadRequest<'_>, opts: StreamOptions, sink: Arc<dyn Sink>) -> Result<Running, IoError> {
        // A gate decides per destination, so no read may feed two of them.
        let mut prepared = self.prepare(req, sink.asynchronous(), opts.gate.is_some(), None)?;
        if let Some(cap) = opts.max_lanes {
            let lanes = prepared.max_lanes.min(cap.max(1));
            let lane_bytes = prepared.report.slot_bytes * prepared.slots_per_lane as u64;
            prepared.report.peak_staging_bytes = lane_bytes * lanes.min(prepared.plan.ops.len().max(1)) as u64;
            prepared.max_lanes = lanes;
        }
        let parts = JobHeld {
            sink: Held::Owned(sink),
            gate: opts.gate.map(Held::Owned),
            progress: opts.progress.map(Held::Owned),
            cancel: opts.cancel.map(Held::Owned),
            faults: opts.faults.map(Held::Owned),
            pinner: opts.pinner,
            priority: Priority::Background,
        };
        let (job, report) = self.job(req, prepared, parts);
        self.submit(job.clone())?;
        Ok(Running { job, report: Some(report), started: Instant::now() })
    }
}

struct JobHeld {
    sink: Held<dyn Sink>,
    gate: Option<Held<dyn Gate>>,
    progress: Option<Held<AtomicU64>>,
    cancel: Option<Held<AtomicBool>>,
    faults: Option<Held<FaultPlan>>,
    pinner: Option<Arc<dyn Pinner>>,
    priority: Priority,
}

/// Waits for a borrowing job on every path out of `load`, unwinding included.
struct Completion<'a>(&'a Arc<Job>);

impl Completion<'_> {
    fn wait(self) -> (Result<LaneTotals, IoError>, u64) {
        let r = self.0.wait();
        std::mem::forget(self);
        r
    }
}

impl Drop for Completion<'_> {
    fn drop(&mut self) {
        self.0.fail(IoError::Cancelled);
        let _ = self.0.wait();
    }
}

/// A load running in the background ([`IoEngine::start`]). Dropping it cancels the load and waits for the lanes
/// to let go of it.
#[derive(Debug)]
pub struct Running {
    job: Arc<Job>,
    report: Option<IoReport>,
    started: Instant,
}

impl Running {
    /// The error the load failed with, if it failed (a copy: `wait` still returns it).
    pub fn error(&self) -> Option<IoError> {
        self.job.error()
    }

    /// Whether every read has landed (or the load failed).
    pub fn is_done(&self) -> bool {
        self.job.is_complete()
    }

    /// Waits up to `timeout` for the load to finish; true once it has.
    pub fn wait_timeout(&self, timeout: std::time::Duration) -> bool {
        self.job.wait_timeout(timeout)
    }

    /// Stops handing out reads; what is in flight drains.
    pub fn cancel(&self) {
        self.job.fail(IoError::Cancelled);
    }

    /// Waits for the load and returns its report.
    pub fn wait(mut self) -> Result<IoReport, IoError> {
        let (result, skipped) = self.job.wait();
        let mut report = self.report.take().ok_or(IoError::Cancelled)?;
        report.io_secs = self.started.elapsed().as_secs_f64();
        report.finish(&result?, skipped);
        Ok(report)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.job.is_complete() {
            self.job.fail(IoError::Cancelled);
        }
        let _ = self.job.wait();
    }
}

fn make_plan(
    req: &LoadRequest<'_>,
    opts: &PlanOptions,
    kind: &mut dyn FnMut(u32, u64, u64) -> ReadKind,
) -> Result<Plan, IoError> {
    let files: Vec<PlanFile> =
        req.files.iter().map(|f| PlanFile { len: f.len, block: f.block, direct: f.supports_direct() }).collect();
    plan::plan(&files, req.extents, req.dest_lens, opts, kind).map_err(|e| match e {
        PlanError::PastEnd { file, offset, len, file_len } => {
            IoError::PastEnd { path: req.files[file as usize].path.clone(), offset, len, file_len }
        }
        PlanError::Destination(m) => IoError::Destinations(m),
    })
}

/// `keep` or `bypass` for cold ranges, and why.
fn resolve_cache(policy: CachePolicy, total: u64) -> (CachePolicy, String) {
    match policy {
        CachePolicy::Keep => (CachePolicy::Keep, "cache=keep set".into()),
        CachePolicy::Bypass => (CachePolicy::Bypass, "cache=bypass set".into()),
        CachePolicy::Auto => match mem_available() {
            Some(avail) if total.saturating_mul(2) <= avail => (
                CachePolicy::Keep,
                format!("cache=auto: the files ({total} bytes) fit in half of the memory available ({avail} bytes)"),
            ),
            Some(avail) => (
                CachePolicy::Bypass,
                format!("cache=auto: the files ({total} bytes) exceed half of the memory available ({avail} bytes)"),
            ),
            None => (CachePolicy::Bypass, "cache=auto: available memory unknown".into()),
        },
    }
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

fn direct_reason(
    mode: DirectMode,
    cache: CachePolicy,
    cache_why: &str,
    files: &[Arc<OpenFile>],
    resident: Option<u64>,
    sampled: bool,
) -> String {
    let refused: Vec<String> =
        files.iter().filter_map(|f| f.direct_refused.as_ref().map(|r| format!("{}: {r}", f.path.display()))).collect();
    let base = match mode {
        DirectMode::Never => "direct=never: buffered reads only".to_string(),
        DirectMode::Always => "direct=always: O_DIRECT wherever the filesystem allows it".to_string(),
        DirectMode::Auto => {
            let total: u64 = files.iter().map(|f| f.len).sum();
            let cold = match cache {
                CachePolicy::Keep => "buffered in large requests, so the page cache keeps them",
                _ => "read with O_DIRECT, leaving the page cache as it was",
            };
            let how = if sampled {
                format!(
                    " (judged from {} places of {} MiB each, as for a load of most of over {} MiB of a file)",
                    crate::residency::SAMPLES,
                    crate::residency::SAMPLE_BYTES >> 20,
                    crate::residency::SAMPLED_ABOVE >> 20
                )
            } else {
                String::new()
            };
            match resident {
                Some(r) => format!(
                    "auto: {r} of {total} bytes were in the page cache{how} and are read buffered; the rest is {cold} ({cache_why})"
                ),
                None => format!("auto: cold ranges {cold} ({cache_why})"),
            }
        }
    };
    if refused.is_empty() || mode == DirectMode::Never {
        base
    } else {
        format!("{base}; buffered where O_DIRECT is refused ({})", refused.join("; "))
    }
}
