//! A layer streamer: a model larger than the memory it may use, loaded one layer at a time into a few fixed slots
//! (two by default: one being computed on, one being filled), with the next layers read in the background while
//! the caller computes on the current one.
//!
//! `load_layer(i)` hands back layer `i` once its bytes are in a slot, and queues the layers after it (wrapping
//! around, for token-by-token loops) into the other slots. Asking for a layer releases the one handed back before:
//! with a CUDA stream given, its slot is refilled only after the work queued on that stream at the time of the
//! call has finished, so kernels still reading the previous layer are never overwritten.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use weightlift_cuda::{CUstream, DeviceBuffer, StreamMark};
use weightlift_format::TensorIndex;
use weightlift_io::fault::FaultPlan;
use weightlift_io::{HostBuffer, OpenFile};

use crate::device::Device;
use crate::engine::Engine;
use crate::engine::read::{ByteRange, Dests, ReadRequest, Sources};
use crate::error::{Error, Result};
use crate::path::LoadOpts;
use crate::tensor::RawDest;

/// Offsets of tensors inside a slot are multiples of this (enough for any element type and vector loads).
pub const SLOT_ALIGN: u64 = 256;

/// Where one layer's tensors sit in a slot.
#[derive(Debug, Clone)]
pub struct LayerLayout {
    /// Positions in the index's tensor list, in the order given.
    pub tensors: Vec<usize>,
    /// Byte offset of each tensor in the slot.
    pub offsets: Vec<u64>,
    /// Bytes of the slot the layer occupies.
    pub bytes: u64,
    /// Reads into the slot (destination 0).
    ranges: Vec<ByteRange>,
}

/// What the streamer did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StreamerStats {
    /// Layers read (prefetches included).
    pub loads: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Seconds the background reader spent reading.
    pub load_secs: f64,
    /// Seconds `load_layer` calls spent waiting for a layer's bytes.
    pub wait_secs: f64,
    /// `load_layer` calls.
    pub requests: u64,
    /// Calls whose layer was already in its slot.
    pub ready_hits: u64,
}

#[derive(Debug)]
enum Status {
    Empty,
    Queued,
    Ready,
    Failed(Error),
}

#[derive(Debug)]
struct SlotState {
    layer: Option<usize>,
    generation: u64,
    status: Status,
    /// Work on the slot's previous contents that must finish before it is refilled.
    release: Option<StreamMark>,
    last_used: u64,
}

#[derive(Debug)]
struct Job {
    slot: usize,
    layer: usize,
    generation: u64,
}

#[derive(Debug)]
struct State {
    slots: Vec<SlotState>,
    queue: VecDeque<Job>,
    shutdown: bool,
    stats: StreamerStats,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    cancel: AtomicBool,
    /// Faults injected into the reader's reads (tests).
    faults: Mutex<Option<Arc<FaultPlan>>>,
}

fn lock(s: &Shared) -> MutexGuard<'_, State> {
    s.state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Slot memory the streamer allocated itself.
#[derive(Debug)]
enum Owned {
    Host(#[allow(dead_code)] HostBuffer),
    Device(#[allow(dead_code)] DeviceBuffer),
}

/// The layer handed back by [`LayerStreamer::load_layer`]: valid until the next call.
#[derive(Debug, Clone, Copy)]
pub struct LayerView<'a> {
    /// The layer's position in the list the streamer was given.
    pub layer: usize,
    /// Which slot holds it.
    pub slot: usize,
    /// The slot's address (host or device, as the streamer's device).
    pub base: u64,
    /// Where the layer's tensors sit in the slot.
    pub layout: &'a LayerLayout,
}

impl LayerView<'_> {
    /// Address of the layer's `k`-th tensor.
    pub fn tensor_ptr(&self, k: usize) -> Option<u64> {
        self.layout.offsets.get(k).map(|o| self.base + o)
    }
}

/// Streams layers of one checkpoint through `k` slots (see the module documentation).
#[derive(Debug)]
pub struct LayerStreamer {
    shared: Arc<Shared>,
    worker: Option<std::thread::JoinHandle<()>>,
    layouts: Arc<Vec<LayerLayout>>,
    slots: Vec<RawDest>,
    slot_bytes: u64,
    device: Device,
    engine: Arc<Engine>,
    current: Option<usize>,
    tick: u64,
    _owned: Vec<Owned>,
}

