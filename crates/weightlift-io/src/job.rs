//! A job: one load's plan, files and sink, served by the engine's lanes until every op is read and delivered.
//!
//! The lanes pull ops from the jobs in the engine's queue. A job knows which lanes joined it (each called
//! `Sink::begin_lane`), hands out its ops in plan order (a [`Gate`] may hold them back or skip them), records the
//! first error, and completes once no op is left to hand out and every lane that joined has left (its reads
//! drained, its deliveries finished, `Sink::end_lane` called).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use weightlift_remote::{GetStream, Throttle};

use crate::error::IoError;
use crate::fault::FaultPlan;
use crate::file::OpenFile;
use crate::pacer::{GetsReport, Pacer};
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
    /// The GETs in flight of a load of objects, and why.
    pub gets: Option<GetsReport>,
}

/// Parts of one GET a lane may hold at once: one filling while the next waits, so that the GET never waits for a
/// lane to give it somewhere to put its bytes.
pub(crate) const LOOKAHEAD: usize = 2;

/// A GET of the job in flight: ops `first..end` are its parts, handed to lanes up to `next`.
struct OpenGet {
    first: usize,
    end: usize,
    next: usize,
    /// Parts handed out whose bytes have not all landed.
    queued: usize,
    /// Parts whose bytes have not all landed, handed out or not.
    unfinished: usize,
    stream: Arc<GetStream>,
}

/// For an object's op: the GET that serves it, and its part there.
pub(crate) type Part = Option<(Arc<GetStream>, usize)>;

/// What opening a GET came to.
enum Opened {
    /// Its first part, handed out.
    Took(usize, Part),
    /// The gate skipped the op the GET would have started at: look again.
    Skipped,
    /// Nothing to read now.
    Wait,
}

/// An op handed to a lane: its index, whether the lane joins the job with it (then it must call `begin_lane`), and
/// for an object's op the GET that serves it and its part there; `drained`: it was the job's last op to hand out
/// (the lanes waiting idle in the job may leave it now).
pub(crate) struct Taken {
    pub op: usize,
    pub joins: bool,
    pub part: Part,
    pub drained: bool,
}

/// What a part's landing changed for the other lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Landed {
    /// Nothing another lane could do now.
    Nothing,
    /// A part (or a new GET) may be taken.
    Work,
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
    /// GETs in flight (a load of objects).
    gets: Vec<OpenGet>,
    /// How many GETs to keep in flight (a load of objects).
    pacer: Option<Pacer>,
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
    /// What the servers of the job's objects said about throttling (one per origin).
    throttles: Vec<Arc<Throttle>>,
    /// The `remote_concurrency` setting, for the report.
    concurrency_setting: String,
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
    /// How many GETs to keep in flight, where the plan reads objects, and the setting it comes from.
    pub pacer: Option<(Pacer, String)>,
}

impl Job {
    pub(crate) fn new(p: JobParts) -> Job {
        let empty = p.plan.ops.is_empty();
        let cold_maps = (p.populate && p.plan.ops.iter().any(|o| o.cold)).then(|| ColdMaps::new(p.files.len()));
        let mut throttles: Vec<Arc<Throttle>> = Vec::new();
        for o in p.files.iter().filter_map(|f| f.object()) {
            if !throttles.iter().any(|t| Arc::ptr_eq(t, o.throttle())) {
                throttles.push(o.throttle().clone());
            }
        }
        let (pacer, concurrency_setting) = match p.pacer {
            Some((pacer, setting)) if !p.plan.groups.is_empty() => (Some(pacer), setting),
            _ => (None, String::new()),
        };
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
            throttles,
            concurrency_setting,
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
                gets: Vec::new(),
                pacer,
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
        let mut s = self.lock();
        self.fail_locked(&mut s, e);
    }

    fn fail_locked(&self, s: &mut State, e: IoError) {
        self.abort.store(true, Ordering::Relaxed);
        s.exhausted = true;
        s.error.get_or_insert(e);
        // The GETs in flight end (their streams stop: the job aborted); their parts with lanes fail there.
        s.gets.clear();
        self.try_complete(s);
    }

    /// The next op for `lane` (`None` when nothing is to be read now): a part of a GET in flight that has the
    /// fewest parts waiting with lanes, else the next op in plan order, opening its GET where it reads an object
    /// and the pacer lets one more GET fly.
    pub(crate) fn take_op(self: &Arc<Self>, lane: usize) -> Option<Taken> {
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
        let (op, part) = match Self::next_part(&mut s) {
            Some(taken) => taken,
            None => self.next_in_order(&mut s)?,
        };
        let joins = !s.joined.get(lane).copied().unwrap_or(true);
        if joins {
            s.joined[lane] = true;
            s.lanes_in += 1;
            s.totals.lanes += 1;
        }
        let drained = part.is_some() && self.handed_out(&s);
        Some(Taken { op, joins, part, drained })
    }

    /// Whether every op has been handed out (or skipped).
    fn handed_out(&self, s: &State) -> bool {
        s.cursor >= self.plan.ops.len() && s.gets.iter().all(|g| g.next == g.end)
    }

    /// The next part of the GET in flight with the fewest parts waiting with lanes (fewer than [`LOOKAHEAD`]).
    fn next_part(s: &mut State) -> Option<(usize, Part)> {
        let g = s.gets.iter_mut().filter(|g| g.next < g.end && g.queued < LOOKAHEAD).min_by_key(|g| g.queued)?;
        let op = g.next;
        g.next += 1;
        g.queued += 1;
        Some((op, Some((g.stream.clone(), op - g.first))))
    }

