//! Streaming loads: the reading starts in file order through the same lanes as a whole load (at background
//! priority), and [`Stream::take`] waits only for the tensor asked for. How far reading runs ahead of what was taken
//! is bounded by the `prefetch_bytes` setting. A tensor asked for before the stream reached it is read at once by a
//! foreground load of its own, and the stream skips it. This is how `safe_open(...).get_tensor(k)` gets each tensor
//! as fast as a whole-file load would have produced it.
//!
//! Destinations are the placement's blocks (small neighbours share one). Each block moves through
//! `Waiting → Allocated → Admitted` (the stream reads it) or `→ OutOfBand` (a take read it first); the gate admits
//! an op once every block it feeds is allocated and the window has room; a lane's delivery carries only the pieces
//! of admitted blocks; landed bytes are counted per block, and a take returns once its block has landed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use weightlift_cuda::{DeviceBuffer, DeviceSink, Gpu, Targets};
use weightlift_format::{TensorEntry, TensorIndex};
use weightlift_io::fault::FaultPlan;
use weightlift_io::{
    Admit, Extent, Gate, HostBuffer, HostSink, InPlace, IoEngine, LoadOptions, LoadRequest, OpenFile, Pending, Piece,
    Pinner, ReadOp, Running, Sink, SinkError, StreamOptions,
};

use crate::device::Device;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::path::{DeviceRead, LoadOpts, ResolvedPath};
use crate::placement::{self, Placement};
use crate::report::StreamStats;
use crate::tensor::{DeviceTensor, TensorData};

/// How long a take waits at most for the stream to admit the block at its front (the stream admits it as soon as
/// a lane is free; this bounds the wait should the lanes be stuck elsewhere).
const FRONT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockState {
    Waiting,
    Allocated,
    Admitted,
    OutOfBand,
}

struct Blocks {
    state: Vec<BlockState>,
    landed: Vec<u64>,
    lens: Vec<u64>,
    /// Tensors of each block not yet taken.
    untaken: Vec<usize>,
    /// Whether each block counts in the window (`ahead`).
    counted: Vec<bool>,
    /// Bytes of blocks read ahead (host: admitted; device: allocated) still holding untaken tensors.
    ahead: u64,
    taken: Vec<bool>,
    /// Takes so far (the allocator, out of device memory, waits for the next one).
    takes: u64,
    /// The allocator waits for device memory: a take must not wait for it to allocate its block.
    starved: bool,
    failed: Option<String>,
    stats: StreamStats,
}

