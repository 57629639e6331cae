//! The loading process's side: ask the keeper for a load's files, and build the load from its memory.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use weightlift_cuda::{DeviceBuffer, Gpu};
use weightlift_format::TensorEntry;
use weightlift_io::{HostBuffer, IoReport, OpenFile, ReadEngineUsed};

use super::memory::{Imported, ViewLease};
use super::stamp::{Key, ObjectStamp, Stamp};
use super::wire::{self, Input, PROTO, Reply, Request};
use crate::device::Device;
use crate::engine::Engine;
use crate::path::LoadOpts;
use crate::placement;
use crate::report::{PathUsed, Report};
use crate::settings::{KeeperMode, KeeperSocket};
use crate::tensor::{DeviceTensor, TensorData};

/// How long a keeper may take to take the connection and to answer before the load goes its own way (it answers
/// from memory: a keeper stopped or hung costs the load this much, once).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a load was not served by a keeper.
#[derive(Debug, Default)]
pub(crate) struct NotServed {
    /// `None` where no keeper was asked at all (the setting is off, or the load is of a kind keepers do not serve),
    /// else the reason for the report.
    pub why: Option<String>,
    /// The keeper to ask to keep the files once the load has read them ([`keep_after`]): where it did not keep
    /// them and was not asked to load them yet.
    pub keep_after: Option<PathBuf>,
}

/// Serves the load of `entries` (of `files`, opened by the engine) from a keeper, if the settings name one and it
/// keeps every file; otherwise says why not. With `keep_now`, a keeper that does not keep them starts loading them
/// at once; without, the caller asks it to once its own load has read them ([`keep_after`]): a cold load and the
/// keeper's reading of the same files would otherwise share the disk.
pub(crate) fn ask(
    engine: &Engine,
    files: &[Arc<OpenFile>],
    entries: &[&TensorEntry],
    device: Device,
    opts: &LoadOpts<'_>,
    keep_now: bool,
) -> Result<(Vec<TensorData>, Report), NotServed> {
    let mut keep_after = None;
    ask_inner(engine, files, entries, device, opts, keep_now, &mut keep_after)
        .map_err(|why| NotServed { why, keep_after })
}

/// What the keeper is asked for: each input of the load (a local file by its descriptor, an object by its URL and
/// the ETag it was opened at), the descriptors to send, and the identity of each as this process sees it.
struct Asked<'a> {
    inputs: Vec<Input>,
    fds: Vec<BorrowedFd<'a>>,
    keys: Vec<Key>,
}

/// The inputs of a load of `files`, or why a keeper cannot serve it.
fn asked(files: &[Arc<OpenFile>]) -> Result<Asked<'_>, String> {
    let mut asked = Asked { inputs: Vec::new(), fds: Vec::new(), keys: Vec::new() };
    for f in files {
        // An object is asked for as an object, whether this load reads it or its valid local copy
        // (`remote_cache_dir`): one entry in the keeper, whichever way each load reads it.
        match (f.local(), f.object_or_copy_of()) {
            (_, Some(object)) => {
                let url = super::stamp::display_url(object.url());
                let Some(etag) = object.etag() else {
                    return Err(format!("{url} has no ETag; keepers keep objects by their ETag"));
                };
                if object.object_url().has_query() {
                    // A presigned URL's query changes with each signature: kept under one, it would never be found
                    // under the next, and each miss would be one more copy.
                    return Err(format!("{url} has a query string (a signature, say); keepers keep objects by URL"));
                }
                let o = ObjectStamp { url: object.url().to_string(), etag: etag.to_string(), len: f.len };
                asked.inputs.push(Input::Object(o.clone()));
                asked.keys.push(Key::Object(o));
            }
            (Some(file), None) => {
                let stamp = Stamp::of(file).map_err(|e| format!("{}: {e}", f.path.display()))?;
                if stamp.len != f.len {
                    return Err(format!("{} is {} bytes now, {} when opened", f.path.display(), stamp.len, f.len));
                }
                asked.inputs.push(Input::File);
                asked.fds.push(file.as_fd());
                asked.keys.push(Key::File(stamp));
            }
            (None, None) => return Err(format!("{}: neither a file nor an object", f.path.display())),
        }
    }
    if asked.inputs.len() > wire::MAX_FDS {
        // Its answer carries a descriptor per input, files and objects alike.
        return Err(format!("{} files; a keeper serves loads of at most {}", asked.inputs.len(), wire::MAX_FDS));
    }
    Ok(asked)
}

