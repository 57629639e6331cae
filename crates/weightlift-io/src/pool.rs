//! The engine's persistent lanes and the queue of jobs they serve.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::IoError;
use crate::job::{Job, Priority};
use crate::params::{IoParams, ReadEngine, StagingPages};
use crate::staging::Pinner;
use crate::worker::{Lane, Submitter};

/// Pread lanes issue one read at a time, so they are more numerous than io_uring lanes, up to this many.
const MAX_PREAD_LANES: usize = 64;

/// What a lane should do next.
pub(crate) enum Work {
    None,
    /// Reallocate staging (the lane is idle) to serve this job.
    Restage(Arc<Job>),
    /// Read op `op` of `job`; `joins`: the lane's first op of the job.
    Op {
        job: Arc<Job>,
        op: usize,
        joins: bool,
    },
}

/// A request that the lanes set up their staging now ([`IoEngine::prepare_staging`]), and their answers.
pub(crate) struct StagingRequest {
    pub epoch: u64,
    pub slot_bytes: u64,
    pub slots: usize,
    /// Lanes `0..lanes` set up; the others only answer (a load would not use them).
    pub lanes: usize,
    pub pinner: Option<Arc<dyn Pinner>>,
    answers: Mutex<Answers>,
    answered: Condvar,
}

#[derive(Default)]
struct Answers {
    count: usize,
    set_up: usize,
    setup: Duration,
    waited: Duration,
    error: Option<IoError>,
}

impl StagingRequest {
    /// A lane's answer: `None` when it was not asked to set up, else its set-up time, its wait for the other lanes'
    /// set-ups and the result (zero times for a lane whose staging already fitted).
    pub fn answer(&self, outcome: Option<(Duration, Duration, Result<(), IoError>)>) {
        let mut a = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        a.count += 1;
        if let Some((setup, waited, result)) = outcome {
            if !setup.is_zero() {
                a.set_up += 1;
            }
            a.setup += setup;
            a.waited += waited;
            if let Err(e) = result {
                a.error.get_or_insert(e);
            }
        }
        self.answered.notify_all();
    }
}

/// What [`IoEngine::prepare_staging`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StagingPrepared {
    /// Lanes holding staging of the asked shape now.
    pub lanes: usize,
    /// Of those, lanes that set it up in this call (the others had it already).
    pub lanes_set_up: usize,
    pub slot_bytes: u64,
    pub slots_per_lane: usize,
    pub pinned: bool,
    /// Wall time of the call.
    pub seconds: f64,
    /// Set-up time summed over the lanes, and their time waiting for each other (lanes pin their staging one at a
    /// time).
    pub setup_thread_secs: f64,
    pub wait_thread_secs: f64,
}

struct Queue {
    jobs: Vec<Arc<Job>>,
    generation: u64,
}

/// What the lanes share with the engine.
pub(crate) struct PoolShared {
    queue: Mutex<Queue>,
    wake: Condvar,
    shutdown: AtomicBool,
    broken: Mutex<Option<String>>,
    release_epoch: AtomicU64,
    /// The last staging set-up request's epoch, and the request while it is being answered.
    staging_request: Mutex<(u64, Option<Arc<StagingRequest>>)>,
    /// The last request's epoch, read without the lock.
    staging_epoch: AtomicU64,
    staging_per_lane: u64,
    staging_pages: StagingPages,
}

impl PoolShared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    pub fn staging_per_lane(&self) -> u64 {
        self.staging_per_lane
    }

    pub fn staging_pages(&self) -> StagingPages {
        self.staging_pages
    }

    pub fn release_epoch(&self) -> u64 {
        self.release_epoch.load(Ordering::Relaxed)
    }

    /// The staging set-up request newer than epoch `answered`, or `Err(epoch)`: no request is waiting for an
    /// answer up to that epoch. Lanes ask between ops: without a newer epoch posted, no lock is taken.
    pub fn staging_request(&self, answered: u64) -> Result<Arc<StagingRequest>, u64> {
        if self.staging_epoch.load(Ordering::Acquire) == answered {
            return Err(answered);
        }
        let r = self.staging_request.lock().unwrap_or_else(|p| p.into_inner());
        r.1.as_ref().filter(|r| r.epoch != answered).cloned().ok_or(r.0)
    }

    /// Wakes idle lanes (new work, a gate opened, a release request).
    pub fn notify(&self) {
        let mut q = self.lock();
        q.generation += 1;
        self.wake.notify_all();
    }

    /// Waits until something changed since generation `seen`; false once the engine shuts down.
    pub fn idle_wait(&self, seen: u64) -> bool {
        let mut q = self.lock();
        while q.generation == seen && !self.shutdown.load(Ordering::Relaxed) {
            q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        !self.shutdown.load(Ordering::Relaxed)
    }

    /// The next thing `lane` should do: foreground jobs first, then background, each in submission order.
    pub fn next_work(&self, lane: &Lane) -> Work {
        let q = self.lock();
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
            if let Some((op, joins)) = job.take_op(lane.id) {
                return Work::Op { job: job.clone(), op, joins };
            }
        }
        Work::None
    }

    pub fn remove(&self, job: &Arc<Job>) {
        self.lock().jobs.retain(|j| !Arc::ptr_eq(j, job));
    }

    /// Fails every queued job with `e` (a lane died: a job only it could serve would wait forever); jobs other
    /// lanes have joined complete once those lanes leave them.
    pub fn fail_queued(&self, e: &IoError) {
        let jobs: Vec<Arc<Job>> = self.lock().jobs.clone();
        for job in jobs {
            job.fail(e.duplicate());
            if job.is_complete() {
                self.remove(&job);
            }
        }
        self.notify();
    }

    /// Records that a lane died; every later job fails with this reason.
    pub fn mark_broken(&self, why: &str) {
        self.broken.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| why.to_string());
    }
}

