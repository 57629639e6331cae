//! One load through the storage engine: probe residency, plan, size the staging ring, run the lanes, report.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::time::Instant;

use crate::config::{Backend, DirectMode, IoConfig, Source};
use crate::error::IoError;
use crate::fault::FaultPlan;
use crate::file::OpenFile;
use crate::lane::{LaneStats, Shared};
use crate::plan::{self, Extent, Plan, PlanError, PlanFile, PlanOptions};
use crate::pread;
use crate::residency::Residency;
use crate::sink::Sink;
use crate::staging::{Pinner, StagingPool};
use crate::uring;

/// Pread lanes issue one read at a time, so they are more numerous than io_uring lanes, up to this many.
const MAX_PREAD_LANES: usize = 64;
/// O_DIRECT reads are this many chunks long: cold storage is faster with large requests (measured on a virtio disk:
/// 4 MiB requests 2.05 GB/s, 1 MiB requests 1.74 GB/s, at the same bytes in flight), page-cache copies with small
/// ones.
const DIRECT_CHUNK_FACTOR: u64 = 4;
/// Slots per read in flight for an asynchronous sink: one being read, one being copied.
const ASYNC_SLOTS_PER_READ: usize = 2;
/// Reads whose pages are at least this resident are read buffered under `DirectMode::Auto`.
const RESIDENT_ENOUGH: f64 = 0.5;

/// What to load: byte ranges of opened files and the sizes of the destinations they fill.
#[derive(Debug)]
pub struct LoadRequest<'a> {
    pub files: &'a [OpenFile],
    pub extents: &'a [Extent],
    pub dest_lens: &'a [u64],
}

/// How to load it.
#[derive(Debug, Default)]
pub struct LoadOptions<'a> {
    /// Incremented by the bytes of every completed read.
    pub progress: Option<&'a AtomicU64>,
    /// Set to stop the load early (it then fails with `IoError::Cancelled`).
    pub cancel: Option<&'a AtomicBool>,
    pub faults: Option<&'a FaultPlan>,
    /// Pins staging memory for device DMA.
    pub pinner: Option<&'a dyn Pinner>,
}