/// A packed checkpoint's file as a keeper holds it, mapped read-only into this process for a decoder that reads it
/// in place (its chunks decode into the caller's own memory); the keeper's lease ends when this is dropped.
pub(crate) struct KeptPack {
    // Unmapped before the connection (the lease) ends: fields drop in this order.
    imported: Imported,
    _conn: std::os::fd::OwnedFd,
    socket: PathBuf,
    start: Instant,
    phases: Phases,
}

/// Where a kept pack's bytes are: a device address (a keeper on a GPU) or host memory (a `cpu` keeper).
pub(crate) enum KeptBytes<'a> {
    Device(u64),
    Host(&'a [u8]),
}

impl KeptPack {
    /// The whole pack file's bytes (the mapping may be longer: the keeper rounds its memory up).
    pub(crate) fn bytes(&self, len: u64) -> KeptBytes<'_> {
        match &self.imported {
            Imported::Host(h) => KeptBytes::Host(&h.bytes()[..len as usize]),
            Imported::Cuda(_) => KeptBytes::Device(self.imported.device_ptr()),
        }
    }

    /// The keeper's socket.
    pub(crate) fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// The report's note once the pack is decoded (`what` says how), with where the time went.
    pub(crate) fn served(mut self, what: &str) -> String {
        self.phases.mark("decoded");
        let total = self.start.elapsed().as_secs_f64() * 1e3;
        format!("served by the keeper at {}: {what} ({}; {total:.2} ms in all)", self.socket.display(), self.phases)
    }
}

/// Maps the packed checkpoint `file` from a keeper, if the settings name one and it keeps the file; otherwise says
/// why not (and, as for [`ask`] without `keep_now`, whom to ask to keep it once the load has read it).
pub(crate) fn ask_packed(
    engine: &Engine,
    file: &Arc<OpenFile>,
    device: Device,
    opts: &LoadOpts<'_>,
) -> Result<KeptPack, NotServed> {
    let mut keep_after = None;
    let granted = request(engine, std::slice::from_ref(file), &[], device, opts, false, &mut keep_after)
        .map_err(|why| NotServed { why, keep_after })?;
    let not_served = |why| NotServed { why, keep_after: None };
    let Granted { socket, gpu, conn, got, sizes, start, mut phases } = granted;
    let imported = Imported::map(gpu.as_ref(), &got[0], sizes[0], true)
        .map_err(|e| not_served(Some(format!("keeper at {}: mapping its memory: {e}", socket.display()))))?;
    drop(got);
    phases.mark("mapped");
    Ok(KeptPack { imported, _conn: conn, socket, start, phases })
}

/// Asks the keeper at `socket` to keep `files` (after a load that read them), and gives its answer for the report.
pub(crate) fn keep_after(engine: &Engine, socket: &std::path::Path, files: &[Arc<OpenFile>], device: Device) -> String {
    let run = || -> Result<String, String> {
        let Asked { inputs, fds, .. } = asked(files)?;
        let uuid = match device {
            Device::Cuda(n) => {
                let g = engine.gpu(n).map_err(|e| e.to_string())?;
                Some(weightlift_cuda::vmm::gpu_uuid(&g).map_err(|e| e.to_string())?)
            }
            _ => None,
        };
        let conn = wire::connect_within(socket, ANSWER_TIMEOUT).map_err(|e| e.to_string())?;
        wire::check_keeper_user(&conn)?;
        let get = Request::Get { proto: PROTO, device: device.to_string(), uuid, inputs, keep: true };
        wire::send(conn.as_fd(), &get, &fds).map_err(|e| e.to_string())?;
        let (reply, _) = wire::recv::<Reply>(conn.as_fd()).map_err(|e| format!("no answer ({e})"))?;
        Ok(match reply {
            Reply::Hit { .. } => "kept meanwhile".into(),
            Reply::Miss { reason, .. } | Reply::Error { reason, .. } => reason,
            Reply::Status { .. } => "it answered another question".into(),
        })
    };
    run().unwrap_or_else(|e| format!("the keeper could not be asked to keep it: {e}"))
}

