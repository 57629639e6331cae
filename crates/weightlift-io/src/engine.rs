//! The engine's persistent lanes and the queue of jobs they serve.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{IoError, panic_text};
use crate::job::Job;
use crate::lane::Lane;
use crate::params::{IoParams, ReadEngine};
use crate::queue::{Answers, Shared, StagingRequest};
use crate::staging::Pinner;
use crate::submit::Submitter;

/// Pread lanes issue one read at a time, so they are more numerous than io_uring lanes, up to this many.
const MAX_PREAD_LANES: usize = 64;

/// What [`IoEngine::prepare_staging`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StagingPrepared {
    /// Lanes holding staging of the asked shape now.
    pub lanes: usize,
    /// Of those, lanes that set it up in this call (the others had it already).
    pub lanes_set_up: usize,
    /// Bytes of each staging slot.
    pub slot_bytes: u64,
    /// Slots each of those lanes holds.
    pub slots_per_lane: usize,
    /// Whether the slots were pinned (a pinner was given).
    pub pinned: bool,
    /// Wall time of the call.
    pub seconds: f64,
    /// Set-up time summed over the lanes, and their time waiting for each other (lanes pin their staging one at a
    /// time).
    pub setup_thread_secs: f64,
    /// Time the lanes spent waiting for each other to pin, summed over the lanes.
    pub wait_thread_secs: f64,
}

/// The lanes: started on first use ([`Threads::started`]), not with the engine. A load served without reading
/// (from a keeper, say) then never pays for them: 16 threads with their rings took 0.6-1.2 ms of a fresh process's
/// engine (on the 2-core VM; the H100 machine's 16-lane engine cost a keeper-served `load_file` 1.0-1.3 ms).
struct Threads {
    shared: Arc<Shared>,
    /// How many lanes, and how each reads.
    count: usize,
    uring: bool,
    queue_depth: usize,
    handles: OnceLock<Vec<JoinHandle<()>>>,
    /// One start at a time.
    starting: Mutex<()>,
    /// One staging set-up request at a time.
    preparing: Mutex<()>,
}

impl Threads {
    /// The lanes' threads, started now if they are not yet (a ring that cannot be made fails this call; a later
    /// one tries again).
    fn started(&self) -> Result<&[JoinHandle<()>], IoError> {
        if let Some(h) = self.handles.get() {
            return Ok(h);
        }
        let _one = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = self.handles.get() {
            return Ok(h);
        }
        let mut lanes: Vec<Lane> = Vec::with_capacity(self.count);
        for id in 0..self.count {
            let io: Box<dyn Submitter> = if self.uring {
                Box::new(crate::uring::Ring::new(self.queue_depth)?)
            } else {
                Box::new(crate::pread::Blocking::default())
            };
            lanes.push(Lane::new(id, Box::new(crate::objects::WithObjects::new(io)), self.shared.clone()));
        }
        let mut handles = Vec::with_capacity(self.count);
        for (id, lane) in lanes.into_iter().enumerate() {
            let mine = self.shared.clone();
            let spawned = std::thread::Builder::new().name(format!("weightlift-io-{id}")).spawn(move || {
                // A lane catches its own panics (`Lane::run`: its jobs fail once it has drained). One that escapes
                // that handler still marks the engine broken, so that later loads and set-up requests fail with
                // the reason; the jobs the lane had joined then keep waiting.
                if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lane.run())) {
                    let why = panic_text(&*p);
                    mine.mark_broken(&format!("lane {id} panicked: {why}"));
                    mine.notify();
                }
            });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The lanes started so far stop (they serve nothing yet), and a later call tries again.
                    self.shared.shutdown.store(true, Ordering::Relaxed);
                    self.shared.notify();
                    for h in handles {
                        let _ = h.join();
                    }
                    self.shared.shutdown.store(false, Ordering::Relaxed);
                    return Err(IoError::Thread(e));
                }
            }
        }
        Ok(self.handles.get_or_init(|| handles))
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Relaxed);
        self.shared.notify();
        for h in self.handles.take().unwrap_or_default() {
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
        f.debug_struct("IoEngine").field("lanes", &self.threads.count).field("uring", &self.uring).finish()
    }
}

/// Which kernel interface the lanes use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadEngineUsed {
    /// io_uring: each lane keeps several reads in flight on its own ring.
    Uring,
    /// Blocking `pread` calls, one read at a time per lane (where io_uring is unavailable or not wanted).
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
    /// Makes the engine; its lanes start on first use. `origin` says who chose `params.engine` (for the report and
    /// errors).
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
        let shared = Arc::new(Shared::new((params.staging_bytes / lanes as u64).max(4096), params.staging_pages));
        let t = Threads {
            shared,
            count: lanes,
            uring,
            queue_depth: params.queue_depth as usize,
            handles: OnceLock::new(),
            starting: Mutex::new(()),
            preparing: Mutex::new(()),
        };
        Ok(IoEngine { threads: Arc::new(t), params, uring, reason: reason.into() })
    }

    /// The parameters the engine was started with.
    pub fn params(&self) -> &IoParams {
        &self.params
    }

    /// How many lanes (I/O threads) the engine runs (once started: they start with its first job).
    pub fn lanes(&self) -> usize {
        self.threads.count
    }

    /// Whether the lanes have started (they start with the first job or staging set-up).
    pub fn started(&self) -> bool {
        self.threads.handles.get().is_some()
    }

    /// The kernel interface in use, and why.
    pub fn read_engine(&self) -> (ReadEngineUsed, &str) {
        (if self.uring { ReadEngineUsed::Uring } else { ReadEngineUsed::Pread }, &self.reason)
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.threads.shared
    }

    /// Queues `job` for the lanes.
    pub(crate) fn submit(&self, job: Arc<Job>) -> Result<(), IoError> {
        self.threads.started()?;
        let shared = self.shared();
        if let Some(why) = shared.broken.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(IoError::Panicked(why));
        }
        if job.check_complete() {
            return Ok(());
        }
        shared.enqueue(job);
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
        let handles = self.threads.started()?;
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
            let dead = handles.iter().position(JoinHandle::is_finished);
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
