//! A lane: one persistent I/O thread with its kernel interface (an io_uring ring, or blocking `pread`) and its own
//! staging slots, serving the engine's jobs for as long as the engine lives. Threads, rings, staging (mapped,
//! populated, pinned, registered as a fixed buffer) are paid for once, not per load.
//!
//! A slot is free, holds a read in flight, or holds bytes being delivered (a device copy may still read it). The
//! loop: finish deliveries that are done, issue reads while slots and queue depth allow, wait for completions, and
//! when a job has no op left and nothing of it is in this lane, leave it. Every read's result goes through
//! [`Reading::on_result`].

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{IoError, panic_text};
use crate::file::Source;
use crate::job::{Job, LaneTotals};
use crate::queue::{Shared, Work};
use crate::reading::{Next, Reading, in_place_targets, iovecs};
use crate::sink::Pending;
use crate::staging::{Pinner, Staging};
use crate::submit::{Submission, Submitter};

use crate::job::Part;

enum Slot {
    Free,
    Reading { job: Arc<Job>, op: usize, reading: Reading, in_place: Option<InPlaceIo>, part: Part },
    Delivering { job: Arc<Job>, op: usize, pending: Box<dyn Pending> },
}

/// Destinations of an op read in place, and the iovecs of its read in flight (the kernel reads them).
struct InPlaceIo {
    targets: Vec<(*mut u8, usize)>,
    iov: Vec<libc::iovec>,
}

/// A job this lane has joined, with what it counted for it and what of it is in the lane.
struct Joined {
    job: Arc<Job>,
    totals: LaneTotals,
    /// Slots holding a read or a delivery of the job.
    busy: usize,
    /// Reads of the job in flight.
    inflight: usize,
}

/// Lanes pin their staging and register it with their ring one at a time, process-wide; they map and fault it in
/// at once (the kernel alone, see [`Staging::map`]). Set up all at once (a first load: every lane maps, faults in
/// and pins its slots, registers them with its ring) they slowed each other and the device allocation running
/// beside them: on the H100 machine a first load of 4.13 GB with 16 lanes took 1.51× the second (allocation 59 ms),
/// one at a time 1.29× (allocation 7 ms), the warm rate unchanged (bench/results/2026-11-24-h100-k at b3a4ec8). The first lane
/// ready starts reading while the others set up. On huge pages, at once against one at a time was measured again
/// (bench/results/2026-11-24-h100-zi at b3a4ec8): a fresh Python process's first load gained (median 1.243× the second against
/// 1.307), a fresh engine's in `weightlift bench` lost (1.21–1.24× against 1.09–1.10). Faulting in at once and
/// pinning one at a time beat both in bench/results/2026-11-25-h100-o at b3a4ec8 (a fresh process's first load of 1.25 GB in
/// 0.069 s against 0.079 fully one at a time; 4.49 GB in 0.125 s against 0.155; medians of 9).
static SETTING_UP: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) struct Lane {
    pub id: usize,
    // Declared before `staging`: the kernel interface (a ring with reads possibly in flight into the slots, and the
    // fixed-buffer registration) goes first.
    io: Box<dyn Submitter>,
    staging: Option<Staging>,
    fixed: bool,
    fixed_refusal: Option<String>,
    /// Staging set-up time, and time waiting for other lanes' set-ups, not yet counted into a joined job's totals.
    setup_pending: (std::time::Duration, std::time::Duration),
    pool: Arc<Shared>,
    slots: Vec<Slot>,
    delivering: VecDeque<usize>,
    inflight: usize,
    /// Reads handed to the kernel interface, and completions taken back from it: their difference is what may still
    /// write into memory, whatever state the lane's own bookkeeping is left in by a panic.
    pushed: u64,
    reaped: u64,
    joined: Vec<Joined>,
    /// The engine's staging-release request this lane last honoured.
    released_epoch: u64,
    /// The engine's staging set-up request this lane last answered.
    asked_epoch: u64,
}

// SAFETY: the raw pointers in slots and iovecs point into this lane's staging or into destinations that the job's
// sink vouches for (`InPlace`); the lane is moved into its thread once and used only there.
unsafe impl Send for Lane {}