/// A keeper's grant of a load's files: one memory descriptor per file, each at least the file's length, leased
/// until `conn` closes.
struct Granted {
    socket: PathBuf,
    gpu: Option<Gpu>,
    conn: std::os::fd::OwnedFd,
    got: Vec<std::os::fd::OwnedFd>,
    sizes: Vec<u64>,
    start: Instant,
    phases: Phases,
}

/// Asks the keeper the settings name for `files` (whose `entries` are loaded): its grant, or why not (`None`: no
/// keeper asked). See [`ask`] for `keep_now` and `keep_after`.
fn request(
    engine: &Engine,
    files: &[Arc<OpenFile>],
    entries: &[&TensorEntry],
    device: Device,
    opts: &LoadOpts<'_>,
    keep_now: bool,
    keep_after: &mut Option<PathBuf>,
) -> Result<Granted, Option<String>> {
    let settings = engine.settings();
    if opts.faults.is_some() || files.is_empty() {
        return Err(None);
    }
    let socket: PathBuf = match &settings.keeper.value {
        KeeperSocket::Off => return Err(None),
        KeeperSocket::Path(p) => p.clone(),
        KeeperSocket::Auto => match (device, super::socket::default_socket(device)) {
            (Device::PinnedCpu, _) | (_, Err(_)) => return Err(None),
            (_, Ok(p)) if !p.exists() => return Err(None),
            (_, Ok(p)) => p,
        },
    };
    let at = |why: String| Some(format!("keeper at {}: {why}", socket.display()));
    if device == Device::PinnedCpu {
        return Err(at("it serves cuda:N and cpu loads, not cpu:pinned".into()));
    }
    if opts.checks.is_some() {
        return Err(at("not asked: the load checks checksums as the files are read".into()));
    }
    let Asked { inputs, fds, keys: mine } = asked(files).map_err(at)?;
    if let Some(e) = entries.iter().find(|e| e.file >= files.len() || e.end() > files[e.file].len) {
        return Err(at(format!("tensor {} lies outside its file", e.name)));
    }
    let start = Instant::now();
    let gpu = match device {
        Device::Cuda(n) => Some(engine.gpu(n).map_err(|e| at(e.to_string()))?),
        _ => None,
    };
    let uuid = match &gpu {
        Some(g) => Some(weightlift_cuda::vmm::gpu_uuid(g).map_err(|e| at(e.to_string()))?),
        None => None,
    };
    let mut phases = Phases::new(start);
    phases.mark("device");
    let conn = wire::connect_within(&socket, ANSWER_TIMEOUT).map_err(|e| at(e.to_string()))?;
    wire::check_keeper_user(&conn).map_err(at)?;
    let get = Request::Get { proto: PROTO, device: device.to_string(), uuid, inputs, keep: keep_now };
    wire::send(conn.as_fd(), &get, &fds).map_err(|e| at(e.to_string()))?;
    let (reply, got) = wire::recv::<Reply>(conn.as_fd()).map_err(|e| at(format!("no answer ({e})")))?;
    let sizes = match reply {
        Reply::Hit { sizes, stamps, .. } if sizes.len() == files.len() && got.len() == files.len() => {
            if let Some(i) = (0..files.len()).find(|&i| stamps.get(i) != Some(&mine[i])) {
                return Err(at(format!("{} changed as it was asked for", files[i].path.display())));
            }
            sizes
        }
        Reply::Hit { .. } => return Err(at("its answer does not match the files asked for".into())),
        Reply::Miss { reason, code, .. } => {
            if !keep_now && (code == "not_kept" || code == "changed") {
                *keep_after = Some(socket.clone());
            }
            return Err(at(reason));
        }
        Reply::Error { reason, .. } => return Err(at(reason)),
        Reply::Status { .. } => return Err(at("it answered another question".into())),
    };
    if let Some(i) = (0..files.len()).find(|&i| sizes[i] < files[i].len) {
        return Err(at(format!(
            "it keeps {} bytes of the {}-byte {}",
            sizes[i],
            files[i].len,
            files[i].path.display()
        )));
    }
    phases.mark("asked");
    Ok(Granted { socket, gpu, conn, got, sizes, start, phases })
}