/// What the gate, the sink and the takers share.
struct Shared {
    blocks: Mutex<Blocks>,
    changed: Condvar,
    prefetch: u64,
    closed: AtomicBool,
    /// Host streams bound the window when admitting; device streams when allocating.
    host: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Blocks> {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn admitted(&self, b: &Blocks, p: &Piece) -> bool {
        b.state.get(p.dest as usize) == Some(&BlockState::Admitted)
    }
}

/// Admits ops in file order once their blocks are allocated and the window has room.
struct StreamGate(Arc<Shared>);

impl Gate for StreamGate {
    fn admit(&self, _op: &ReadOp, pieces: &[Piece]) -> Admit {
        let mut b = self.0.lock();
        if self.0.closed.load(Ordering::Relaxed) {
            return Admit::Skip;
        }
        let mut new = 0;
        for p in pieces {
            match b.state[p.dest as usize] {
                BlockState::Waiting => return Admit::Wait,
                BlockState::Allocated if !b.counted[p.dest as usize] => new += b.lens[p.dest as usize],
                _ => {}
            }
        }
        if pieces.iter().all(|p| b.state[p.dest as usize] == BlockState::OutOfBand) {
            return Admit::Skip;
        }
        if self.0.host && new > 0 && b.ahead > 0 && b.ahead + new > self.0.prefetch {
            return Admit::Wait;
        }
        for p in pieces {
            let d = p.dest as usize;
            if b.state[d] == BlockState::Allocated {
                b.state[d] = BlockState::Admitted;
                if !b.counted[d] {
                    b.counted[d] = true;
                    b.ahead += b.lens[d];
                }
            }
        }
        self.0.changed.notify_all();
        Admit::Go
    }
}

/// Delivers only the pieces of admitted blocks, and counts what landed.
struct StreamSink<S: Sink> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: Sink> StreamSink<S> {
    fn admitted(&self, pieces: &[Piece]) -> Option<Vec<Piece>> {
        let b = self.shared.lock();
        if pieces.iter().all(|p| self.shared.admitted(&b, p)) {
            return None;
        }
        Some(pieces.iter().filter(|p| self.shared.admitted(&b, p)).copied().collect())
    }
}

// SAFETY: in-place addresses come from the inner sink's own `InPlace` (whose contract covers them), and only for
// admitted blocks, which no other reader touches.
unsafe impl<S: Sink> InPlace for StreamSink<S> {
    fn host_destination(&self, piece: &Piece) -> Option<*mut u8> {
        let admitted = self.shared.admitted(&self.shared.lock(), piece);
        if admitted { self.inner.in_place()?.host_destination(piece) } else { None }
    }
}

impl<S: Sink> Sink for StreamSink<S> {
    fn asynchronous(&self) -> bool {
        self.inner.asynchronous()
    }
    fn in_place(&self) -> Option<&dyn InPlace> {
        self.inner.in_place().map(|_| self as &dyn InPlace)
    }
    fn begin_lane(&self, lane: usize) -> std::result::Result<(), SinkError> {
        self.inner.begin_lane(lane)
    }
    fn deliver(
        &self,
        lane: usize,
        pieces: &[Piece],
        data: &[u8],
    ) -> std::result::Result<Option<Box<dyn Pending>>, SinkError> {
        match self.admitted(pieces) {
            None => self.inner.deliver(lane, pieces, data),
            Some(some) if some.is_empty() => Ok(None),
            Some(some) => self.inner.deliver(lane, &some, data),
        }
    }
    fn landed(&self, pieces: &[Piece]) {
        let mut b = self.shared.lock();
        for p in pieces {
            if self.shared.admitted(&b, p) {
                b.landed[p.dest as usize] += p.len;
                b.stats.streamed_bytes += p.len;
            }
        }
        self.shared.changed.notify_all();
    }
    fn end_lane(&self, lane: usize) -> std::result::Result<(), SinkError> {
        self.inner.end_lane(lane)
    }
}

/// Where the blocks live.
enum Memory {
    Host(Vec<Mutex<Option<HostBuffer>>>),
    Device {
        gpu: Gpu,
        path: Arc<ResolvedPath>,
        targets: Arc<Targets>,
        buffers: Arc<Mutex<Vec<Option<Arc<DeviceBuffer>>>>>,
    },
}

/// How a stream reads, beyond the engine's settings ([`Engine::stream_limited`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamLimits {
    /// At most this many lanes read for the stream (None: as many as the engine gives a load).
    pub max_lanes: Option<usize>,
    /// At most this many bytes read ahead of the tensors taken (None: the engine's `prefetch_bytes`).
    pub window: Option<u64>,
}

/// A streaming load of a checkpoint's tensors (see the module documentation).
pub struct Stream {
    io: IoEngine,
    device: Device,
    entries: Vec<TensorEntry>,
    files: Vec<Arc<OpenFile>>,
    placement: Placement,
    shared: Arc<Shared>,
    memory: Memory,
    running: Option<Running>,
    allocator: Option<std::thread::JoinHandle<()>>,
    started: Instant,
    faults: Option<Arc<FaultPlan>>,
    /// At most this many lanes read for the stream (None: the engine's choice).
    max_lanes: Option<usize>,
    /// The objects' counters when the stream started.
    network_before: crate::report::NetworkBefore,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("device", &self.device).field("tensors", &self.entries.len()).finish()
    }
}

impl Engine {
    /// Starts streaming the tensors of `index` at positions `which` onto `device`, reading at most the engine's
    /// `prefetch_bytes` ahead of what has been taken.
    pub fn stream(&self, index: &TensorIndex, which: &[usize], device: Device) -> Result<Stream> {
        self.stream_with(index, which, device, None)
    }

    /// [`Engine::stream`] with faults injected into its reads, the stream's and the on-demand ones (tests).
    pub fn stream_with(
        &self,
        index: &TensorIndex,
        which: &[usize],
        device: Device,
        faults: Option<Arc<FaultPlan>>,
    ) -> Result<Stream> {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        self.stream_on_lanes(index, which, device, faults, None, None)
    }