// SAFETY: the slot addresses are plain addresses of memory the streamer owns or that its creator vouched for (see
// `with_slots`); the streamer itself only hands them out, and the reader thread writes through them under the
// streamer's contract. Everything else in it is Send and Sync.
unsafe impl Send for LayerStreamer {}
// SAFETY: as above; `&self` methods only read plain data or lock the shared state.
unsafe impl Sync for LayerStreamer {}

/// Lays out each layer's tensors in a slot; returns the layouts and the largest layer's bytes.
pub fn plan_layers(index: &TensorIndex, layers: &[Vec<usize>]) -> Result<(Vec<LayerLayout>, u64)> {
    let mut seen = vec![usize::MAX; index.tensors.len()];
    let mut out = Vec::with_capacity(layers.len());
    let mut largest = 0;
    for (l, tensors) in layers.iter().enumerate() {
        let (mut offsets, mut ranges, mut end) = (Vec::new(), Vec::new(), 0u64);
        for &t in tensors {
            let e = index.tensors.get(t).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "layer {l} names tensor {t}; the checkpoint has {}",
                    index.tensors.len()
                ))
            })?;
            if seen[t] != usize::MAX {
                return Err(Error::InvalidArgument(format!(
                    "tensor {:?} is in layer {} and layer {l}: a tensor belongs to one layer",
                    e.name, seen[t]
                )));
            }
            seen[t] = l;
            let at = end.next_multiple_of(SLOT_ALIGN);
            offsets.push(at);
            ranges.push(ByteRange::new(e.file, e.offset, e.nbytes, at));
            end = at + e.nbytes;
        }
        largest = largest.max(end);
        out.push(LayerLayout { tensors: tensors.clone(), offsets, bytes: end, ranges });
    }
    Ok((out, largest))
}

impl LayerStreamer {
    /// A streamer over `layers` (each a list of positions in `index.tensors`) with `slots` slots (≥ 1; 2 for
    /// double buffering) allocated on `device`, each as large as the largest layer.
    pub fn new(
        engine: Arc<Engine>,
        index: &TensorIndex,
        layers: Vec<Vec<usize>>,
        device: Device,
        slots: usize,
    ) -> Result<LayerStreamer> {
        let (layouts, slot_bytes) = plan_layers(index, &layers)?;
        if slots == 0 {
            return Err(Error::InvalidArgument("a layer streamer needs at least one slot".into()));
        }
        let mut owned = Vec::with_capacity(slots);
        let mut dests = Vec::with_capacity(slots);
        let len = slot_bytes.max(1) as usize;
        match device {
            Device::PinnedCpu => {
                return Err(Error::InvalidArgument(
                    "layer slots live in host memory (cpu) or on a GPU (cuda:N)".into(),
                ));
            }
            Device::Cpu => {
                for _ in 0..slots {
                    let mut b = HostBuffer::new(len, None)?;
                    dests.push(RawDest::Host(b.as_mut_ptr()));
                    owned.push(Owned::Host(b));
                }
            }
            Device::Cuda(n) => {
                let gpu = engine.gpu(n)?;
                let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
                gpu.bind()?;
                let stream = gpu.stream(0)?;
                for _ in 0..slots {
                    let b = DeviceBuffer::alloc(&gpu, len, &stream)?;
                    dests.push(RawDest::Device { ordinal: n, ptr: b.device_ptr() });
                    owned.push(Owned::Device(b));
                }
                gpu.synchronize()?;
            }
        }
        // SAFETY: the slots were just allocated with `slot_bytes` bytes each and are owned by the streamer.
        let mut s = unsafe { Self::with_slots(engine, index, layouts, dests, slot_bytes.max(1), device) }?;
        s._owned = owned;
        Ok(s)
    }