fn ask_inner(
    engine: &Engine,
    files: &[Arc<OpenFile>],
    entries: &[&TensorEntry],
    device: Device,
    opts: &LoadOpts<'_>,
    keep_now: bool,
    keep_after: &mut Option<PathBuf>,
) -> Result<(Vec<TensorData>, Report), Option<String>> {
    let Granted { socket, gpu, conn, got, sizes, start, mut phases } =
        request(engine, files, entries, device, opts, keep_now, keep_after)?;
    let settings = engine.settings();
    let at = |why: String| Some(format!("keeper at {}: {why}", socket.display()));
    // Views only where every tensor starts where the load's alignment asks (else the tensors are copied).
    let aligned = opts.tensor_align.is_none_or(|a| entries.iter().all(|e| e.offset.is_multiple_of(a)));
    let view = settings.keeper_mode.value == KeeperMode::View && gpu.is_some() && aligned;
    // A copy's destination is allocated beside the mapping (a fresh process's allocation of a checkpoint's size
    // takes about as long as mapping the keeper's memory): on a thread of its own, joined before the copy.
    let plan = match &gpu {
        Some(g) if !view => Some((g, CopyPlan::new(entries, opts.tensor_align))),
        _ => None,
    };
    // The stream of the copy: the one after the lanes' own.
    let lane = engine.io().lanes();
    let alloc = opts.device_alloc;
    let (mapped, dest) = std::thread::scope(|scope| {
        let dest = plan.as_ref().map(|(g, p)| {
            scope.spawn(move || {
                let t = Instant::now();
                allocate(g, p.total, alloc, lane).map(|b| (b, t.elapsed()))
            })
        });
        // Mapped read-only either way: a copy only reads it.
        let mapped: crate::error::Result<Vec<Arc<Imported>>> = got
            .iter()
            .zip(&sizes)
            .map(|(fd, &size)| Imported::map(gpu.as_ref(), fd, size, true).map(Arc::new))
            .collect();
        let dest = dest.map(|h| {
            h.join().unwrap_or_else(|_| Err(crate::error::Error::InvalidArgument("allocating panicked".into())))
        });
        (mapped, dest)
    });
    let imported = mapped.map_err(|e| at(format!("mapping its memory: {e}")))?;
    drop(got);
    match &dest {
        Some(Ok((_, took))) => phases.mark_beside("mapped and allocated", "allocating", *took),
        _ => phases.mark("mapped"),
    }
    let bytes: u64 = entries.iter().map(|e| e.nbytes).sum();
    let (datas, what) = match &gpu {
        Some(g) if view => {
            let lease = Arc::new(ViewLease::new(imported.clone(), conn));
            let blocks: Vec<Arc<DeviceBuffer>> = imported
                .iter()
                .map(|m| {
                    let len = match &**m {
                        Imported::Cuda(c) => c.len() as usize,
                        Imported::Host(h) => h.len,
                    };
                    // SAFETY: the mapping is device memory of this context, `len` bytes, alive as long as `lease`.
                    Arc::new(unsafe { DeviceBuffer::external(g, m.device_ptr(), len, Box::new(lease.clone())) })
                })
                .collect();
            let datas = entries
                .iter()
                .map(|e| {
                    TensorData::Device(DeviceTensor { block: blocks[e.file].clone(), offset: e.offset, len: e.nbytes })
                })
                .collect();
            let enforced = imported.iter().all(|m| matches!(&**m, Imported::Cuda(c) if c.is_read_only()));
            let how = if enforced {
                "mapped read-only"
            } else {
                "read-only by contract (the driver refused a read-only mapping)"
            };
            (datas, format!("views of its memory, {how}; nothing copied"))
        }
        Some(g) => {
            let (Some((_, plan)), Some(dest)) = (plan, dest) else {
                return Err(at("no copy was planned".into()));
            };
            let (dest, _) = dest.map_err(|e| at(e.to_string()))?;
            let copies = plan.runs.iter().filter(|r| r.3 > 0).count();
            let datas = copy_on_device(g, &imported, entries, plan, dest, lane, opts, &mut phases)
                .map_err(|e| at(e.to_string()))?;
            drop(imported);
            drop(conn); // the copy is done: the leases end
            (
                datas,
                format!(
                    "copied device to device into {} in {copies} cop{}",
                    opts.device_alloc.map_or("the pool".into(), |a| a.name()),
                    if copies == 1 { "y" } else { "ies" }
                ),
            )
        }
        None => {
            let datas = copy_on_host(engine, &imported, entries).map_err(|e| at(e.to_string()))?;
            phases.mark("copied");
            drop(imported);
            drop(conn);
            (datas, "copied from its shared memory".to_string())
        }
    };
    if let Some(p) = opts.progress {
        p.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }
    let secs = start.elapsed().as_secs_f64();
    let note = format!("served by the keeper at {}: {what} ({phases})", socket.display());
    let io = IoReport::blank(ReadEngineUsed::Pread, String::new());
    let mut report = engine.report(device, Vec::new(), entries.len(), bytes, io);
    report.path = PathUsed::Keeper;
    report.path_reason = note.clone();
    report.keeper = Some(note);
    report.seconds = secs;
    report.gpu = gpu.as_ref().map(|g| g.info().clone());
    if gpu.is_some() && !view {
        report.device_memory = Some(opts.device_alloc.map_or("pool".into(), |a| a.name()));
    }
    Ok((datas, report))
}