    /// [`Engine::stream_with`] within `limits`: how many lanes read it, how far it reads ahead of the takes (a
    /// prefetch loader that hands everything out reads the whole plan without waiting for takes).
    pub fn stream_limited(
        &self,
        index: &TensorIndex,
        which: &[usize],
        device: Device,
        faults: Option<Arc<FaultPlan>>,
        limits: StreamLimits,
    ) -> Result<Stream> {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        self.stream_on_lanes(index, which, device, faults, limits.max_lanes, limits.window)
    }

    /// [`Engine::stream_with`] read by at most `max_lanes` lanes (None: as many as the engine gives a load) and at
    /// most `prefetch` bytes ahead (None: the engine's `prefetch_bytes`).
    pub(crate) fn stream_on_lanes(
        &self,
        index: &TensorIndex,
        which: &[usize],
        device: Device,
        faults: Option<Arc<FaultPlan>>,
        max_lanes: Option<usize>,
        prefetch: Option<u64>,
    ) -> Result<Stream> {
        let prefetch = prefetch.unwrap_or(self.settings().prefetch_bytes.value).max(1);
        let entries: Vec<TensorEntry> = which
            .iter()
            .map(|&i| {
                index
                    .tensors
                    .get(i)
                    .cloned()
                    .ok_or_else(|| Error::InvalidArgument(format!("no tensor at position {i}")))
            })
            .collect::<Result<_>>()?;
        let files = self.open_index(index)?;
        let refs: Vec<&TensorEntry> = entries.iter().collect();
        let placement = placement::pack(&refs);
        let n = placement.blocks.len();
        let lens: Vec<u64> = placement.blocks.iter().map(|b| b.len).collect();
        let mut untaken = vec![0usize; n];
        for &(b, _) in &placement.tensors {
            untaken[b] += 1;
        }
        let host = !matches!(device, Device::Cuda(_));
        let shared = Arc::new(Shared {
            blocks: Mutex::new(Blocks {
                state: vec![if host { BlockState::Allocated } else { BlockState::Waiting }; n],
                landed: vec![0; n],
                lens: lens.clone(),
                untaken,
                counted: vec![false; n],
                ahead: 0,
                taken: vec![false; which.len()],
                takes: 0,
                starved: false,
                failed: None,
                stats: StreamStats { prefetch_bytes: prefetch, ..StreamStats::default() },
            }),
            changed: Condvar::new(),
            prefetch,
            closed: AtomicBool::new(false),
            host,
        });
        let memory = match device {
            Device::Cuda(o) => {
                let gpu = self.gpu(o)?;
                let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
                gpu.bind()?;
                let path = self.gpu_path(o)?;
                Memory::Device { gpu, path, targets: Targets::lazy(n), buffers: Arc::new(Mutex::new(vec![None; n])) }
            }
            Device::Cpu => Memory::Host(
                lens.iter()
                    .map(|&l| HostBuffer::new(l as usize, Some(self.host_cache())).map(|b| Mutex::new(Some(b))))
                    .collect::<std::result::Result<_, _>>()?,
            ),
            Device::PinnedCpu => {
                return Err(Error::InvalidArgument("streaming loads go to cpu or cuda:N, not cpu:pinned".into()));
            }
        };
        let network_before = crate::report::NetworkStats::before(&files);
        let mut s = Stream {
            io: self.io().clone(),
            device,
            entries,
            files,
            placement,
            shared,
            memory,
            running: None,
            allocator: None,
            started: Instant::now(),
            faults,
            max_lanes,
            network_before,
        };
        s.start()?;
        Ok(s)
    }
}

impl Stream {
    fn block_extents(&self) -> (Vec<Extent>, Vec<u64>) {
        let extents = self
            .placement
            .blocks
            .iter()
            .enumerate()
            .map(|(i, b)| Extent { file: b.file as u32, offset: b.start, len: b.len, dest: i as u32, dest_offset: 0 })
            .collect();
        (extents, self.placement.blocks.iter().map(|b| b.len).collect())
    }

