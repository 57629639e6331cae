//! What the lanes share with the engine that owns them: the queue of jobs, the wake-ups, and the engine's requests
//! (release the staging, set it up now). Lanes read it; only the engine creates it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::IoError;
use crate::job::{Job, Priority};
use crate::params::StagingPages;
use crate::staging::Pinner;

/// What a lane should do next.
pub(crate) enum Work {
    None,
    /// Reallocate staging (the lane is idle) to serve this job.
    Restage(Arc<Job>),
    /// Read op `op` of `job`; `joins`: the lane's first op of the job; `part`: for an object's op, the GET that
    /// serves it and its part there.
    Op {
        job: Arc<Job>,
        op: usize,
        joins: bool,
        part: crate::job::Part,
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
    pub(crate) answers: Mutex<Answers>,
    pub(crate) answered: Condvar,
}

#[derive(Default)]
pub(crate) struct Answers {
    pub count: usize,
    pub set_up: usize,
    pub setup: Duration,
    pub waited: Duration,
    pub error: Option<IoError>,
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

pub(crate) struct Queue {
    pub jobs: Vec<Arc<Job>>,
    pub generation: u64,
}

/// What the lanes share with the engine.
pub(crate) struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    pub(crate) shutdown: AtomicBool,
    pub(crate) broken: Mutex<Option<String>>,
    pub(crate) release_epoch: AtomicU64,
    /// The last staging set-up request's epoch, and the request while it is being answered.
    pub(crate) staging_request: Mutex<(u64, Option<Arc<StagingRequest>>)>,
    /// The last request's epoch, read without the lock.
    pub(crate) staging_epoch: AtomicU64,
    staging_per_lane: u64,
    staging_pages: StagingPages,
}

impl Shared {
    pub fn new(staging_per_lane: u64, staging_pages: StagingPages) -> Shared {
        Shared {
            queue: Mutex::new(Queue { jobs: Vec::new(), generation: 0 }),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            broken: Mutex::new(None),
            release_epoch: AtomicU64::new(0),
            staging_request: Mutex::new((0, None)),
            staging_epoch: AtomicU64::new(0),
            staging_per_lane,
            staging_pages,
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Queue> {
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

    /// Queues `job` behind the jobs of its priority and wakes the lanes.
    pub fn enqueue(&self, job: Arc<Job>) {
        let mut q = self.lock();
        let at = match job.priority {
            Priority::Foreground => {
                q.jobs.iter().position(|j| j.priority == Priority::Background).unwrap_or(q.jobs.len())
            }
            Priority::Background => q.jobs.len(),
        };
        q.jobs.insert(at, job);
        q.generation += 1;
        self.wake.notify_all();
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