/// Where a copy puts the load's blocks: all in one allocation of `total` bytes (a fresh process pays per allocation:
/// one for the load, not one per block). A load from files gives each block an allocation of its own, so that each
/// tensor lands 256-aligned (a large one) or as aligned as in the file mod 256 (one in a shared block). Here a block
/// goes where it keeps its distance from the block before it in the file, if that leaves each of its tensors at
/// least that aligned and carries at most [`placement::GAP_MAX`] bytes between them along: the two are then one copy
/// (a checkpoint whose tensors are multiples of 256 bytes, as most are, is one copy instead of one per large tensor:
/// copies of a few MiB each run well below the device's copy rate). Otherwise it starts a new copy at the next
/// 256-byte multiple.
struct CopyPlan {
    placement: placement::Placement,
    starts: Vec<u64>,
    total: u64,
    /// The copies: (file, source offset, destination offset, bytes), each covering one or more whole blocks.
    runs: Vec<(usize, u64, u64, u64)>,
}

/// The alignment of `x`, up to [`placement::DEVICE_ALIGN`].
fn alignment(x: u64) -> u64 {
    (1u64 << x.trailing_zeros().min(63)).min(placement::DEVICE_ALIGN)
}

impl CopyPlan {
    fn new(entries: &[&TensorEntry], align: Option<u64>) -> CopyPlan {
        let placement = placement::pack_aligned(entries, align);
        let mut inside: Vec<Vec<u64>> = vec![Vec::new(); placement.blocks.len()];
        for &(b, offset) in &placement.tensors {
            inside[b].push(offset);
        }
        let mut starts = Vec::with_capacity(placement.blocks.len());
        let mut runs: Vec<(usize, u64, u64, u64)> = Vec::new();
        let mut total = 0u64;
        let mut prev: Option<(placement::Block, u64)> = None;
        for (b, offsets) in placement.blocks.iter().zip(&inside) {
            // The place that keeps this block's distance from the previous one (blocks come in file order; a shared
            // block may start before the previous block's end, at its first tensor's offset rounded down to 256:
            // at the same distance, the bytes both hold are the same).
            let keeps = prev.and_then(|(p, at)| {
                let there = (at + b.start).checked_sub(p.start)?;
                let aligned = offsets.iter().all(|&o| alignment(there + o) >= alignment(o));
                (p.file == b.file && aligned && there.saturating_sub(at + p.len) <= placement::GAP_MAX).then_some(there)
            });
            let at = keeps.unwrap_or_else(|| total.next_multiple_of(placement::DEVICE_ALIGN));
            match (keeps, runs.last_mut()) {
                (Some(_), Some(run)) => run.3 = (run.2 + run.3).max(at + b.len) - run.2,
                _ => runs.push((b.file, b.start, at, b.len)),
            }
            starts.push(at);
            total = total.max(at + b.len);
            prev = Some((*b, at));
        }
        CopyPlan { placement, starts, total, runs }
    }
}