/// What a load did, and why.
#[derive(Clone, Debug, Default)]
pub struct IoReport {
    /// `"uring"` or `"pread"`.
    pub backend: &'static str,
    pub backend_reason: String,
    pub fixed_buffers: bool,
    pub fixed_refusal: Option<String>,
    /// The O_DIRECT policy and what it was based on.
    pub direct_reason: String,
    /// Bytes the caller asked for.
    pub requested_bytes: u64,
    /// Bytes read through the O_DIRECT and buffered descriptors (alignment and coalesced gaps included).
    pub direct_bytes: u64,
    pub buffered_bytes: u64,
    /// Bytes of the input files in the page cache before the load (where probed).
    pub resident_bytes: Option<u64>,
    pub ops: u64,
    pub lanes: usize,
    pub queue_depth: usize,
    pub slots: usize,
    pub slot_bytes: u64,
    /// Staging memory used by this load.
    pub peak_staging_bytes: u64,
    pub plan_secs: f64,
    pub setup_secs: f64,
    pub io_secs: f64,
    pub stats: LaneStats,
    pub settings: Vec<(&'static str, String, Source)>,
}

/// Loads `req`'s extents into `sink`.
pub fn load<S: Sink>(
    config: &IoConfig,
    req: &LoadRequest<'_>,
    opts: &LoadOptions<'_>,
    pool: &mut StagingPool,
    sink: &S,
) -> Result<IoReport, IoError> {
    config.validate()?;
    let t0 = Instant::now();
    let mut report = IoReport { settings: config.describe(), ..IoReport::default() };

    let (backend, reason) = choose_backend(config)?;
    report.backend = backend;
    report.backend_reason = reason;

    let mode = config.direct.value;
    let residency: Vec<Option<Residency>> =
        req.files
            .iter()
            .map(|f| {
                if mode == DirectMode::Auto && f.supports_direct() {
                    Residency::probe(&f.buffered, f.len)
                } else {
                    None
                }
            })
            .collect();
    if mode == DirectMode::Auto {
        report.resident_bytes = Some(residency.iter().flatten().map(Residency::resident_bytes).sum());
    }
    report.direct_reason = direct_reason(config, req.files, report.resident_bytes);

    let staging_cap = config.staging_bytes.value;
    let max_block = req.files.iter().filter(|f| f.supports_direct()).map(|f| f.block).max().unwrap_or(0);
    let room = staging_cap.saturating_sub(2 * max_block).max(4096);
    let chunk = config.chunk_bytes.value.min(room);
    let direct_chunk = (chunk * DIRECT_CHUNK_FACTOR).min(room);
    let mut plan = make_plan(req, &residency, mode, chunk, direct_chunk, true)?;
    if plan.slot_bytes > staging_cap {
        // The staging bound is too small to widen reads to the block size: read buffered only.
        let small = (staging_cap / 4096 * 4096).clamp(4096, chunk);
        plan = make_plan(req, &residency, mode, small, small, false)?;
        report.direct_reason = format!("buffered: the staging bound ({staging_cap} bytes) cannot hold an aligned read");
    }
    report.requested_bytes = plan.requested_bytes;
    report.plan_secs = t0.elapsed().as_secs_f64();
    if plan.ops.is_empty() {
        return Ok(report);
    }

    let t1 = Instant::now();
    let budget = ((staging_cap / plan.slot_bytes) as usize).max(1);
    let qd = config.queue_depth.value as usize;
    let threads = config.threads.value as usize;
    let lanes = match backend {
        "uring" => threads,
        _ => (threads * qd).min(MAX_PREAD_LANES),
    }
    .min(budget)
    .min(plan.ops.len())
    .max(1);
    // A synchronous sink frees a slot as soon as its read is delivered: reads in flight are all the slots it can
    // use. An asynchronous one (device copies) gets as many again, so copies queue behind reads; more staging only
    // costs set-up time (it is populated and pinned) without keeping the copy engine busier.
    let per_lane_reads = if backend == "uring" { qd } else { 1 };
    let wanted =
        if sink.asynchronous() { lanes * per_lane_reads * ASYNC_SLOTS_PER_READ } else { lanes * per_lane_reads };
    let slots = wanted.min(budget).min(plan.ops.len()).max(lanes);
    let staging = pool.acquire(plan.slot_bytes as usize, slots, staging_cap, opts.pinner)?;
    let slot_bytes = staging.slot_bytes() as u64;
    let mut all = staging.slots_mut();
    all.truncate(slots);
    let mut per_lane: Vec<Vec<&mut [u8]>> = (0..lanes).map(|_| Vec::new()).collect();
    for (i, s) in all.into_iter().enumerate() {
        per_lane[i % lanes].push(s);
    }
    report.lanes = lanes;
    report.queue_depth = qd;
    report.slots = slots;
    report.slot_bytes = slot_bytes;
    report.peak_staging_bytes = slots as u64 * slot_bytes;
    report.setup_secs = t1.elapsed().as_secs_f64();

    let shared = Shared {
        plan: &plan,
        files: req.files,
        sink,
        queue_depth: qd,
        next: AtomicUsize::new(0),
        abort: AtomicBool::new(false),
        cancel: opts.cancel,
        progress: opts.progress,
        faults: opts.faults,
    };
    let t2 = Instant::now();
    let results: Vec<Result<(LaneStats, Option<uring::RingInfo>), IoError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = per_lane
            .into_iter()
            .enumerate()
            .map(|(lane, slots)| {
                let shared = &shared;
                std::thread::Builder::new().name(format!("weightlift-io-{lane}")).spawn_scoped(scope, move || {
                    match backend {
                        "uring" => uring::run_lane(shared, lane, slots).map(|(s, i)| (s, Some(i))),
                        _ => pread::run_lane(shared, lane, slots).map(|s| (s, None)),
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| Err(IoError::Uring("an I/O thread panicked".into()))),
                Err(e) => {
                    shared.fail();
                    Err(IoError::Uring(format!("cannot start an I/O thread: {e}")))
                }
            })
            .collect()
    });
    report.io_secs = t2.elapsed().as_secs_f64();

    let mut first_err = None;
    for r in results {
        match r {
            Ok((stats, info)) => {
                report.stats.add(&stats);
                if let Some(info) = info {
                    report.fixed_buffers = info.fixed_buffers;
                    report.fixed_refusal = report.fixed_refusal.take().or(info.fixed_refusal);
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    if opts.cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
        return Err(IoError::Cancelled);
    }
    report.ops = report.stats.ops;
    report.direct_bytes = report.stats.direct_bytes;
    report.buffered_bytes = report.stats.buffered_bytes;
    Ok(report)
}

fn make_plan(
    req: &LoadRequest<'_>,
    residency: &[Option<Residency>],
    mode: DirectMode,
    chunk: u64,
    direct_chunk: u64,
    allow_direct: bool,
) -> Result<Plan, IoError> {
    let files: Vec<PlanFile> = req
        .files
        .iter()
        .map(|f| PlanFile {
            len: f.len,
            block: f.block,
            direct: allow_direct && f.supports_direct() && mode != DirectMode::Never,
        })
        .collect();
    let opts = PlanOptions { chunk, direct_chunk, coalesce_gap: (64 << 10).min(chunk) };
    let mut wants_direct = |file: u32, offset: u64, len: u64| match mode {
        DirectMode::Never => false,
        DirectMode::Always => true,
        DirectMode::Auto => residency[file as usize].as_ref().is_none_or(|r| r.fraction(offset, len) < RESIDENT_ENOUGH),
    };
    plan::plan(&files, req.extents, req.dest_lens, &opts, &mut wants_direct).map_err(|e| match e {
        PlanError::PastEnd { file, offset, len, file_len } => {
            IoError::PastEnd { path: req.files[file as usize].path.clone(), offset, len, file_len }
        }
        PlanError::Destination(m) => IoError::Destinations(m),
    })
}

fn choose_backend(config: &IoConfig) -> Result<(&'static str, String), IoError> {
    let origin = match config.backend.source {
        Source::Env => "WEIGHTLIFT_IO",
        _ => "the caller",
    };
    match config.backend.value {
        Backend::Pread => Ok(("pread", format!("pread chosen by {origin}"))),
        Backend::Uring => match uring::available() {
            Ok(()) => Ok(("uring", format!("io_uring chosen by {origin}"))),
            Err(e) => Err(IoError::Uring(format!("requested by {origin} but unavailable: {e}"))),
        },
        // cuFile and GPU-initiated NVMe are the engine crate's business (GPU loads); for the host pipeline they
        // mean `auto`.
        Backend::Auto | Backend::Gds | Backend::NvmeSim => match uring::available() {
            Ok(()) => Ok(("uring", "io_uring available".into())),
            Err(e) => Ok(("pread", format!("io_uring unavailable ({e}); using pread threads"))),
        },
    }
}

fn direct_reason(config: &IoConfig, files: &[OpenFile], resident: Option<u64>) -> String {
    let refused: Vec<String> =
        files.iter().filter_map(|f| f.direct_refused.as_ref().map(|r| format!("{}: {r}", f.path.display()))).collect();
    let base = match config.direct.value {
        DirectMode::Never => "never: buffered reads only".to_string(),
        DirectMode::Always => "always: O_DIRECT wherever the filesystem allows it".to_string(),
        DirectMode::Auto => {
            let total: u64 = files.iter().map(|f| f.len).sum();
            match resident {
                Some(r) => format!(
                    "auto: {r} of {total} bytes were in the page cache and are read buffered, the rest with O_DIRECT"
                ),
                None => "auto".to_string(),
            }
        }
    };
    if refused.is_empty() || config.direct.value == DirectMode::Never {
        base
    } else {
        format!("{base}; buffered where refused ({})", refused.join("; "))
    }
}
