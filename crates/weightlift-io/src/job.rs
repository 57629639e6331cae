//! A job: one load's plan, files and sink, served by the engine's lanes until every op is read and delivered.
//!
//! The lanes pull ops from the jobs in the engine's queue. A job knows which lanes joined it (each called
//! `Sink::begin_lane`), hands out its ops in plan order (a [`Gate`] may hold them back or skip them), records the
//! first error, and completes once no op is left to hand out and every lane that joined has left (its reads
//! drained, its deliveries finished, `Sink::end_lane` called).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::error::IoError;
use crate::fault::FaultPlan;
use crate::file::OpenFile;
use crate::plan::{Piece, Plan, ReadOp};
use crate::populate::ColdMaps;
use crate::reading::LaneStats;
use crate::sink::Sink;
use crate::staging::Pinner;

/// What a gate says about the next op in plan order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Read it now.
    Go,
    /// Do not read it (its destinations were served another way).
    Skip,
    /// Not yet: ask again when the engine is woken (`IoEngine::wake`).
    Wait,
}

/// Flow control of a streaming load: decides, op by op in plan order, whether to read it now.
pub trait Gate: Send + Sync {
    /// Whether to read `op`, the next op in plan order, now; `pieces` are the destination pieces it feeds. Called
    /// by whichever lane asks for work, with the job's lock held (so it must be quick and must not block), and
    /// asked again about the same op after [`Admit::Wait`] once the engine is woken.
    fn admit(&self, op: &ReadOp, pieces: &[Piece]) -> Admit;
}

/// Scheduling class: lanes serve foreground jobs before background ones (a streaming load reading ahead).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    Foreground,
    Background,
}

/// Something a job borrows or owns for its lifetime. Borrowed values are raw pointers with their lifetime erased:
/// they are dereferenced only while the job runs, and the code that submits a borrowing job waits until it has
/// completed (every lane left it) before the borrow ends.
pub(crate) enum Held<T: ?Sized + 'static> {
    Borrowed(*const T),
    Owned(Arc<T>),
}

impl<T: ?Sized> Held<T> {
    /// # Safety
    /// For `Borrowed`, the pointee must be alive: the job has not completed.
    pub unsafe fn get(&self) -> &T {
        match self {
            // SAFETY: per this function's contract.
            Held::Borrowed(p) => unsafe { &**p },
            Held::Owned(a) => a,
        }
    }
}

/// Per-lane progress of a job that the job merges into its report.
#[derive(Clone, Debug, Default)]
pub struct LaneTotals {
    pub stats: LaneStats,
    pub lanes: usize,
    pub fixed_buffers: bool,
    pub fixed_refusal: Option<String>,
    /// Why the kernel refused to populate cold ranges in 2 MiB folios, the first time it did.
    pub populate_refusal: Option<String>,
}

struct State {
    /// Next op to hand out.
    cursor: usize,
    /// No op is left to hand out (all handed out, or the job failed or was cancelled).
    exhausted: bool,
    joined: Vec<bool>,
    lanes_in: usize,
    error: Option<IoError>,
    totals: LaneTotals,
    completed: bool,
    skipped_ops: u64,
}

/// One load being served by the lanes.
pub struct Job {
    pub(crate) plan: Plan,
    pub(crate) files: Vec<Arc<OpenFile>>,
    pub(crate) sink: Held<dyn Sink>,
    pub(crate) gate: Option<Held<dyn Gate>>,
    pub(crate) progress: Option<Held<AtomicU64>>,
    pub(crate) cancel: Option<Held<AtomicBool>>,
    pub(crate) faults: Option<Held<FaultPlan>>,
    pub(crate) pinner: Option<Arc<dyn Pinner>>,
    pub(crate) priority: Priority,
    /// Reads in flight per lane.
    pub(crate) queue_depth: usize,
    /// Slots each lane needs for this job, and their size.
    pub(crate) slots_per_lane: usize,
    pub(crate) slot_bytes: u64,
    /// Lanes with an index below this serve the job (the staging bound may not feed them all).
    pub(crate) max_lanes: usize,
    /// Mappings that populate cold ranges in 2 MiB folios (`cache_pages = huge` and the plan has cold reads).
    pub(crate) cold_maps: Option<ColdMaps>,
    abort: AtomicBool,
    state: Mutex<State>,
    done: Condvar,
}