/// A copy's destination: `total` bytes from the caller's allocator (the copy waits for its stream), or from the
/// device's pool on the copy's stream (`gpu`'s stream `lane`).
fn allocate(
    gpu: &weightlift_cuda::Gpu,
    total: u64,
    alloc: Option<&dyn weightlift_cuda::DeviceAllocator>,
    lane: usize,
) -> crate::error::Result<DeviceBuffer> {
    let _restore = weightlift_cuda::ContextRestore::save();
    gpu.bind()?;
    Ok(match alloc {
        Some(a) if total > 0 => a.alloc(gpu, total as usize)?,
        _ => DeviceBuffer::alloc(gpu, total as usize, &*gpu.stream(lane)?)?,
    })
}

/// Copies each of the plan's blocks from the kept memory into `buf` (made by [`allocate`] for `plan`).
#[allow(clippy::too_many_arguments)]
fn copy_on_device(
    gpu: &weightlift_cuda::Gpu,
    imported: &[Arc<Imported>],
    entries: &[&TensorEntry],
    plan: CopyPlan,
    buf: DeviceBuffer,
    lane: usize,
    opts: &LoadOpts<'_>,
    phases: &mut Phases,
) -> crate::error::Result<Vec<TensorData>> {
    let _restore = weightlift_cuda::ContextRestore::save();
    gpu.bind()?;
    let stream = gpu.stream(lane)?;
    if let Some(a) = opts.device_alloc {
        // SAFETY: the allocator promises its stream lives in this context.
        unsafe { weightlift_cuda::wait_for_stream(gpu, &stream, a.ready_stream()) }?;
    }
    let CopyPlan { placement, starts, runs, .. } = plan;
    for &(file, from, to, len) in &runs {
        if len == 0 {
            continue;
        }
        let src = imported[file].device_ptr() + from;
        // SAFETY: the run lies inside the allocation (`total` covers every block, and a run ends with its last
        // block); the source lies inside the mapped file (the caller checked every tensor against the file's
        // length; a run spans blocks of one file, from its first block's start to its last one's end); both live
        // until the synchronisation below.
        unsafe {
            weightlift_cuda::vmm::copy_device_to_device(
                gpu,
                buf.device_ptr() + to,
                src,
                len as usize,
                stream.cu_stream(),
            )
        }?;
    }
    stream.synchronize().map_err(|error| weightlift_cuda::CudaError::Driver {
        device: gpu.ordinal(),
        call: "cuStreamSynchronize",
        error,
    })?;
    phases.mark("copied");
    let buf = Arc::new(buf);
    Ok(placement
        .tensors
        .iter()
        .zip(entries)
        .map(|(&(b, offset), t)| {
            TensorData::Device(DeviceTensor { block: buf.clone(), offset: starts[b] + offset, len: t.nbytes })
        })
        .collect())
}