    /// A streamer filling caller-owned slots (e.g. tensors a framework allocated), each `slot_bytes` long.
    ///
    /// # Safety
    /// Every slot must be memory of `device` valid for writes of `slot_bytes` bytes for the streamer's lifetime,
    /// written by nothing else; its contents may change at any time except while the layer it holds is the one
    /// last handed back.
    pub unsafe fn with_slots(
        engine: Arc<Engine>,
        index: &TensorIndex,
        layouts: Vec<LayerLayout>,
        slots: Vec<RawDest>,
        slot_bytes: u64,
        device: Device,
    ) -> Result<LayerStreamer> {
        if slots.is_empty() {
            return Err(Error::InvalidArgument("a layer streamer needs at least one slot".into()));
        }
        if let Some(big) = layouts.iter().find(|l| l.bytes > slot_bytes) {
            return Err(Error::InvalidArgument(format!(
                "a layer of {} bytes does not fit in {slot_bytes}-byte slots",
                big.bytes
            )));
        }
        for d in &slots {
            let ok = matches!((d, device), (RawDest::Host(_), Device::Cpu))
                || matches!((d, device), (RawDest::Device { ordinal, .. }, Device::Cuda(n)) if *ordinal == n);
            if !ok {
                return Err(Error::InvalidArgument(format!("every slot must be memory of {device}")));
            }
        }
        let files: Vec<Arc<OpenFile>> = engine.open_index(index)?;
        let layouts = Arc::new(layouts);
        let state = State {
            slots: (0..slots.len())
                .map(|_| SlotState { layer: None, generation: 0, status: Status::Empty, release: None, last_used: 0 })
                .collect(),
            queue: VecDeque::new(),
            shutdown: false,
            stats: StreamerStats::default(),
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            changed: Condvar::new(),
            cancel: AtomicBool::new(false),
            faults: Mutex::new(None),
        });
        let worker = {
            let (shared, layouts, engine, slots) =
                (shared.clone(), layouts.clone(), engine.clone(), SlotAddrs(slots.clone()));
            std::thread::Builder::new()
                .name("weightlift-layers".into())
                .spawn(move || {
                    let slots = slots;
                    reader(&shared, &layouts, &engine, &files, &slots.0)
                })
                .map_err(|e| Error::Io(weightlift_io::IoError::Thread(e)))?
        };
        Ok(LayerStreamer {
            shared,
            worker: Some(worker),
            layouts,
            slots,
            slot_bytes,
            device,
            engine,
            current: None,
            tick: 0,
            _owned: Vec::new(),
        })
    }

    /// Layers the streamer serves.
    pub fn layers(&self) -> usize {
        self.layouts.len()
    }

    /// Where `layer`'s tensors sit in a slot.
    pub fn layout(&self, layer: usize) -> Option<&LayerLayout> {
        self.layouts.get(layer)
    }

    /// Slots the layers rotate through.
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Bytes of each slot: the largest layer, aligned.
    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// Where the slots live.
    pub fn device(&self) -> Device {
        self.device
    }

    /// What the streamer has done so far.
    pub fn stats(&self) -> StreamerStats {
        lock(&self.shared).stats
    }

    /// Injects faults into the reads started from now on (tests; `None` stops injecting).
    pub fn set_faults(&self, faults: Option<Arc<FaultPlan>>) {
        *self.shared.faults.lock().unwrap_or_else(|p| p.into_inner()) = faults;
    }

    /// Layer `layer`, once its bytes are in a slot; the caller must be done with the layer handed back before
    /// (host work finished; device work synchronised, or use [`LayerStreamer::load_layer_after`]).
    pub fn load_layer(&mut self, layer: usize) -> Result<LayerView<'_>> {
        self.request(layer, None)
    }

    /// [`LayerStreamer::load_layer`] for a caller computing on `stream`: the previous layer's slot is refilled
    /// only after the work queued on `stream` so far has finished.
    ///
    /// # Safety
    /// `stream` must be a live stream of the streamer's device.
    pub unsafe fn load_layer_after(&mut self, layer: usize, stream: CUstream) -> Result<LayerView<'_>> {
        let mark = match self.device {
            Device::Cuda(n) => {
                let gpu = self.engine.gpu(n)?;
                // SAFETY: per this function's contract.
                Some(unsafe { StreamMark::record(&gpu, stream) }?)
            }
            Device::Cpu | Device::PinnedCpu => None,
        };
        self.request(layer, mark)
    }

    fn request(&mut self, layer: usize, mark: Option<StreamMark>) -> Result<LayerView<'_>> {
        let n = self.layouts.len();
        if layer >= n {
            return Err(Error::InvalidArgument(format!("layer {layer} of a streamer over {n} layers")));
        }
        let start = Instant::now();
        let k = self.slots.len();
        let mut st = lock(&self.shared);
        st.stats.requests += 1;
        if let Some(prev) = self.current.take() {
            st.slots[prev].release = mark;
        }
        self.tick += 1;
        let slot = match st.slots.iter().position(|s| s.layer == Some(layer) && !matches!(s.status, Status::Empty)) {
            Some(s) => s,
            None => {
                let s = oldest(&st.slots, &[]);
                enqueue(&mut st, s, layer);
                s
            }
        };
        st.slots[slot].last_used = self.tick;
        if matches!(st.slots[slot].status, Status::Ready) {
            st.stats.ready_hits += 1;
        }
        // Prefetch the next layers into the other slots.
        let mut reserved = vec![slot];
        for m in 1..k.min(n) {
            let next = (layer + m) % n;
            if let Some(s) = st.slots.iter().position(|s| s.layer == Some(next) && !matches!(s.status, Status::Empty)) {
                reserved.push(s);
                continue;
            }
            let s = oldest(&st.slots, &reserved);
            reserved.push(s);
            enqueue(&mut st, s, next);
        }
        self.shared.changed.notify_all();
        let generation = st.slots[slot].generation;
        loop {
            let s = &mut st.slots[slot];
            if s.generation != generation {
                return Err(Error::InvalidArgument("the layer's slot was reassigned while waiting".into()));
            }
            match std::mem::replace(&mut s.status, Status::Empty) {
                Status::Ready => {
                    s.status = Status::Ready;
                    break;
                }
                Status::Failed(e) => {
                    s.layer = None;
                    st.stats.wait_secs += start.elapsed().as_secs_f64();
                    return Err(e);
                }
                waiting => {
                    s.status = waiting;
                    st = self.shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            }
        }
        st.stats.wait_secs += start.elapsed().as_secs_f64();
        drop(st);
        self.current = Some(slot);
        let base = match self.slots[slot] {
            RawDest::Host(p) => p as u64,
            RawDest::Device { ptr, .. } => ptr,
        };
        Ok(LayerView { layer, slot, base, layout: &self.layouts[layer] })
    }
}