// SAFETY: the raw pointers in `Held::Borrowed` point to `Sync` values (sinks, gates, atomics, fault plans are all
// `Sync`) that outlive the job's run; everything else is `Send + Sync`.
unsafe impl Send for Job {}
// SAFETY: as above.
unsafe impl Sync for Job {}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("ops", &self.plan.ops.len()).field("priority", &self.priority).finish()
    }
}

/// How a job is built (see `IoEngine::submit`).
pub(crate) struct JobParts {
    pub plan: Plan,
    pub files: Vec<Arc<OpenFile>>,
    pub sink: Held<dyn Sink>,
    pub gate: Option<Held<dyn Gate>>,
    pub progress: Option<Held<AtomicU64>>,
    pub cancel: Option<Held<AtomicBool>>,
    pub faults: Option<Held<FaultPlan>>,
    pub pinner: Option<Arc<dyn Pinner>>,
    pub priority: Priority,
    pub queue_depth: usize,
    pub slots_per_lane: usize,
    pub slot_bytes: u64,
    pub max_lanes: usize,
    pub lanes: usize,
    /// Populate cold ranges through huge-page mappings before reading them.
    pub populate: bool,
}

impl Job {
    pub(crate) fn new(p: JobParts) -> Job {
        let empty = p.plan.ops.is_empty();
        let cold_maps = (p.populate && p.plan.ops.iter().any(|o| o.cold)).then(|| ColdMaps::new(p.files.len()));
        Job {
            plan: p.plan,
            files: p.files,
            sink: p.sink,
            gate: p.gate,
            progress: p.progress,
            cancel: p.cancel,
            faults: p.faults,
            pinner: p.pinner,
            priority: p.priority,
            queue_depth: p.queue_depth.max(1),
            slots_per_lane: p.slots_per_lane.max(1),
            slot_bytes: p.slot_bytes,
            max_lanes: p.max_lanes.max(1),
            cold_maps,
            abort: AtomicBool::new(false),
            state: Mutex::new(State {
                cursor: 0,
                exhausted: empty,
                joined: vec![false; p.lanes],
                lanes_in: 0,
                error: None,
                totals: LaneTotals::default(),
                completed: false,
                skipped_ops: 0,
            }),
            done: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sink. Valid while the job has not completed, which holds whenever a lane or the submitter asks.
    pub(crate) fn sink(&self) -> &dyn Sink {
        // SAFETY: lanes call this only for jobs they joined and have not left (so the job has not completed); the
        // submitter keeps a borrowed sink alive until completion.
        unsafe { self.sink.get() }
    }

    pub(crate) fn faults(&self) -> Option<&FaultPlan> {
        // SAFETY: as for `sink`.
        self.faults.as_ref().map(|f| unsafe { f.get() })
    }

    pub(crate) fn add_progress(&self, bytes: u64) {
        if let Some(p) = &self.progress {
            // SAFETY: as for `sink`.
            unsafe { p.get() }.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    fn cancelled(&self) -> bool {
        // SAFETY: as for `sink`.
        self.cancel.as_ref().is_some_and(|c| unsafe { c.get() }.load(Ordering::Relaxed))
    }

    /// Whether the job is stopping: failed, or cancelled by its caller (asked while a read of the job is in
    /// flight, so the caller is still waiting and the flag it lent is alive).
    pub(crate) fn stopping(&self) -> bool {
        self.aborted() || self.cancelled()
    }

    /// Whether the job stopped early (an error or a cancellation).
    pub(crate) fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }

    /// Records `e` (the first error wins) and stops handing out ops.
    pub(crate) fn fail(&self, e: IoError) {
        self.abort.store(true, Ordering::Relaxed);
        let mut s = self.lock();
        s.exhausted = true;
        s.error.get_or_insert(e);
        self.try_complete(&mut s);
    }

    /// The next op for `lane`, and whether the lane joins the job with it (then it must call `begin_lane`).
    /// `None` when nothing is to be read now.
    pub(crate) fn take_op(&self, lane: usize) -> Option<(usize, bool)> {
        if lane >= self.max_lanes {
            return None;
        }
        let mut s = self.lock();
        if s.exhausted {
            return None;
        }
        // Read under the lock while the job is not exhausted: its caller is still waiting, so the flag it lent is
        // alive (a job failed by another thread, with no lane in it, completes and lets its caller go at once).
        if self.cancelled() && !self.aborted() {
            drop(s);
            self.fail(IoError::Cancelled);
            return None;
        }
        let op = loop {
            let i = s.cursor;
            let Some(op) = self.plan.ops.get(i) else {
                s.exhausted = true;
                self.try_complete(&mut s);
                return None;
            };
            // SAFETY: the gate is alive while the job runs (see `sink`).
            let verdict =
                self.gate.as_ref().map_or(Admit::Go, |g| unsafe { g.get() }.admit(op, self.plan.pieces_of(op)));
            match verdict {
                Admit::Go => {
                    s.cursor += 1;
                    break i;
                }
                Admit::Skip => {
                    s.cursor += 1;
                    s.skipped_ops += 1;
                }
                Admit::Wait => return None,
            }
        };
        let joins = !s.joined.get(lane).copied().unwrap_or(true);
        if joins {
            s.joined[lane] = true;
            s.lanes_in += 1;
            s.totals.lanes += 1;
        }
        Some((op, joins))
    }

    /// Whether no op is left for lanes to take (so a lane with nothing of this job in flight may leave it).
    pub(crate) fn drained_of_ops(&self) -> bool {
        let s = self.lock();
        s.exhausted || s.cursor >= self.plan.ops.len()
    }

    /// A lane that joined leaves, adding what it counted; the job completes when the last one leaves after the
    /// ops ran out.
    pub(crate) fn leave(&self, lane: usize, totals: &LaneTotals) {
        let mut s = self.lock();
        if let Some(j) = s.joined.get_mut(lane).filter(|j| **j) {
            *j = false;
            s.lanes_in -= 1;
        }
        s.totals.stats.add(&totals.stats);
        s.totals.fixed_buffers |= totals.fixed_buffers;
        if s.totals.fixed_refusal.is_none() {
            s.totals.fixed_refusal.clone_from(&totals.fixed_refusal);
        }
        self.try_complete(&mut s);
    }

    /// Completes the job if nothing is left to do; returns whether it is complete.
    pub(crate) fn check_complete(&self) -> bool {
        self.try_complete(&mut self.lock())
    }

    fn try_complete(&self, s: &mut State) -> bool {
        if s.cursor >= self.plan.ops.len() {
            s.exhausted = true;
        }
        if !s.completed && s.exhausted && s.lanes_in == 0 {
            s.completed = true;
            self.done.notify_all();
        }
        s.completed
    }

    /// A copy of the error the job failed with, if it failed.
    pub(crate) fn error(&self) -> Option<IoError> {
        self.lock().error.as_ref().map(IoError::duplicate)
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.lock().completed
    }

    /// Waits for completion; returns the first error or what the lanes counted, and the ops skipped by the gate.
    pub(crate) fn wait(&self) -> (Result<LaneTotals, IoError>, u64) {
        let mut s = self.lock();
        while !s.completed {
            s = self.done.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        let skipped = s.skipped_ops;
        match s.error.take() {
            Some(e) => (Err(e), skipped),
            None => {
                let mut totals = s.totals.clone();
                totals.populate_refusal = self.cold_maps.as_ref().and_then(ColdMaps::refusal);
                (Ok(totals), skipped)
            }
        }
    }

    /// Waits up to `timeout` for completion; true once complete.
    pub(crate) fn wait_timeout(&self, timeout: std::time::Duration) -> bool {
        let s = self.lock();
        if s.completed {
            return true;
        }
        let (s, _) = self.done.wait_timeout(s, timeout).unwrap_or_else(|p| p.into_inner());
        s.completed
    }
}