struct Threads {
    shared: Arc<PoolShared>,
    handles: Vec<JoinHandle<()>>,
    /// One staging set-up request at a time.
    preparing: Mutex<()>,
}

impl Drop for Threads {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Relaxed);
        self.shared.notify();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// The storage engine: persistent I/O lanes (threads with their rings and staging) serving loads. Cheap to clone
/// (clones share the lanes); the lanes stop when the last clone is dropped.
#[derive(Clone)]
pub struct IoEngine {
    threads: Arc<Threads>,
    params: IoParams,
    uring: bool,
    reason: Arc<str>,
}

impl std::fmt::Debug for IoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoEngine").field("lanes", &self.threads.handles.len()).field("uring", &self.uring).finish()
    }
}

/// Which kernel interface the lanes use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadEngineUsed {
    Uring,
    Pread,
}

impl std::fmt::Display for ReadEngineUsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReadEngineUsed::Uring => "uring",
            ReadEngineUsed::Pread => "pread",
        })
    }
}

impl IoEngine {
    /// Starts the lanes. `origin` says who chose `params.engine` (for the report and errors).
    pub fn new(params: IoParams, origin: &str) -> Result<IoEngine, IoError> {
        params.validate()?;
        // Before the lanes' threads and rings: in a process with one thread this is free (see `fdtable`).
        crate::fdtable::grow_early();
        let (uring, reason) = match (params.engine, crate::uring::available()) {
            (ReadEngine::Pread, _) => (false, format!("pread chosen by {origin}")),
            (ReadEngine::Uring, Ok(())) => (true, format!("io_uring chosen by {origin}")),
            (ReadEngine::Uring, Err(reason)) => {
                return Err(IoError::UringUnavailable { origin: origin.to_string(), reason });
            }
            (ReadEngine::Auto, Ok(())) => (true, "io_uring available".to_string()),
            (ReadEngine::Auto, Err(e)) => (false, format!("io_uring unavailable ({e}); using pread threads")),
        };
        let threads = params.threads as usize;
        let lanes = if uring { threads } else { (threads * params.queue_depth as usize).clamp(1, MAX_PREAD_LANES) };
        let shared = Arc::new(PoolShared {
            queue: Mutex::new(Queue { jobs: Vec::new(), generation: 0 }),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            broken: Mutex::new(None),
            release_epoch: AtomicU64::new(0),
            staging_request: Mutex::new((0, None)),
            staging_epoch: AtomicU64::new(0),
            staging_per_lane: (params.staging_bytes / lanes as u64).max(4096),
            staging_pages: params.staging_pages,
        });
        let mut t = Threads { shared: shared.clone(), handles: Vec::with_capacity(lanes), preparing: Mutex::new(()) };
        for id in 0..lanes {
            let io: Box<dyn Submitter> = if uring {
                Box::new(crate::uring::Ring::new(params.queue_depth as usize)?)
            } else {
                Box::new(crate::pread::Blocking::default())
            };
            let lane = Lane::new(id, io, shared.clone());
            let mine = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("weightlift-io-{id}"))
                .spawn(move || {
                    // A lane catches its own panics (`Lane::run`: its jobs fail once it has drained). One that
                    // escapes that handler still marks the engine broken, so that later loads and set-up requests
                    // fail with the reason; the jobs the lane had joined then keep waiting.
                    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lane.run())) {
                        let why = crate::worker::panic_text(&*p);
                        mine.mark_broken(&format!("lane {id} panicked: {why}"));
                        mine.notify();
                    }
                })
                .map_err(IoError::Thread)?;
            t.handles.push(h);
        }
        Ok(IoEngine { threads: Arc::new(t), params, uring, reason: reason.into() })
    }

    pub fn params(&self) -> &IoParams {
        &self.params
    }

    pub fn lanes(&self) -> usize {
        self.threads.handles.len()
    }

    /// The kernel interface in use, and why.
    pub fn read_engine(&self) -> (ReadEngineUsed, &str) {
        (if self.uring { ReadEngineUsed::Uring } else { ReadEngineUsed::Pread }, &self.reason)
    }

    pub(crate) fn shared(&self) -> &Arc<PoolShared> {
        &self.threads.shared
    }

    /// Queues `job` for the lanes.
    pub(crate) fn submit(&self, job: Arc<Job>) -> Result<(), IoError> {
        let shared = self.shared();
        if let Some(why) = shared.broken.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(IoError::Panicked(why));
        }
        if job.check_complete() {
            return Ok(());
        }
        let mut q = shared.lock();
        let at = match job.priority {
            Priority::Foreground => {
                q.jobs.iter().position(|j| j.priority == Priority::Background).unwrap_or(q.jobs.len())
            }
            Priority::Background => q.jobs.len(),
        };
        q.jobs.insert(at, job);
        q.generation += 1;
        shared.wake.notify_all();
        Ok(())
    }

    /// Wakes the lanes to look at the jobs again (a streaming load's gate opened).
    pub fn wake(&self) {
        self.shared().notify();
    }

    /// Has the lanes set up the staging a load from the page cache asks for (`device_copies`: the slots of a load
    /// onto a device, pinned with `pinner` if given; else those of a host load), so that such a load pays nothing
    /// for it. Without `pinner` nothing here needs a device: the memory of device-shaped staging can be faulted in
    /// before a CUDA context exists and pinned by a later call with the pinner (which then only pins). Without
    /// this, a program's first load sets up the lanes' staging one lane at a time while it runs (mapping, faulting
    /// in, pinning: measured at 26-40 ms for 16 lanes of 8 MiB on the H100 machine, most of it faulting in). A load that reads from disk asks for larger slots (the reads of
    /// uncached ranges are `DIRECT_CHUNK_FACTOR` chunks) and sets them up itself, a few milliseconds beside its
    /// seconds of reading: no one shape fits both within a lane's share of `staging_bytes`. Lanes busy with a load
    /// answer once it is done; this waits for every lane, or until `cancel` is set (then `IoError::Cancelled`; the
    /// lanes still set up). Staging that already fits is kept (the call is then nearly free).
    pub fn prepare_staging(
        &self,
        device_copies: bool,
        pinner: Option<Arc<dyn Pinner>>,
        cancel: Option<&AtomicBool>,
    ) -> Result<StagingPrepared, IoError> {
        let t = std::time::Instant::now();
        let _one = self.threads.preparing.lock().unwrap_or_else(|p| p.into_inner());
        let shared = self.shared();
        // The shape of a warm load's staging: chunk-sized slots (within the lane's share), as a load plans them.
        let slot_bytes = self.params.chunk_bytes.min(shared.staging_per_lane() / 4096 * 4096).max(4096);
        let (_, slots, lanes) = self.staging_shape(slot_bytes, device_copies || pinner.is_some());
        let pinned = pinner.is_some();
        let req = {
            let mut current = shared.staging_request.lock().unwrap_or_else(|p| p.into_inner());
            // Lanes start having answered epoch 0.
            current.0 += 1;
            let req = Arc::new(StagingRequest {
                epoch: current.0,
                slot_bytes,
                slots,
                lanes,
                pinner,
                answers: Mutex::new(Answers::default()),
                answered: Condvar::new(),
            });
            current.1 = Some(req.clone());
            shared.staging_epoch.store(current.0, Ordering::Release);
            req
        };
        // The request goes once answered or given up on (it holds the pinner, and with it the device).
        let withdraw = || shared.staging_request.lock().unwrap_or_else(|p| p.into_inner()).1 = None;
        shared.notify();
        let all = self.lanes();
        let mut a = req.answers.lock().unwrap_or_else(|p| p.into_inner());
        while a.count < all {
            let broken = shared.broken.lock().unwrap_or_else(|p| p.into_inner()).clone();
            // A lane thread that ended while the engine lives died (a panic) and will never answer.
            let dead = self.threads.handles.iter().position(JoinHandle::is_finished);
            if let Some(why) = broken.or_else(|| dead.map(|i| format!("lane {i} stopped"))) {
                drop(a);
                withdraw();
                return Err(IoError::Panicked(why));
            }
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                drop(a);
                withdraw();
                return Err(IoError::Cancelled);
            }
            a = req.answered.wait_timeout(a, Duration::from_millis(50)).unwrap_or_else(|p| p.into_inner()).0;
        }
        let a = std::mem::take(&mut *a);
        withdraw();
        if let Some(e) = a.error {
            return Err(e);
        }
        Ok(StagingPrepared {
            lanes,
            lanes_set_up: a.set_up,
            slot_bytes,
            slots_per_lane: slots,
            pinned,
            seconds: t.elapsed().as_secs_f64(),
            setup_thread_secs: a.setup.as_secs_f64(),
            wait_thread_secs: a.waited.as_secs_f64(),
        })
    }

    /// Asks every lane to free its staging memory once idle (it is kept between loads otherwise).
    pub fn release_staging(&self) {
        self.shared().release_epoch.fetch_add(1, Ordering::Relaxed);
        self.shared().notify();
    }
}
