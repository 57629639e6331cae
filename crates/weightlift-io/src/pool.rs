//! The engine's persistent lanes and the queue of jobs they serve.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::error::IoError;
use crate::job::{Job, Priority};
use crate::params::{IoParams, ReadEngine, StagingPages};
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

    /// Records that a lane died; every later job fails with this reason.
    pub fn mark_broken(&self, why: &str) {
        self.broken.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| why.to_string());
    }
}

struct Threads {
    shared: Arc<PoolShared>,
    handles: Vec<JoinHandle<()>>,
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
            staging_per_lane: (params.staging_bytes / lanes as u64).max(4096),
            staging_pages: params.staging_pages,
        });
        let mut t = Threads { shared: shared.clone(), handles: Vec::with_capacity(lanes) };
        for id in 0..lanes {
            let io: Box<dyn Submitter> = if uring {
                Box::new(crate::uring::Ring::new(params.queue_depth as usize)?)
            } else {
                Box::new(crate::pread::Blocking::default())
            };
            let lane = Lane::new(id, io, shared.clone());
            let h = std::thread::Builder::new()
                .name(format!("weightlift-io-{id}"))
                .spawn(move || lane.run())
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

    /// Asks every lane to free its staging memory once idle (it is kept between loads otherwise).
    pub fn release_staging(&self) {
        self.shared().release_epoch.fetch_add(1, Ordering::Relaxed);
        self.shared().notify();
    }
}