    fn start(&mut self) -> Result<()> {
        let (extents, lens) = self.block_extents();
        let req = LoadRequest { files: &self.files, extents: &extents, dest_lens: &lens };
        let gate: Arc<dyn Gate> = Arc::new(StreamGate(self.shared.clone()));
        let (sink, pinner): (Arc<dyn Sink>, Option<Arc<dyn Pinner>>) = match &self.memory {
            Memory::Host(bufs) => {
                let dests = bufs.iter().map(|m| host_ptr(&mut m.lock().unwrap_or_else(|p| p.into_inner()))).collect();
                // SAFETY: each range is a distinct block buffer owned by this stream, which outlives the running load
                // (dropped in `Drop` only after the load has stopped); takers touch a block only once it landed.
                let inner = unsafe { HostSink::new(dests) };
                (Arc::new(StreamSink { inner, shared: self.shared.clone() }), None)
            }
            Memory::Device { gpu, targets, buffers, .. } => {
                let inner = DeviceSink::new(gpu, targets.clone(), self.io.lanes());
                self.allocator = Some(spawn_allocator(
                    gpu.clone(),
                    targets.clone(),
                    buffers.clone(),
                    self.shared.clone(),
                    lens.clone(),
                    self.io.clone(),
                )?);
                let pinner: Arc<dyn Pinner> = Arc::new(weightlift_cuda::CudaPinner::new(gpu));
                (Arc::new(StreamSink { inner, shared: self.shared.clone() }), Some(pinner))
            }
        };
        let opts = StreamOptions {
            gate: Some(gate),
            pinner,
            faults: self.faults.clone(),
            max_lanes: self.max_lanes,
            ..StreamOptions::default()
        };
        self.running = Some(self.io.start(&req, opts, sink)?);
        Ok(())
    }