/// The slots' addresses, handed to the reader thread.
struct SlotAddrs(Vec<RawDest>);
// SAFETY: the addresses are only written through by the reader, under the streamer's contract (each slot is
// valid for the streamer's lifetime and used by nothing else while it is being filled).
unsafe impl Send for SlotAddrs {}

/// The least recently used slot not in `skip`.
fn oldest(slots: &[SlotState], skip: &[usize]) -> usize {
    (0..slots.len()).filter(|i| !skip.contains(i)).min_by_key(|&i| slots[i].last_used).unwrap_or(0)
}

fn enqueue(st: &mut State, slot: usize, layer: usize) {
    let s = &mut st.slots[slot];
    s.generation += 1;
    s.layer = Some(layer);
    s.status = Status::Queued;
    let generation = s.generation;
    st.queue.push_back(Job { slot, layer, generation });
}

/// The background reader: fills slots in the order asked, each after the work on its previous contents.
fn reader(shared: &Shared, layouts: &[LayerLayout], engine: &Engine, files: &[Arc<OpenFile>], slots: &[RawDest]) {
    let mut st = lock(shared);
    loop {
        if st.shutdown {
            return;
        }
        let Some(job) = st.queue.pop_front() else {
            st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            continue;
        };
        if st.slots[job.slot].generation != job.generation {
            continue; // superseded before it started
        }
        let release = st.slots[job.slot].release.take();
        drop(st);
        let start = Instant::now();
        let layout = &layouts[job.layer];
        let result = release.as_ref().map_or(Ok(()), |m| m.wait().map_err(Error::from)).and_then(|()| {
            let faults = shared.faults.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let opts = LoadOpts { cancel: Some(&shared.cancel), faults: faults.as_deref(), ..LoadOpts::default() };
            let dests = [(slots[job.slot], layout.bytes)];
            let req = ReadRequest::new(Sources::Open(files), &layout.ranges, Dests::Memory(&dests)).with_opts(opts);
            // SAFETY: the slot is valid for `slot_bytes >= layout.bytes` bytes (checked at construction) and,
            // per the streamer's contract, nobody uses it: its previous layer was released and `release` waited
            // for the work on it.
            unsafe { engine.read(&req) }.map(|_| ())
        });
        let secs = start.elapsed().as_secs_f64();
        st = lock(shared);
        st.stats.loads += 1;
        st.stats.load_secs += secs;
        if result.is_ok() {
            st.stats.bytes += layout.ranges.iter().map(|r| r.len).sum::<u64>();
        }
        let s = &mut st.slots[job.slot];
        if s.generation == job.generation {
            s.status = match result {
                Ok(()) => Status::Ready,
                Err(e) => Status::Failed(e),
            };
        }
        shared.changed.notify_all();
    }
}

impl LayerStreamer {
    /// Stops the reader, waiting for it (what dropping the streamer does; a second call does nothing).
    pub fn shutdown(&mut self) {
        self.shared.cancel.store(true, Ordering::SeqCst);
        lock(&self.shared).shutdown = true;
        self.shared.changed.notify_all();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Drop for LayerStreamer {
    fn drop(&mut self) {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        self.shutdown();
    }
}