/// Where a served load's time went, for its report: each step's time since the one before.
struct Phases {
    last: Instant,
    /// Each step, and what ran beside it on another thread.
    steps: Vec<(&'static str, Duration, Option<Step>)>,
}

/// A step's name and time.
type Step = (&'static str, Duration);

impl Phases {
    fn new(start: Instant) -> Self {
        Phases { last: start, steps: Vec::new() }
    }

    /// Ends the step called `what` now.
    fn mark(&mut self, what: &'static str) {
        let now = Instant::now();
        self.steps.push((what, now - self.last, None));
        self.last = now;
    }

    /// Ends the step called `what` now, `beside` (which took `took`) having run beside it.
    fn mark_beside(&mut self, what: &'static str, beside: &'static str, took: Duration) {
        self.mark(what);
        if let Some(last) = self.steps.last_mut() {
            last.2 = Some((beside, took));
        }
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (what, d, beside)) in self.steps.iter().enumerate() {
            write!(f, "{}{what} {:.2} ms", if i == 0 { "" } else { ", " }, d.as_secs_f64() * 1e3)?;
            if let Some((b, took)) = beside {
                write!(f, " ({b} {:.2} ms of it)", took.as_secs_f64() * 1e3)?;
            }
        }
        Ok(())
    }
}

/// Each tensor copied out of the kept memfds, in parallel.
fn copy_on_host(
    engine: &Engine,
    imported: &[Arc<Imported>],
    entries: &[&TensorEntry],
) -> crate::error::Result<Vec<TensorData>> {
    let mut bufs: Vec<HostBuffer> = entries
        .iter()
        .map(|e| HostBuffer::new(e.nbytes as usize, Some(engine.host_cache())))
        .collect::<std::result::Result<_, _>>()?;
    bufs.par_iter_mut().zip(entries.par_iter()).for_each(|(buf, e)| {
        if let Imported::Host(map) = &*imported[e.file] {
            buf.copy_from_slice(&map.bytes()[e.offset as usize..e.end() as usize]);
        }
    });
    Ok(bufs.into_iter().map(TensorData::Host).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weightlift_format::DType;

    fn t(file: usize, offset: u64, nbytes: u64) -> TensorEntry {
        TensorEntry { name: format!("t{file}-{offset}"), dtype: DType::U8, shape: vec![nbytes], file, offset, nbytes }
    }

    /// Runs the plan's copies on host memory and checks every tensor lands whole at its place, every block start
    /// at a multiple of 256 and within `total`; returns how many copies it took.
    fn check(entries: &[TensorEntry]) -> usize {
        let files: Vec<Vec<u8>> = (0..2)
            .map(|f| {
                let len = entries.iter().filter(|e| e.file == f).map(|e| e.end()).max().unwrap_or(0);
                (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(f as u8 * 7 + 1)).collect()
            })
            .collect();
        let refs: Vec<&TensorEntry> = entries.iter().collect();
        let plan = CopyPlan::new(&refs, None);
        let mut dest = vec![0u8; plan.total as usize];
        for &(file, from, to, len) in &plan.runs {
            dest[to as usize..(to + len) as usize].copy_from_slice(&files[file][from as usize..(from + len) as usize]);
        }
        for (e, &(b, off)) in entries.iter().zip(&plan.placement.tensors) {
            let at = (plan.starts[b] + off) as usize;
            // At least as aligned as a load from the files places it (its block at a 256-byte multiple).
            assert!(alignment(at as u64) >= alignment(off), "{}", e.name);
            assert!(
                dest[at..at + e.nbytes as usize] == files[e.file][e.offset as usize..e.end() as usize],
                "{}",
                e.name
            );
        }
        plan.runs.len()
    }

    #[test]
    fn tensors_of_256_byte_multiples_are_one_copy_and_others_land_right() {
        // Large tensors, sizes multiples of 256, from an unaligned data start (as safetensors writes): one copy.
        let base = 8 + 1000;
        let mut e = Vec::new();
        let mut at = base;
        for n in [4 << 20, 2 << 20, 10240, 512, 3 << 20] {
            e.push(t(0, at, n));
            at += n;
        }
        assert_eq!(check(&e), 1);
        // A size that is not a multiple of 256 breaks the run after it; another file starts a new one; a subset
        // (a gap past GAP_MAX in the file) does not copy the gap.
        e.push(t(0, at, (2 << 20) + 3));
        e.push(t(0, at + (2 << 20) + 3, 4 << 20));
        e.push(t(0, at + (40 << 20), 2 << 20));
        e.push(t(1, 8, 3 << 20));
        e.push(t(1, 8 + (3 << 20), 1 << 20));
        assert_eq!(check(&e), 4);
        let refs: Vec<&TensorEntry> = e.iter().collect();
        let wanted: u64 = e.iter().map(|x| x.nbytes).sum();
        assert!(CopyPlan::new(&refs, None).total < wanted + (1 << 20), "a gap past GAP_MAX is not carried along");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        // Any layout (sizes small and large, aligned or not, gaps, two files, a subset): every tensor lands whole at
        // its place, at least as aligned as a load from the files places it.
        #[test]
        fn any_layout_lands_whole_and_aligned(
            steps in proptest::collection::vec((0usize..2, 0u64..(3 << 19), 0u64..(100 << 10), proptest::bool::ANY), 1..24),
            base in 8u64..2048,
        ) {
            let mut at = [base, base];
            let mut e = Vec::new();
            for (file, n, gap, aligned) in steps {
                let n = if aligned { n / 256 * 256 + 256 } else { n + 1 };
                let gap = if aligned { gap / 256 * 256 } else { gap };
                at[file] += gap;
                e.push(t(file, at[file], n));
                at[file] += n;
            }
            check(&e);
        }
    }
}