    /// Where the streamed tensors land.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The position of the tensor called `name`, if streamed.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.name == name)
    }

    /// Tensor `i`'s bytes, waiting only until they have landed (reading them at once if the stream has not
    /// reached them yet).
    pub fn take(&self, i: usize) -> Result<TensorData> {
        self.take_with(i, None)
    }

    /// [`Stream::take`], giving up with a cancellation error once `cancel` is set while it waits (Ctrl-C); the
    /// tensor can then be taken again, and the stream reads on.
    pub fn take_with(&self, i: usize, cancel: Option<&AtomicBool>) -> Result<TensorData> {
        let entry = self.entries.get(i).ok_or_else(|| Error::InvalidArgument(format!("no streamed tensor {i}")))?;
        let (block, offset) = self.placement.tensors[i];
        let demand = {
            let mut b = self.shared.lock();
            if std::mem::replace(&mut b.taken[i], true) {
                return Err(Error::InvalidArgument(format!(
                    "tensor {:?} was already taken from this stream",
                    entry.name
                )));
            }
            b = self.await_front(b, block);
            match b.state[block] {
                BlockState::Admitted | BlockState::OutOfBand => false,
                _ => {
                    b.state[block] = BlockState::OutOfBand;
                    true
                }
            }
        };
        if demand {
            self.read_now(block)?;
        }
        if let Err(e) = self.wait_landed(block, cancel) {
            if e.is_cancelled() {
                self.shared.lock().taken[i] = false;
            }
            return Err(e);
        }
        let data = self.hand_out(block, offset, entry.nbytes)?;
        let mut b = self.shared.lock();
        b.untaken[block] -= 1;
        b.takes += 1;
        let last = b.untaken[block] == 0;
        if last && std::mem::replace(&mut b.counted[block], false) {
            b.ahead = b.ahead.saturating_sub(b.lens[block]);
        }
        drop(b);
        if last && let Memory::Device { buffers, .. } = &self.memory {
            // Every tensor of the block is taken and its bytes have landed (no lane writes to it again): the
            // stream's reference goes, so the memory goes back when the takers drop theirs, not at close.
            buffers.lock().unwrap_or_else(|p| p.into_inner())[block] = None;
        }
        self.shared.changed.notify_all();
        self.io.wake();
        Ok(data)
    }

    /// When `block` is next in file order (every block before it is read or being read) and the window has room
    /// for it, the stream is about to admit it: waits for that rather than reading it apart (which a file-order
    /// loop would otherwise do for many tensors, racing the lanes).
    fn await_front<'a>(&'a self, b: MutexGuard<'a, Blocks>, block: usize) -> MutexGuard<'a, Blocks> {
        let at_front = b.state[..block].iter().all(|s| matches!(s, BlockState::Admitted | BlockState::OutOfBand));
        // The window must have room for it, or the stream would never get there (tensors left untaken before it).
        let room = b.counted[block] || b.ahead == 0 || b.ahead + b.lens[block] <= self.shared.prefetch;
        if !at_front || !room || matches!(b.state[block], BlockState::Admitted | BlockState::OutOfBand) {
            return b;
        }
        // Lanes lock the engine's queue, then a job, then (in the gate) these blocks: waking them (which locks the
        // queue) while holding the blocks would be the other order, a deadlock.
        drop(b);
        self.io.wake();
        let mut b = self.shared.lock();
        let deadline = Instant::now() + FRONT_WAIT;
        // A block the allocator is out of memory for is not coming: read it on demand (or fail there, naming it).
        while matches!(b.state[block], BlockState::Waiting | BlockState::Allocated)
            && b.failed.is_none()
            && !(b.starved && b.state[block] == BlockState::Waiting)
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let step = left.min(std::time::Duration::from_millis(20));
            drop(self.shared.changed.wait_timeout(b, step));
            // A stream that ended (failed) admits nothing more: stop waiting (asked without the blocks held).
            let done = self.running.as_ref().is_none_or(Running::is_done);
            b = self.shared.lock();
            if done {
                break;
            }
        }
        b
    }

    fn wait_landed(&self, block: usize, cancel: Option<&AtomicBool>) -> Result<()> {
        loop {
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                return Err(Error::Io(weightlift_io::IoError::Cancelled));
            }
            // Read before locking the blocks: the job's lock is taken before the blocks' by the lanes (the gate
            // runs under it), so asking the job while holding the blocks would be the other order, a deadlock. A
            // load that is done stays done, so reading it first is safe.
            let done = self.running.as_ref().is_none_or(|r| r.is_done());
            let b = self.shared.lock();
            if b.landed[block] >= b.lens[block] {
                return Ok(());
            }
            if let Some(why) = &b.failed {
                return Err(Error::InvalidArgument(format!("the streaming load failed: {why}")));
            }
            if done && b.state[block] == BlockState::Admitted {
                drop(b);
                return self.stream_error();
            }
            drop(self.shared.changed.wait_timeout(b, std::time::Duration::from_millis(20)));
        }
    }

    /// The stream ended without landing an admitted block: the error it failed with (naming file and offset).
    fn stream_error(&self) -> Result<()> {
        if let Some(e) = self.running.as_ref().and_then(Running::error) {
            return Err(Error::Io(e));
        }
        let msg = "the streaming load stopped before this tensor arrived".to_string();
        self.shared.lock().failed.get_or_insert(msg.clone());
        Err(Error::InvalidArgument(msg))
    }

    /// Reads block `block` now, by a foreground load of its own.
    fn read_now(&self, block: usize) -> Result<()> {
        let b = self.placement.blocks[block];
        let extents = [Extent { file: b.file as u32, offset: b.start, len: b.len, dest: 0, dest_offset: 0 }];
        let opts = LoadOpts { faults: self.faults.as_deref(), ..LoadOpts::default() };
        match &self.memory {
            Memory::Host(bufs) => {
                let mut guard = bufs[block].lock().unwrap_or_else(|p| p.into_inner());
                let dest = host_ptr(&mut guard);
                // SAFETY: the block buffer is owned by the stream and, being out of band, untouched by its lanes.
                let sink = unsafe { HostSink::new(vec![dest]) };
                let req = LoadRequest { files: &self.files, extents: &extents, dest_lens: &[b.len] };
                self.io.load(&req, &LoadOptions { faults: self.faults.as_deref(), ..LoadOptions::default() }, &sink)?;
            }
            Memory::Device { gpu, path, buffers, .. } => {
                let buf = ensure_allocated(gpu, buffers, block, b.len, self.io.lanes())?;
                // SAFETY: the block buffer is owned by the stream (kept alive by `buffers`) and, being out of band,
                // untouched by its lanes.
                let targets = unsafe { Targets::fixed(vec![(buf.device_ptr(), b.len)]) };
                let read = DeviceRead {
                    gpu,
                    files: &self.files,
                    extents: &extents,
                    dest_lens: &[b.len],
                    targets: &targets,
                    opts: &opts,
                    observer: None,
                };
                path.imp.read(&self.io, &read, &mut || Ok(()))?;
            }
        }
        let mut s = self.shared.lock();
        s.landed[block] = b.len;
        s.stats.on_demand_bytes += b.len;
        s.stats.on_demand_reads += 1;
        Ok(())
    }

    fn hand_out(&self, block: usize, offset: u64, len: u64) -> Result<TensorData> {
        match &self.memory {
            Memory::Device { buffers, .. } => {
                let buf = buffers.lock().unwrap_or_else(|p| p.into_inner())[block]
                    .clone()
                    .ok_or_else(|| Error::InvalidArgument(format!("block {block} was never allocated")))?;
                Ok(TensorData::Device(DeviceTensor { block: buf, offset, len }))
            }
            Memory::Host(bufs) => {
                let guard = bufs[block].lock().unwrap_or_else(|p| p.into_inner());
                let src = guard.as_ref().ok_or_else(|| Error::InvalidArgument(format!("block {block} is gone")))?;
                if offset == 0
                    && len as usize == src.len()
                    && self.placement.tensors.iter().filter(|t| t.0 == block).count() == 1
                {
                    drop(guard);
                    let taken = bufs[block].lock().unwrap_or_else(|p| p.into_inner()).take();
                    return taken
                        .map(TensorData::Host)
                        .ok_or_else(|| Error::InvalidArgument("block taken twice".into()));
                }
                let mut out = HostBuffer::new(len as usize, None)?;
                out.copy_from_slice(&src[offset as usize..(offset + len) as usize]);
                Ok(TensorData::Host(out))
            }
        }
    }

    /// What the stream has read so far (`wasted_bytes` is known once closed).
    pub fn stats(&self) -> StreamStats {
        self.shared.lock().stats.clone()
    }

    /// What the requests of a stream from objects (URLs) did so far (`None` when it reads local files only).
    pub fn network(&self) -> Option<crate::report::NetworkStats> {
        crate::report::NetworkStats::of(&self.files, &self.network_before, None)
    }

    /// Stops reading ahead and reports what the stream did.
    pub fn close(mut self) -> Result<StreamStats> {
        self.stop().map(|(stats, _)| stats)
    }

    /// [`Stream::close`], also handing back what the stream's reads did (`None` when the stream had started no
    /// reads, or when they were cancelled: a stream closed before every tensor was taken, or whose job had not
    /// ended 2 s after the last take).
    pub fn finish(mut self) -> Result<(StreamStats, Option<weightlift_io::IoReport>)> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(StreamStats, Option<weightlift_io::IoReport>)> {
        self.shared.closed.store(true, Ordering::Relaxed);
        self.shared.changed.notify_all();
        self.io.wake();
        if let Memory::Device { targets, .. } = &self.memory {
            targets.fail("the stream was closed".into());
        }
        // Once every tensor was taken the job ends by itself: let it (briefly), so its report survives; cancelling a
        // finished job would replace its report with the cancellation.
        let all_taken = self.shared.lock().untaken.iter().all(|&u| u == 0);
        let outcome = match self.running.take() {
            Some(r) => {
                if !(all_taken && r.wait_timeout(std::time::Duration::from_secs(2))) {
                    r.cancel();
                }
                r.wait().map(Some)
            }
            None => Ok(None),
        };
        if let Some(a) = self.allocator.take() {
            let _ = a.join();
        }
        let mut b = self.shared.lock();
        b.stats.wasted_bytes = (0..b.lens.len())
            .filter(|&i| b.untaken[i] > 0 && b.state[i] == BlockState::Admitted)
            .map(|i| b.landed[i])
            .sum();
        let stats = b.stats.clone();
        drop(b);
        match outcome {
            Ok(io) => Ok((stats, io)),
            Err(weightlift_io::IoError::Cancelled) => Ok((stats, None)),
            Err(e) => Err(e.into()),
        }
    }

    /// Seconds since the stream started.
    pub fn elapsed_secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        let _ = self.stop();
    }
}