impl Lane {
    pub fn new(id: usize, io: Box<dyn Submitter>, pool: Arc<Shared>) -> Lane {
        Lane {
            id,
            io,
            staging: None,
            fixed: false,
            setup_pending: Default::default(),
            fixed_refusal: None,
            pool,
            slots: Vec::new(),
            delivering: VecDeque::new(),
            inflight: 0,
            pushed: 0,
            reaped: 0,
            joined: Vec::new(),
            released_epoch: 0,
            asked_epoch: 0,
        }
    }

    /// Serves jobs until the engine shuts down. A panic (a bug) marks the engine broken, so that later loads and
    /// set-up requests fail with its reason. The jobs the lane had joined, and those still queued, fail too, once
    /// nothing the lane started can still write into memory their callers would free: every read pushed to the
    /// kernel has completed, every delivery recorded in a slot has ended, and each joined job's sink has finished
    /// the lane's part (`Sink::end_lane`: a device sink waits for the lane's stream, so a copy queued just before the
    /// panic ends too). If that cannot be made sure (the kernel interface fails, a sink cannot end, or the draining
    /// panics as well), the jobs it joined keep waiting rather than hand back memory that may still be written, and
    /// the lane's own memory is leaked; queued jobs it never joined fail either way.
    pub fn run(mut self) {
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()));
        let safe_to_drop = match served {
            Ok(safe) => safe,
            Err(p) => {
                let why = format!("lane {} panicked: {}", self.id, panic_text(&*p));
                self.pool.mark_broken(&why);
                let drained = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.drain()));
                let drained = drained.unwrap_or(false);
                if drained {
                    self.abandon(&IoError::Panicked(why.clone()));
                }
                // Jobs this lane never joined hold nothing of it: they fail either way.
                self.pool.fail_queued(&IoError::Panicked(why));
                drained
            }
        };
        self.pool.notify();
        if !safe_to_drop {
            // Reads may still be in flight into the staging (and the ring holds them): unmapping it would let the
            // kernel write into whatever is mapped there next. The lane's memory is leaked instead.
            tracing::error!("lane {}: reads still in flight after a failure; its memory is not returned", self.id);
            std::mem::forget(self);
        }
    }

    /// Waits for every read still with the kernel, every delivery recorded in a slot, and every joined job's sink
    /// to finish this lane's part. Returns whether nothing of this lane can still write into memory.
    fn drain(&mut self) -> bool {
        let mut done = Vec::new();
        let mut failures = 0;
        while self.pushed > self.reaped {
            done.clear();
            match self.io.complete(&mut done) {
                Ok(()) => self.reaped += done.len() as u64,
                Err(_) if failures < 50 => {
                    failures += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(_) => return false,
            }
        }
        self.wait_deliveries();
        let mut ended = true;
        for j in &self.joined {
            ended &= j.job.sink().end_lane(self.id).is_ok();
        }
        ended
    }

    /// Waits for every delivery recorded in a slot (a device copy that may still read the staging or write the
    /// job's destinations), and frees those slots.
    fn wait_deliveries(&mut self) {
        self.delivering.clear();
        for slot in &mut self.slots {
            if let Slot::Delivering { pending, .. } = std::mem::replace(slot, Slot::Free) {
                let _ = pending.wait();
            }
        }
    }

    /// The lane's loop. Returns whether the lane may be dropped (false: reads may still be in flight).
    fn serve(&mut self) -> bool {
        let mut done = Vec::new();
        loop {
            let seen = self.pool.generation();
            self.reap();
            // Leave finished jobs before taking more work: setting up for another job may wait for the other
            // lanes' pinning (one at a time), and a finished job's caller would wait that long too.
            self.leave_finished();
            let took = self.fill();
            if self.inflight > 0 {
                done.clear();
                if let Err(e) = self.io.complete(&mut done) {
                    // The ring cannot make progress: nothing of this lane can finish. Its jobs fail once nothing
                    // of the lane can still write into their memory (`drain`); where that cannot be made sure, they
                    // keep waiting (the engine is broken: later loads fail with the reason).
                    self.pool.mark_broken(&format!("lane {}: {e}", self.id));
                    let drained = self.drain();
                    if drained {
                        self.abandon(&e);
                    }
                    self.pool.fail_queued(&e);
                    return drained;
                }
                self.reaped += done.len() as u64;
                for (user_data, result) in done.drain(..) {
                    self.on_completion(user_data as usize, result);
                }
                continue;
            }
            if let Some(&slot) = self.delivering.front() {
                self.wait_delivery(slot);
                continue;
            }
            self.leave_finished();
            self.release_if_asked();
            self.set_up_if_asked();
            if took {
                continue;
            }
            if !self.pool.idle_wait(seen) {
                return true;
            }
        }
    }

    /// Finishes the deliveries at the head of the queue that are done.
    fn reap(&mut self) {
        while let Some(&slot) = self.delivering.front() {
            let Slot::Delivering { pending, .. } = &mut self.slots[slot] else {
                self.delivering.pop_front();
                continue;
            };
            match pending.poll() {
                Ok(false) => return,
                Ok(true) => self.finish_delivery(slot, Ok(())),
                Err(_) => self.wait_delivery(slot),
            }
        }
    }

    /// Blocks until the delivery in `slot` is done.
    fn wait_delivery(&mut self, slot: usize) {
        let t = Instant::now();
        let (pending, job) = match &mut self.slots[slot] {
            Slot::Delivering { pending, job, .. } => (std::mem::replace(pending, Box::new(Done)), job.clone()),
            _ => {
                self.delivering.retain(|&s| s != slot);
                return;
            }
        };
        let result = pending.wait();
        self.joined_of(&job).totals.stats.backpressure += t.elapsed();
        self.finish_delivery(slot, result);
    }

    fn finish_delivery(&mut self, slot: usize, result: Result<(), crate::sink::SinkError>) {
        self.delivering.retain(|&s| s != slot);
        if let Slot::Delivering { job, op, .. } = std::mem::replace(&mut self.slots[slot], Slot::Free) {
            match result {
                Ok(()) => {
                    let o = &job.plan.ops[op];
                    job.sink().landed(job.plan.pieces_of(o));
                    job.add_progress(o.valid);
                }
                Err(e) => job.fail(IoError::Sink(e)),
            }
            self.joined_of(&job).busy -= 1;
        }
    }

    fn joined_of(&mut self, job: &Arc<Job>) -> &mut Joined {
        let i = self.joined.iter().position(|j| Arc::ptr_eq(&j.job, job)).unwrap_or_else(|| {
            self.joined.push(Joined { job: job.clone(), totals: LaneTotals::default(), busy: 0, inflight: 0 });
            self.joined.len() - 1
        });
        &mut self.joined[i]
    }

    /// Whether the lane may take another op of `job` now (its queue depth and slot share).
    pub fn has_room_for(&self, job: &Arc<Job>) -> bool {
        let (busy, inflight) =
            self.joined.iter().find(|j| Arc::ptr_eq(&j.job, job)).map_or((0, 0), |j| (j.busy, j.inflight));
        busy < job.slots_per_lane && inflight < job.queue_depth && self.free_slot().is_some()
    }

    /// Whether this lane's staging can serve `job` as it is.
    pub fn staging_fits(&self, job: &Job) -> bool {
        self.staging_holds(job.slot_bytes, job.slots_per_lane, job.pinner.is_some())
    }

    /// Whether this lane's staging has `slots` slots of `slot_bytes` at least, pinned if `pinned` is asked.
    fn staging_holds(&self, slot_bytes: u64, slots: usize, pinned: bool) -> bool {
        self.staging
            .as_ref()
            .is_some_and(|s| s.slot_bytes() as u64 >= slot_bytes && s.slots() >= slots && (!pinned || s.is_pinned()))
    }

    pub fn is_idle(&self) -> bool {
        self.inflight == 0 && self.delivering.is_empty() && self.slots.iter().all(|s| matches!(s, Slot::Free))
    }

    /// The next thing this lane should do: foreground jobs first, then background, each in submission order.
    fn next_work(&self) -> Work {
        let lane = self;
        let (job, taken) = {
            let q = self.pool.lock();
            let mut found = None;
            for job in &q.jobs {
                if lane.id >= job.max_lanes || job.drained_of_ops() {
                    continue;
                }
                if !lane.staging_fits(job) {
                    if lane.is_idle() {
                        return Work::Restage(job.clone());
                    }
                    continue;
                }
                if !lane.has_room_for(job) {
                    continue;
                }
                if let Some(taken) = job.take_op(lane.id) {
                    found = Some((job.clone(), taken));
                    break;
                }
            }
            match found {
                Some(f) => f,
                None => return Work::None,
            }
        };
        if taken.drained {
            // Lanes of the job waiting idle for its parts may leave it now.
            self.pool.notify();
        }
        Work::Op { job, op: taken.op, joins: taken.joins, part: taken.part }
    }

    fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(|s| matches!(s, Slot::Free))
    }

    /// Issues reads while there is room; returns whether anything was taken.
    fn fill(&mut self) -> bool {
        let mut took = false;
        loop {
            let work = self.next_work();
            match work {
                Work::None => return took,
                Work::Restage(job) => {
                    let (took, waited, restaged) =
                        self.restage(job.slot_bytes, job.slots_per_lane, job.pinner.as_deref());
                    // Counted into the job's totals when this lane joins it. Not through `joined_of`: a lane that
                    // never joins must not hold the job as joined (leaving it would call its sink, which the job's
                    // caller may have dropped by then: the job can complete while this lane waited to set up).
                    self.setup_pending.0 += took;
                    self.setup_pending.1 += waited;
                    if let Err(e) = restaged {
                        job.fail(e);
                    } else if !self.staging_fits(&job) {
                        // Asked again, the pool would answer "restage" forever: fail the job rather than spin.
                        job.fail(IoError::StagingUnfit(format!(
                            "lane {}: staging of {} slots of {} bytes cannot be made within {} bytes per lane",
                            self.id,
                            job.slots_per_lane,
                            job.slot_bytes,
                            self.pool.staging_per_lane()
                        )));
                    }
                }
                Work::Op { job, op, joins, part } => {
                    took = true;
                    if joins {
                        self.join(&job);
                    }
                    self.start(job, op, part);
                }
            }
        }
    }

    fn join(&mut self, job: &Arc<Job>) {
        tracing::debug!(lane = self.id, "joined a job");
        let (fixed, refusal) = (self.fixed, self.fixed_refusal.clone());
        let (setup, wait) = std::mem::take(&mut self.setup_pending);
        let j = self.joined_of(job);
        j.totals.fixed_buffers = fixed;
        j.totals.fixed_refusal = refusal;
        j.totals.stats.setup += setup;
        j.totals.stats.setup_wait += wait;
        if let Err(e) = job.sink().begin_lane(self.id) {
            job.fail(IoError::Sink(e));
        }
    }

    /// (Re)allocates this idle lane's staging to hold `slots_per_lane` slots of `slot_bytes` (pinned with `pinner`
    /// if given), keeping larger slots and more of them if it had them. Answers the time it took, less the time it
    /// waited for other lanes (see [`SETTING_UP`]), and that wait.
    fn restage(
        &mut self,
        slot_bytes: u64,
        slots_per_lane: usize,
        pinner: Option<&dyn Pinner>,
    ) -> (Duration, Duration, Result<(), IoError>) {
        let t = Instant::now();
        let mut waited = Duration::ZERO;
        let mut one_at_a_time = || {
            let w = Instant::now();
            let guard = SETTING_UP.lock().unwrap_or_else(|p| p.into_inner());
            waited += w.elapsed();
            guard
        };
        let result = 'set_up: {
            if let Some(s) = self.staging.as_mut()
                && s.slot_bytes() as u64 >= slot_bytes
                && s.slots() >= slots_per_lane
            {
                if let (Some(p), false) = (pinner, s.is_pinned()) {
                    let _one = one_at_a_time();
                    // Staging made for a host load is pinned for the device only now, and io_uring holds its
                    // pages as fixed buffers: pin with the buffers unregistered, then register them again, the
                    // order that staging made for a device load has (pinned, then registered).
                    // SAFETY: the lane is idle (restaging happens between jobs): no read is in flight into it.
                    unsafe { self.io.register(None) };
                    let pinned = s.pin(p);
                    self.register_staging();
                    break 'set_up pinned;
                }
                break 'set_up Ok(());
            }
            let (old_bytes, old_slots) = self.staging.as_ref().map_or((0, 0), |s| (s.slot_bytes() as u64, s.slots()));
            let cap = self.pool.staging_per_lane().max(slot_bytes);
            // Larger slots (and more of them) are kept only while the lane's share still holds as many as the job
            // asks for. Keeping them regardless left a lane that one cold load had given one large slot unable ever
            // to serve a warm load that asks for two smaller ones: it restaged forever (the hang after cold GPU
            // loads of bench/results/2026-11-24-h100 at b3a4ec8/hang-after-cold-loads; test tests/restage.rs).
            let keep = old_bytes.next_multiple_of(4096) * slots_per_lane as u64 <= cap;
            let slot_bytes = if keep { slot_bytes.max(old_bytes) } else { slot_bytes }.next_multiple_of(4096);
            let old_slots = if keep { old_slots } else { 0 };
            let slots = slots_per_lane.max(old_slots).min((cap / slot_bytes).max(1) as usize).max(1);
            // The old staging goes first, so that a lane never holds two (dropping it unpins it: a driver call,
            // made one lane at a time like the pinning).
            if self.staging.is_some() {
                let _one = one_at_a_time();
                // SAFETY: the lane is idle (no read in flight), and the old region stays mapped until after this call.
                unsafe { self.io.register(None) };
                self.staging = None;
                self.slots.clear();
            }
            // Mapped and faulted in by every lane at once (the kernel zeroing pages, no driver call); pinned and
            // registered one lane at a time (see `SETTING_UP`).
            let mapping = Instant::now();
            let mut staging = match Staging::map(slot_bytes as usize, slots, self.pool.staging_pages()) {
                Ok(s) => s,
                Err(e) => break 'set_up Err(e),
            };
            let mapped = mapping.elapsed();
            let one = one_at_a_time();
            let locked = Instant::now();
            // SAFETY: the lane is idle and holds no staging: nothing is in flight, nothing registered is unmapped.
            unsafe { self.io.register(None) };
            if let Some(p) = pinner
                && let Err(e) = staging.pin(p)
            {
                break 'set_up Err(e);
            }
            let pinned = locked.elapsed();
            self.staging = Some(staging);
            self.register_staging();
            self.slots = (0..slots).map(|_| Slot::Free).collect();
            let registered = locked.elapsed() - pinned;
            drop(one);
            tracing::debug!(
                lane = self.id,
                bytes = slot_bytes * slots as u64,
                map_secs = mapped.as_secs_f64(),
                wait_secs = waited.as_secs_f64(),
                pin_secs = pinned.as_secs_f64(),
                register_secs = registered.as_secs_f64(),
                "staging set up"
            );
            Ok(())
        };
        (t.elapsed().saturating_sub(waited), waited, result)
    }

    /// Registers this idle lane's staging with its ring as fixed buffers (replacing what was registered).
    fn register_staging(&mut self) {
        let region = self.staging.as_mut().map(|s| s.region());
        // SAFETY: the region belongs to the staging this lane keeps until it registers another one; the lane is
        // idle, so nothing is in flight.
        let (fixed, refusal) = unsafe { self.io.register(region) };
        self.fixed = fixed;
        self.fixed_refusal = refusal;
    }

    /// Sets up staging as the engine asked ([`crate::IoEngine::prepare_staging`]) once the lane is idle, and answers.
    fn set_up_if_asked(&mut self) {
        let req = match self.pool.staging_request(self.asked_epoch) {
            Ok(req) => req,
            // Requests up to `last` were answered or withdrawn (their caller gave up).
            Err(last) => return self.asked_epoch = last,
        };
        if !self.is_idle() {
            return;
        }
        // A release asked before this request (seen now that the request's lock was taken) goes first: the
        // staging set up below is what the caller asked for last.
        self.release_if_asked();
        self.asked_epoch = req.epoch;
        if self.id >= req.lanes {
            req.answer(None);
            return;
        }
        if self.staging_holds(req.slot_bytes, req.slots, req.pinner.is_some()) {
            req.answer(Some((Default::default(), Default::default(), Ok(()))));
            return;
        }
        let (took, waited, result) = self.restage(req.slot_bytes, req.slots, req.pinner.as_deref());
        req.answer(Some((took, waited, result)));
    }

    /// Drops the staging memory if the engine asked for it and the lane is idle.
    fn release_if_asked(&mut self) {
        let epoch = self.pool.release_epoch();
        if epoch != self.released_epoch && self.is_idle() {
            self.released_epoch = epoch;
            // SAFETY: idle: no read in flight into the region being dropped.
            unsafe { self.io.register(None) };
            self.staging = None;
            self.slots.clear();
        }
    }

    /// Starts reading op `op` of `job` into a free slot (an object's op: as part `part` of its GET).
    fn start(&mut self, job: Arc<Job>, op_idx: usize, part: Part) {
        let Some(slot) = self.free_slot() else {
            job.fail(IoError::Destinations("a lane took an op without a free slot".into()));
            return;
        };
        let op = &job.plan.ops[op_idx];
        let direct = op.direct && job.files[op.file as usize].direct.is_some();
        let reading = Reading::start(direct);
        let in_place =
            in_place_targets(&job.plan, op, job.sink()).map(|targets| InPlaceIo { targets, iov: Vec::new() });
        let req = reading.request(op);
        // Cold pages the cache keeps: brought in as 2 MiB folios first (see `populate`), then read from the cache.
        let populated = match &job.cold_maps {
            Some(maps) if op.cold => {
                let t = Instant::now();
                let done = maps.populate(op.file as usize, &job.files[op.file as usize], op.offset, op.valid);
                Some((if done { op.valid } else { 0 }, t.elapsed()))
            }
            _ => None,
        };
        let j = self.joined_of(&job);
        j.busy += 1;
        j.totals.stats.ops += 1;
        if let Some((n, took)) = populated {
            j.totals.stats.populated_bytes += n;
            j.totals.stats.populate += took;
        }
        self.slots[slot] = Slot::Reading { job, op: op_idx, reading, in_place, part };
        self.issue(slot, req);
    }

    /// Pushes the read `req` of the op in `slot`.
    fn issue(&mut self, slot: usize, req: crate::reading::Request) {
        let fixed = self.fixed;
        let Some(staging) = self.staging.as_mut() else { return };
        let (base, slot_len) = staging.slot_ptr(slot);
        let Slot::Reading { job, op, in_place, part, .. } = &mut self.slots[slot] else { return };
        let job = job.clone();
        let o = &job.plan.ops[*op];
        let file = &job.files[o.file as usize];
        if let Some(f) = job.faults() {
            f.before_read(o.file, &file.path, req.offset, req.len);
        }
        let at = req.offset - o.offset;
        let submission = match (in_place, &file.source) {
            (in_place, Source::Object(_)) => {
                let Some((stream, index)) = part.clone() else {
                    job.fail(IoError::Destinations("an object's read without its GET".into()));
                    return self.release_slot(slot);
                };
                // Straight into the destinations where they are host memory, else into the slot; the whole op
                // (a part is read once: its GET resumes by itself after a failure).
                let segments = match in_place {
                    Some(ip) => ip.targets.clone(),
                    None => vec![(base, (o.valid as usize).min(slot_len))],
                };
                let stopping = job.clone();
                let stop = Arc::new(move || stopping.stopping());
                let copy = file.filling().cloned();
                Submission::Object { stream, part: index, segments, offset: o.offset, stop, copy }
            }
            (Some(ip), Source::Local(buffered)) => {
                ip.iov = iovecs(&ip.targets, at, req.len);
                Submission::Vectored {
                    fd: buffered.as_raw_fd(),
                    iov: ip.iov.as_ptr(),
                    count: ip.iov.len() as u32,
                    offset: req.offset,
                }
            }
            (None, Source::Local(buffered)) => {
                let fd = match (&file.direct, req.direct) {
                    (Some(d), true) => d.as_raw_fd(),
                    _ => buffered.as_raw_fd(),
                };
                let len = req.len.min((slot_len as u64).saturating_sub(at)) as u32;
                // SAFETY: `at < slot_len` since `req.offset - op.offset < op.len <= slot_bytes`.
                let buf = unsafe { base.add(at as usize) };
                Submission::Slot { fd, buf, len, offset: req.offset, fixed }
            }
        };
        // SAFETY: the read goes into this lane's slot (kept out of the free list until its completion) or into
        // in-place destinations the sink vouches for (`InPlace`), whose iovecs live in the slot state until then.
        match unsafe { self.io.push(slot as u64, submission) } {
            Ok(()) => {
                self.pushed += 1;
                self.inflight += 1;
                self.joined_of(&job).inflight += 1;
            }
            Err(e) => {
                job.fail(e);
                self.release_slot(slot);
            }
        }
    }

    /// Frees `slot` (its read finished or was never issued).
    fn release_slot(&mut self, slot: usize) {
        if let Slot::Reading { job, .. } | Slot::Delivering { job, .. } =
            std::mem::replace(&mut self.slots[slot], Slot::Free)
        {
            self.joined_of(&job).busy -= 1;
        }
    }

    fn on_completion(&mut self, slot: usize, result: io::Result<usize>) {
        self.inflight -= 1;
        let Some(Slot::Reading { job, op: op_idx, mut reading, in_place, part }) =
            self.slots.get_mut(slot).map(|s| std::mem::replace(s, Slot::Free))
        else {
            return;
        };
        self.joined_of(&job).inflight -= 1;
        // A part that landed may let another lane take work (the next part of its GET, a new GET) that this lane
        // has no slot for: the lanes waiting idle are woken.
        if part.is_some() && job.part_landed(op_idx) == crate::job::Landed::Work && self.free_slot().is_none() {
            self.pool.notify();
        }
        let op = &job.plan.ops[op_idx];
        let file = &job.files[op.file as usize];
        if job.aborted() {
            self.joined_of(&job).busy -= 1;
            return;
        }
        let asked = reading.request(op);
        let result = match job.faults() {
            Some(f) => f.after_read(op.file, asked.offset, asked.len, result),
            None => result,
        };
        let t = Instant::now();
        let next = reading.on_result(op, file, result, &mut self.joined_of(&job).totals.stats);
        match next {
            Err(e) => {
                job.fail(e);
                self.joined_of(&job).busy -= 1;
            }
            Ok(Next::Read(_)) if part.is_some() => {
                // A part is given to its GET once; what it returns is all of it or an error.
                job.fail(IoError::Destinations(format!("an object's read of {} bytes came back short", op.valid)));
                self.joined_of(&job).busy -= 1;
            }
            Ok(Next::Read(req)) => {
                self.slots[slot] = Slot::Reading { job, op: op_idx, reading, in_place, part };
                self.issue(slot, req);
            }
            Ok(Next::Complete) if in_place.is_some() => {
                job.sink().landed(job.plan.pieces_of(op));
                job.add_progress(op.valid);
                self.joined_of(&job).busy -= 1;
            }
            Ok(Next::Complete) => self.deliver(slot, job, op_idx, t),
        }
    }

    /// Hands the completed read in `slot` to the job's sink.
    fn deliver(&mut self, slot: usize, job: Arc<Job>, op_idx: usize, t: Instant) {
        let op = &job.plan.ops[op_idx];
        let Some(staging) = self.staging.as_mut() else { return };
        let (base, _) = staging.slot_ptr(slot);
        // SAFETY: the slot's read has completed and no other read into it is in flight; the slice lives only for the
        // `deliver` call, and the slot is not reused until the delivery is done.
        let data = unsafe { std::slice::from_raw_parts(base, op.valid as usize) };
        let pieces = job.plan.pieces_of(op);
        let delivered = job.sink().deliver(self.id, pieces, data);
        self.joined_of(&job).totals.stats.deliver += t.elapsed();
        match delivered {
            Ok(None) => {
                job.sink().landed(pieces);
                job.add_progress(op.valid);
                self.joined_of(&job).busy -= 1;
            }
            Ok(Some(pending)) => {
                self.slots[slot] = Slot::Delivering { job, op: op_idx, pending };
                self.delivering.push_back(slot);
            }
            Err(e) => {
                job.fail(IoError::Sink(e));
                self.joined_of(&job).busy -= 1;
            }
        }
    }

    /// Leaves every joined job that has no op left to hand out and nothing in this lane.
    fn leave_finished(&mut self) {
        let mut i = 0;
        while i < self.joined.len() {
            let j = &self.joined[i];
            if j.busy == 0 && j.inflight == 0 && j.job.drained_of_ops() {
                let j = self.joined.swap_remove(i);
                if let Err(e) = j.job.sink().end_lane(self.id) {
                    j.job.fail(IoError::Sink(e));
                }
                j.job.leave(self.id, &j.totals);
                if j.job.is_complete() {
                    self.pool.remove(&j.job);
                }
            } else {
                i += 1;
            }
        }
    }

    /// Gives up every job of this lane (its kernel interface failed, or the lane panicked), failing it with `e`;
    /// only once [`Lane::drain`] made sure nothing of the lane still writes into the jobs' memory.
    fn abandon(&mut self, e: &IoError) {
        for j in std::mem::take(&mut self.joined) {
            j.job.fail(e.duplicate());
            j.job.leave(self.id, &j.totals);
            if j.job.is_complete() {
                self.pool.remove(&j.job);
            }
        }
    }
}

/// A delivery already waited for (stands in while its slot is being finished).
struct Done;

impl Pending for Done {
    fn poll(&mut self) -> Result<bool, crate::sink::SinkError> {
        Ok(true)
    }
    fn wait(self: Box<Self>) -> Result<(), crate::sink::SinkError> {
        Ok(())
    }
}