    /// The next op in plan order that the gate lets through: a local read, or the first part of a new GET.
    fn next_in_order(self: &Arc<Self>, s: &mut State) -> Option<(usize, Part)> {
        loop {
            let i = s.cursor;
            if i >= self.plan.ops.len() {
                if self.handed_out(s) {
                    s.exhausted = true;
                    self.try_complete(s);
                }
                return None;
            }
            let groups = &self.plan.groups;
            let g = groups.partition_point(|g| g.end <= i);
            if let Some(group) = groups.get(g).filter(|g| g.start <= i) {
                let group = i..group.end;
                if s.pacer.as_ref().is_some_and(|p| s.gets.len() >= p.target()) {
                    return None;
                }
                match self.open_get(s, group) {
                    Opened::Took(op, part) => return Some((op, part)),
                    Opened::Skipped => continue,
                    Opened::Wait => return None,
                }
            }
            match self.admit(i) {
                Admit::Go => {
                    s.cursor += 1;
                    return Some((i, None));
                }
                Admit::Skip => {
                    s.cursor += 1;
                    s.skipped_ops += 1;
                }
                Admit::Wait => return None,
            }
        }
    }

    fn admit(&self, i: usize) -> Admit {
        let op = &self.plan.ops[i];
        // SAFETY: the gate is alive while the job runs (see `sink`).
        self.gate.as_ref().map_or(Admit::Go, |g| unsafe { g.get() }.admit(op, self.plan.pieces_of(op)))
    }

    /// Opens a GET for the ops of `group` the gate lets through, from its first on, and hands out its first part
    /// (`Wait` where the gate holds the first op back, or the GET cannot start: the job failed).
    fn open_get(self: &Arc<Self>, s: &mut State, group: std::ops::Range<usize>) -> Opened {
        let first = group.start;
        let mut end = first;
        for i in group {
            match self.admit(i) {
                Admit::Go => end = i + 1,
                Admit::Skip if end == first => {
                    s.cursor += 1;
                    s.skipped_ops += 1;
                    return Opened::Skipped;
                }
                Admit::Skip | Admit::Wait => break,
            }
        }
        if end == first {
            return Opened::Wait;
        }
        let ops = &self.plan.ops[first..end];
        let object = self.files.get(ops[0].file as usize).and_then(|f| f.object());
        let Some(object) = object else {
            self.fail_locked(s, IoError::Destinations("a GET planned for a file that is not an object".into()));
            return Opened::Wait;
        };
        let weak = Arc::downgrade(self);
        // The job's own flag only: the caller's cancel flag may be gone once the job completes, and a stream can
        // outlive that; each part's reader asks the caller's flag while the part is in flight.
        let stop: weightlift_remote::Stop = Arc::new(move || weak.upgrade().is_none_or(|j| j.aborted()));
        let parts = ops.iter().map(|o| o.offset..o.offset + o.valid).collect();
        let stream = match GetStream::new(object, parts, stop) {
            Ok(stream) => Arc::new(stream),
            Err(e) => {
                self.fail_locked(s, IoError::Remote(e));
                return Opened::Wait;
            }
        };
        s.cursor = end;
        s.gets.push(OpenGet {
            first,
            end,
            next: first + 1,
            queued: 1,
            unfinished: end - first,
            stream: stream.clone(),
        });
        let in_flight = s.gets.len();
        if let Some(p) = s.pacer.as_mut() {
            p.opened(Instant::now(), in_flight);
        }
        Opened::Took(first, Some((stream, 0)))
    }

    /// Op `op`, a part of a GET, has all its bytes (or failed): the GET's count goes down, and the GET leaves the
    /// job once its last part has; the pacer counts the bytes. Says whether another lane may find work now.
    pub(crate) fn part_landed(&self, op: usize) -> Landed {
        let mut s = self.lock();
        let Some(i) = s.gets.iter().position(|g| g.first <= op && op < g.end) else { return Landed::Nothing };
        let g = &mut s.gets[i];
        g.queued = g.queued.saturating_sub(1);
        g.unfinished = g.unfinished.saturating_sub(1);
        let finished = g.unfinished == 0;
        if finished {
            s.gets.swap_remove(i);
        }
        let throttled = self.throttles.iter().map(|t| t.answers()).sum();
        let bytes = self.plan.ops.get(op).map_or(0, |o| o.valid);
        if let Some(p) = s.pacer.as_mut() {
            p.landed(Instant::now(), bytes, usize::from(finished), throttled);
        }
        let part_ready = s.gets.iter().any(|g| g.next < g.end && g.queued < LOOKAHEAD);
        let get_ready = s.cursor < self.plan.ops.len() && s.pacer.as_ref().is_none_or(|p| s.gets.len() < p.target());
        if part_ready || get_ready { Landed::Work } else { Landed::Nothing }
    }

    /// Whether no op is left for lanes to take (so a lane with nothing of this job in flight may leave it).
    pub(crate) fn drained_of_ops(&self) -> bool {
        let s = self.lock();
        s.exhausted || self.handed_out(&s)
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
        if self.handed_out(s) {
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
                totals.gets = s.pacer.as_ref().map(|p| p.summary(&self.concurrency_setting));
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