fn host_ptr(b: &mut Option<HostBuffer>) -> (*mut u8, usize) {
    b.as_mut().map_or((std::ptr::null_mut(), 0), |b| (b.as_mut_ptr(), b.len()))
}

/// Block `block`'s device buffer, allocating it now if the allocator has not yet.
fn ensure_allocated(
    gpu: &Gpu,
    buffers: &Mutex<Vec<Option<Arc<DeviceBuffer>>>>,
    block: usize,
    len: u64,
    lanes: usize,
) -> Result<Arc<DeviceBuffer>> {
    let mut bufs = buffers.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = &bufs[block] {
        return Ok(b.clone());
    }
    let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
    gpu.bind()?;
    let stream = gpu.stream(lanes)?;
    let b = Arc::new(DeviceBuffer::alloc(gpu, len as usize, &stream)?);
    stream.synchronize().map_err(|error| weightlift_cuda::CudaError::Driver {
        device: gpu.ordinal(),
        call: "cuStreamSynchronize",
        error,
    })?;
    bufs[block] = Some(b.clone());
    Ok(b)
}

/// Allocates device blocks in file order, staying `prefetch` bytes ahead of what was taken, and publishes each to
/// the lanes. When the device has no memory for the next block, reading ahead pauses until a take (which may free
/// memory, or read that block itself) rather than failing the stream: the window shrinks to the memory there is.
fn spawn_allocator(
    gpu: Gpu,
    targets: Arc<Targets>,
    buffers: Arc<Mutex<Vec<Option<Arc<DeviceBuffer>>>>>,
    shared: Arc<Shared>,
    lens: Vec<u64>,
    io: IoEngine,
) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("weightlift-stream-alloc".into())
        .spawn(move || {
            let lanes = io.lanes();
            let mut i = 0;
            while let Some(&len) = lens.get(i) {
                {
                    let mut b = shared.lock();
                    while !shared.closed.load(Ordering::Relaxed) && b.ahead > 0 && b.ahead + len > shared.prefetch {
                        b = shared.changed.wait(b).unwrap_or_else(|p| p.into_inner());
                    }
                    if shared.closed.load(Ordering::Relaxed) {
                        return;
                    }
                    if b.state[i] != BlockState::Waiting {
                        i += 1;
                        continue;
                    }
                }
                match ensure_allocated(&gpu, &buffers, i, len, lanes) {
                    Ok(buf) => {
                        // SAFETY: the buffer is kept alive by `buffers` (owned by the stream) until the stream stops.
                        unsafe { targets.publish(&[(i as u32, buf.device_ptr(), len)], None) };
                        let mut b = shared.lock();
                        if b.state[i] == BlockState::Waiting {
                            b.state[i] = BlockState::Allocated;
                            if b.untaken[i] > 0 {
                                b.counted[i] = true;
                                b.ahead += len;
                            }
                        }
                        let stale = b.untaken[i] == 0;
                        drop(b);
                        if stale {
                            // Read on demand and taken while this thread allocated: the take released its own
                            // buffer already; this one would otherwise stay until the stream closes.
                            buffers.lock().unwrap_or_else(|p| p.into_inner())[i] = None;
                        }
                        i += 1;
                    }
                    Err(e) if e.is_out_of_memory() => {
                        if !wait_for_take(&shared, &io) {
                            return;
                        }
                    }
                    Err(e) => {
                        let why = format!("allocating block {i}: {e}");
                        targets.fail(why.clone());
                        shared.lock().failed.get_or_insert(why);
                        shared.changed.notify_all();
                        io.wake();
                        return;
                    }
                }
                shared.changed.notify_all();
                io.wake();
            }
        })
        .map_err(|e| Error::Io(weightlift_io::IoError::Thread(e)))
}

/// The allocator found no device memory for the next block: marks the stream starved (takes then read their blocks
/// themselves instead of waiting for this thread) until the next take or the close. Whether the stream is still open.
fn wait_for_take(shared: &Shared, io: &IoEngine) -> bool {
    let mut b = shared.lock();
    b.starved = true;
    b.stats.memory_waits += 1;
    let seen = b.takes;
    shared.changed.notify_all();
    drop(b);
    io.wake();
    let mut b = shared.lock();
    while !shared.closed.load(Ordering::Relaxed) && b.takes == seen {
        b = shared.changed.wait(b).unwrap_or_else(|p| p.into_inner());
    }
    b.starved = false;
    !shared.closed.load(Ordering::Relaxed)
}
