//! Whole loads: a checkpoint, some of its tensors, or byte ranges as tensors, into memory the engine allocates
//! (host, pinned or device), their checksums checked as the bytes land.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use weightlift_cuda::{DeviceBuffer, Gpu, PinnedBuffer, Targets};
use weightlift_format::{DType, TensorEntry, TensorIndex};
use weightlift_io::{Extent, HostBuffer, HostSink, LoadRequest, Observed, OpenFile};

use super::{Engine, io_opts, settle_copies};
use crate::checked::{Checks, CpuChecker, GpuChecker, HostDest, Layout, Watch};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::path::{DeviceRead, LoadOpts};
use crate::placement;
use crate::report::{CheckStats, NetworkStats, Report};
use crate::tensor::{DeviceTensor, Loaded, RawDest, Tensor, TensorData};

/// Device allocations are published to the lanes in batches that grow from one block to this many bytes: the
/// first reads find their destination at once, later ones cost few events.
const MAX_PUBLISH_BYTES: u64 = 256 << 20;

impl Engine {
    /// Loads every tensor of `index` onto `device`.
    pub fn load(&self, index: &TensorIndex, device: Device, opts: &LoadOpts<'_>) -> Result<Loaded> {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        let all: Vec<usize> = (0..index.tensors.len()).collect();
        self.load_some(index, &all, device, opts)
    }

    /// Loads the tensors of `index` at positions `which` (in that order).
    pub fn load_some(
        &self,
        index: &TensorIndex,
        which: &[usize],
        device: Device,
        opts: &LoadOpts<'_>,
    ) -> Result<Loaded> {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        let start = Instant::now();
        let entries = entries_at(index, which)?;
        // Checked whatever the destination (host loads ignore it), before any file or device is opened.
        if let Some(a) = opts.tensor_align.filter(|&a| !a.is_power_of_two() || a > placement::DEVICE_ALIGN) {
            return Err(Error::InvalidArgument(format!(
                "tensor_align {a}: expected a power of two up to {}",
                placement::DEVICE_ALIGN
            )));
        }
        let names = match opts.checks {
            Some(checks) => check_names(checks, index, &entries)?,
            None => Vec::new(),
        };
        let files = self.open_files_writing(&index.files, &whole_files(index, which))?;
        // A keeper that keeps every file serves the load from its memory; otherwise its reason goes in the report.
        let (datas, mut report) = match crate::keep::ask(self, &files, &entries, device, opts, false) {
            Ok(served) => served,
            Err(not_served) => {
                let before = NetworkStats::before(&files);
                let loaded = match device {
                    Device::Cpu | Device::PinnedCpu => self.load_host(&files, &entries, device, opts, names),
                    Device::Cuda(n) => self.load_device(n, &files, &entries, opts, names),
                };
                let (datas, mut report) = settle_copies(&files, loaded)?;
                report.network = NetworkStats::of(&files, &before, Some(&report.io));
                report.keeper = not_served.why;
                if let Some(socket) = not_served.keep_after {
                    // Asked only now, so that the keeper reads what this load has just read instead of reading
                    // beside it.
                    let answer = crate::keep::keep_after(self, &socket, &files, device);
                    report.keeper = Some(format!("{}; after the load: {answer}", report.keeper.unwrap_or_default()));
                }
                (datas, report)
            }
        };
        let tensors: Vec<Tensor> = entries.iter().zip(datas).map(|(t, data)| tensor_of(t, data)).collect();
        report.files = index.files.iter().map(|f| f.path.clone()).collect();
        report.seconds = start.elapsed().as_secs_f64();
        Ok(Loaded { tensors, report })
    }

    /// The tensors of `index` at positions `which` from a keeper (`weightlift keep`) only: `Ok(Err(why))` where the
    /// settings name none (`why` is `None`) or it does not serve them (a normal load then reads them; `why` says
    /// why, for reports). For loads that would rather stream a checkpoint a keeper does not hold (`safe_open`).
    pub fn load_kept(
        &self,
        index: &TensorIndex,
        which: &[usize],
        device: Device,
        opts: &LoadOpts<'_>,
    ) -> Result<std::result::Result<Loaded, Option<String>>> {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        let start = Instant::now();
        let entries = entries_at(index, which)?;
        // Opened as parsing left them (objects at the ETag the header was read at, or their valid local copies): no
        // request, no local copy written.
        let files = self.open_index(index)?;
        // Where the keeper does not serve them the caller reads them itself (a stream): the keeper may start on
        // local files now, from the page cache the stream fills; an object it would fetch beside the stream, from
        // the same network, so it is left to whole loads and `keep` by name.
        let objects = files.iter().any(|f| f.object().is_some());
        Ok(match crate::keep::ask(self, &files, &entries, device, opts, !objects) {
            Ok((datas, mut report)) => {
                let tensors = entries.iter().zip(datas).map(|(t, data)| tensor_of(t, data)).collect();
                report.files = index.files.iter().map(|f| f.path.clone()).collect();
                report.seconds = start.elapsed().as_secs_f64();
                Ok(Loaded { tensors, report })
            }
            Err(not_served) => Err(not_served.why),
        })
    }

    /// Host destinations (plain or pinned), filled by the lanes (buffered reads land in place).
    fn load_host(
        &self,
        files: &[Arc<OpenFile>],
        entries: &[&TensorEntry],
        device: Device,
        opts: &LoadOpts<'_>,
        names: Vec<(String, PathBuf)>,
    ) -> Result<(Vec<TensorData>, Report)> {
        let dest_lens: Vec<u64> = entries.iter().map(|t| t.nbytes).collect();
        let extents = extents_of(entries);
        let t = Instant::now();
        let pinned = device == Device::PinnedCpu;
        let gpu = if pinned { Some(self.gpu(0)?) } else { None };
        let mut datas: Vec<TensorData> = dest_lens
            .iter()
            .map(|&n| match &gpu {
                Some(g) => Ok(TensorData::Pinned(PinnedBuffer::alloc(g, n as usize)?)),
                None => Ok(TensorData::Host(HostBuffer::new(n as usize, Some(&self.host_cache))?)),
            })
            .collect::<Result<_>>()?;
        let alloc_secs = t.elapsed().as_secs_f64();
        let dests: Vec<(*mut u8, usize)> = datas.iter_mut().map(host_range).collect();
        // SAFETY: each range is a distinct buffer of `datas`, which stays alive and untouched until the load below
        // has returned.
        let sink = unsafe { HostSink::new(dests.clone()) };
        let req = LoadRequest { files, extents: &extents, dest_lens: &dest_lens };
        let Some(checks) = opts.checks else {
            let io = self.io.load(&req, &io_opts(opts), &sink)?;
            let mut report = self.report(device, Vec::new(), entries.len(), dest_lens.iter().sum(), io);
            report.alloc_secs = alloc_secs;
            return Ok((datas, report));
        };
        // Each tensor is hashed on a thread of its own as soon as it has landed.
        let parts = (0..entries.len()).map(|i| vec![(i, 0)]).collect();
        let host = dests.iter().map(|&(ptr, len)| HostDest { ptr, len }).collect();
        let mut checker = CpuChecker::new(Layout { checks, parts, names }, host, "cpu".into());
        let (watch, rx) = Watch::new(dest_lens.clone());
        let observer = |p: &[weightlift_io::Piece]| watch.observe(p);
        let observed = Observed { inner: &sink, observer: &observer };
        let (io, read_end) = std::thread::scope(|scope| {
            let c = &mut checker;
            let hashing = scope.spawn(move || c.run(&rx));
            let closing = CloseOnDrop(&watch);
            let io = self.io.load(&req, &io_opts(opts), &observed);
            let read_end = Instant::now();
            drop(closing);
            let joined = hashing.join().map_err(|_| Error::Verify("the checking thread panicked".into()));
            joined.and(io.map_err(Error::from)).map(|io| (io, read_end))
        })?;
        let stats = checker.finish(read_end)?;
        let mut report = self.report(device, Vec::new(), entries.len(), dest_lens.iter().sum(), io);
        report.alloc_secs = alloc_secs;
        report.checks = Some(stats);
        Ok((datas, report))
    }

    /// Device destinations: small neighbours share blocks that mirror the file; blocks are allocated while the
    /// reads already run, and published to the lanes as they come.
    fn load_device(
        &self,
        n: u32,
        files: &[Arc<OpenFile>],
        entries: &[&TensorEntry],
        opts: &LoadOpts<'_>,
        names: Vec<(String, PathBuf)>,
    ) -> Result<(Vec<TensorData>, Report)> {
        tracing::debug!(device = n, "device load called");
        let gpu = self.gpu(n)?;
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        gpu.bind()?;
        let path = self.gpu_path(n)?;
        path.refuse_objects(files)?;
        // Every lane's stream and the allocation's, made now: made by the lanes as they start, beside their pinning
        // and the allocation, 17 took 9.2 ms of a first load on the H100, against 0.7 ms made together before
        // (bench/results/2026-11-25-h100-zc at b3a4ec8). Nothing to do once made.
        gpu.stream(self.io.lanes())?;
        tracing::debug!(device = n, "device and data path ready");
        let placement = placement::pack_aligned(entries, opts.tensor_align);
        let block_extents: Vec<Extent> = placement
            .blocks
            .iter()
            .enumerate()
            .map(|(i, b)| Extent { file: b.file as u32, offset: b.start, len: b.len, dest: i as u32, dest_offset: 0 })
            .collect();
        let block_lens: Vec<u64> = placement.blocks.iter().map(|b| b.len).collect();
        let targets = Targets::lazy(block_lens.len());
        let mut blocks: Vec<DeviceBuffer> = Vec::with_capacity(block_lens.len());
        let mut alloc_secs = 0.0;
        // With expected checksums, a checker hashes each block on the GPU as soon as it has landed (a watch counts
        // what landed); loads without them build neither.
        let mut checker = opts.checks.map(|checks| {
            let mut parts: Vec<Vec<(usize, u64)>> = vec![Vec::new(); block_lens.len()];
            for (i, &(b, offset)) in placement.tensors.iter().enumerate() {
                parts[b].push((i, offset));
            }
            self.gpu_checker(&gpu, Layout { checks, parts, names })
        });
        let (watch, rx) = match checker {
            Some(Ok(_)) => {
                let (w, rx) = Watch::new(block_lens.clone());
                (Some(w), Some(rx))
            }
            _ => (None, None),
        };
        let observer = |p: &[weightlift_io::Piece]| watch.iter().for_each(|w| w.observe(p));
        let read = DeviceRead {
            gpu: &gpu,
            files,
            extents: &block_extents,
            dest_lens: &block_lens,
            targets: &targets,
            opts,
            observer: watch.is_some().then_some(&observer as _),
        };
        let outcome = std::thread::scope(|scope| {
            let hashing = match (&mut checker, rx) {
                (Some(Ok(c)), Some(rx)) => {
                    let address = |d: usize| targets.wait(d as u32).ok().map(|(ptr, _, _)| ptr);
                    Some(scope.spawn(move || c.run(&rx, &address)))
                }
                _ => None,
            };
            let closing = watch.as_ref().map(CloseOnDrop);
            tracing::debug!(blocks = block_lens.len(), "device load starts");
            let outcome = path.imp.read(&self.io, &read, &mut || {
                let t = Instant::now();
                tracing::debug!("allocating");
                let r =
                    allocate_published(&gpu, &block_lens, &targets, self.io.lanes(), opts.device_alloc, &mut blocks);
                alloc_secs = t.elapsed().as_secs_f64();
                tracing::debug!(secs = alloc_secs, "allocated");
                r
            });
            let read_end = Instant::now();
            drop(closing);
            let joined = match hashing {
                Some(h) => h.join().map_err(|_| Error::Verify("the checking thread panicked".into())),
                None => Ok(()),
            };
            joined.and(outcome).map(|o| (o, read_end))
        });
        // On failure the checker (and the hashing it queued) goes before the blocks it reads. Neither a free
        // ordered on the legacy stream (the pool's) nor memory given back to another allocator waits for copies
        // still in flight on the lanes' streams, which are non-blocking: those streams finish them first.
        let (outcome, read_end) = match outcome {
            Err(e) => {
                let quiet = (0..=self.io.lanes()).try_for_each(|i| {
                    gpu.stream(i)?.synchronize().map_err(|error| weightlift_cuda::CudaError::Driver {
                        device: n,
                        call: "cuStreamSynchronize",
                        error,
                    })
                });
                if let Err(s) = quiet {
                    tracing::warn!("waiting for a failed load's copies before releasing its memory: {s}");
                    std::mem::forget(std::mem::take(&mut blocks)); // leaked rather than reused under a copy
                }
                return Err(e);
            }
            Ok(o) => o,
        };
        let checks = match checker {
            None => None,
            Some(Ok(c)) => {
                let (stats, unpacker) = c.finish(read_end, &|d| blocks.get(d).map(|b| b.device_ptr()))?;
                self.give_unpacker(n, unpacker);
                Some(stats)
            }
            Some(Err((layout, why))) => Some(check_read_back(layout, &blocks, &why)?),
        };
        let blocks: Vec<Arc<DeviceBuffer>> = blocks.into_iter().map(Arc::new).collect();
        let datas = placement
            .tensors
            .iter()
            .zip(entries)
            .map(|(&(b, offset), t)| {
                TensorData::Device(DeviceTensor { block: blocks[b].clone(), offset, len: t.nbytes })
            })
            .collect();
        let bytes = entries.iter().map(|t| t.nbytes).sum();
        let mut report = self.device_report(Device::Cuda(n), &gpu, &path, outcome, entries.len(), bytes);
        report.alloc_secs = alloc_secs;
        report.device_memory = Some(match opts.device_alloc {
            Some(a) => a.name(),
            None => "pool".into(),
        });
        report.checks = checks;
        Ok((datas, report))
    }

    /// Loads byte ranges `(file, offset, len)` of `paths` as 1-D byte tensors (named `""`), in the order given,
    /// through one plan.
    pub fn load_ranges(
        &self,
        paths: &[PathBuf],
        ranges: &[(usize, u64, u64)],
        device: Device,
        opts: &LoadOpts<'_>,
    ) -> Result<Loaded> {
        let files = paths.iter().map(|p| raw_source(p)).collect::<Result<Vec<_>>>()?;
        self.load_ranges_of(files, ranges, device, opts)
    }

    /// [`Engine::load_ranges`] over files described already (as a parsed index gives them: an object's ranges are
    /// then read from the version the index was parsed from, or not at all).
    pub fn load_ranges_of(
        &self,
        files: Vec<weightlift_format::SourceFile>,
        ranges: &[(usize, u64, u64)],
        device: Device,
        opts: &LoadOpts<'_>,
    ) -> Result<Loaded> {
        let index = ranges_index(files, ranges)?;
        self.load(&index, device, opts)
    }

    /// Checks tensors already in caller memory against `checks` (for the tensors of `index` at positions `which`,
    /// as [`Checks::from_manifests`] gives them): tensor `k` is read at `dests[k]`, host memory in place, device
    /// memory copied back one tensor at a time through one host buffer. For fronts that read tensors into their
    /// caller's memory by ranges (the C API's `wl_load_tensors_checked`); loads check while the bytes land instead.
    /// A mismatch is an error naming tensor, file and chunk.
    ///
    /// # Safety
    /// Each destination must be valid for reads of its tensor's bytes (device memory of the named device for
    /// `RawDest::Device`) and not be written by anything else until this returns.
    pub unsafe fn check_memory(
        &self,
        checks: &Checks,
        index: &TensorIndex,
        which: &[usize],
        dests: &[RawDest],
    ) -> Result<CheckStats> {
        let start = Instant::now();
        let entries = entries_at(index, which)?;
        if dests.len() != entries.len() {
            return Err(Error::InvalidArgument(format!("{} destinations for {} tensors", dests.len(), entries.len())));
        }
        let names = check_names(checks, index, &entries)?;
        let parts = (0..entries.len()).map(|i| vec![(i, 0)]).collect();
        let on = match dests.iter().find_map(|d| match d {
            RawDest::Device { ordinal, .. } => Some(*ordinal),
            RawDest::Host(_) => None,
        }) {
            Some(n) => format!("cpu, read back from cuda:{n}"),
            None => "cpu".to_string(),
        };
        let none = HostDest { ptr: std::ptr::null(), len: 0 };
        let mut checker = CpuChecker::new(Layout { checks, parts, names }, vec![none; entries.len()], on);
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        let mut host = Vec::new();
        for (k, (t, d)) in entries.iter().zip(dests).enumerate() {
            let at = match *d {
                RawDest::Host(ptr) => HostDest { ptr, len: t.nbytes as usize },
                RawDest::Device { ordinal, ptr } => {
                    let gpu = self.gpu(ordinal)?;
                    gpu.bind()?;
                    host.resize(t.nbytes as usize, 0);
                    // SAFETY: per this function's contract the device range holds the tensor's bytes.
                    unsafe { weightlift_cuda::copy_device_to_host(&gpu, ptr, &mut host) }?;
                    HostDest { ptr: host.as_ptr(), len: host.len() }
                }
            };
            checker.check_one(k, at)?;
        }
        checker.finish(start)
    }

    /// A checker hashing blocks on `gpu` with the decoder's kernels, or the layout back with the reason they cannot
    /// run here (NVRTC missing, say).
    fn gpu_checker<'a>(
        &self,
        gpu: &Gpu,
        layout: Layout<'a>,
    ) -> std::result::Result<GpuChecker<'a>, (Layout<'a>, String)> {
        match self.take_unpacker(gpu) {
            Ok(u) => Ok(GpuChecker::new(layout, u, gpu.ordinal())),
            Err(e) => Err((layout, e.to_string())),
        }
    }
}

/// Per file of `index`, whether the tensors at positions `which` are the whole file: all of its tensors, covering
/// at least 15/16 of its bytes past the header (a safetensors file's tensors cover them all; GGUF leaves alignment
/// padding; byte ranges of a raw file may cover little of it). Only such a load writes its local copy
/// (`remote_cache_dir`): the copy is completed with what no GET of the load covered, which for a partial load may
/// be most of the object, so its copy is left to a whole load.
fn whole_files(index: &TensorIndex, which: &[usize]) -> Vec<bool> {
    let n = index.files.len();
    let (mut untaken, mut bytes) = (vec![0usize; n], vec![0u64; n]);
    for t in &index.tensors {
        if let (Some(u), Some(b)) = (untaken.get_mut(t.file), bytes.get_mut(t.file)) {
            *u += 1;
            *b = b.saturating_add(t.nbytes);
        }
    }
    let mut seen = vec![false; index.tensors.len()];
    for &i in which {
        if let (Some(t), Some(false)) = (index.tensors.get(i), seen.get(i).copied()) {
            seen[i] = true;
            if let Some(u) = untaken.get_mut(t.file) {
                *u -= 1;
            }
        }
    }
    index
        .files
        .iter()
        .zip(untaken.iter().zip(&bytes))
        .map(|(f, (&u, &b))| u == 0 && u128::from(b) * 16 >= u128::from(f.len.saturating_sub(f.data_start)) * 15)
        .collect()
}

/// `path` as a raw source: its length (an object's from the GET that opens it, with its ETag; the object travels
/// on as opened).
fn raw_source(path: &Path) -> Result<weightlift_format::SourceFile> {
    let (len, object) = match weightlift_remote::Location::new(path).map_err(weightlift_io::IoError::Remote)? {
        weightlift_remote::Location::Object(url) => {
            let f = OpenFile::open_object(&url, None)?;
            (f.len, f.object().cloned())
        }
        weightlift_remote::Location::Local(_) => {
            let meta = std::fs::metadata(path)
                .map_err(|cause| Error::Io(weightlift_io::IoError::Open { path: path.to_path_buf(), cause }))?;
            (meta.len(), None)
        }
    };
    let etag = object.as_ref().and_then(|o| o.etag().map(str::to_string));
    Ok(weightlift_format::SourceFile {
        path: path.to_path_buf(),
        format: weightlift_format::Format::Raw,
        len,
        data_start: 0,
        metadata: weightlift_format::Metadata::None,
        gguf_version: None,
        etag,
        header: None,
        object,
    })
}

/// Validates `checks` against the tensors of a load; each tensor's name and file, for error messages.
fn check_names(checks: &Checks, index: &TensorIndex, entries: &[&TensorEntry]) -> Result<Vec<(String, PathBuf)>> {
    if checks.tensors.len() != entries.len() {
        return Err(Error::InvalidArgument(format!(
            "checksums given for {} tensors, the load has {}",
            checks.tensors.len(),
            entries.len()
        )));
    }
    for (t, chunks) in entries.iter().zip(&checks.tensors) {
        if let Some(c) = chunks.iter().find(|c| c.start.checked_add(c.len).is_none_or(|end| end > t.nbytes)) {
            return Err(Error::Verify(format!(
                "a checksum of {:?} covers bytes {}..{}, past its {} bytes",
                t.name,
                c.start,
                c.start.saturating_add(c.len),
                t.nbytes
            )));
        }
    }
    Ok(entries.iter().map(|t| (t.name.clone(), index.files[t.file].path.clone())).collect())
}

/// Checks device blocks by copying them back and hashing on the CPU: where the GPU's hash kernels cannot run.
fn check_read_back(layout: Layout<'_>, blocks: &[DeviceBuffer], why: &str) -> Result<CheckStats> {
    let start = Instant::now();
    let none = HostDest { ptr: std::ptr::null(), len: 0 };
    let mut checker =
        CpuChecker::new(layout, vec![none; blocks.len()], format!("cpu, read back from the device: {why}"));
    // One block at a time through one buffer: host memory of the largest block, not of the whole load.
    let mut host = Vec::new();
    for (d, b) in blocks.iter().enumerate() {
        host.resize(b.len(), 0);
        b.read_back(0, &mut host)?;
        checker.check_one(d, HostDest { ptr: host.as_ptr(), len: host.len() })?;
    }
    checker.finish(start)
}

/// Closes a [`Watch`] when dropped, so that its checking thread ends whatever happens to the read (a panic too).
struct CloseOnDrop<'a>(&'a Watch);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The entries of `index` at positions `which`, in that order; a position past its tensors is an error.
fn entries_at<'a>(index: &'a TensorIndex, which: &[usize]) -> Result<Vec<&'a TensorEntry>> {
    which
        .iter()
        .map(|&i| index.tensors.get(i).ok_or_else(|| Error::InvalidArgument(format!("no tensor at position {i}"))))
        .collect()
}

/// A loaded tensor: its entry's name, type and shape with `data`.
fn tensor_of(t: &TensorEntry, data: TensorData) -> Tensor {
    Tensor { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone(), data }
}

/// A byte range of host memory to fill.
fn host_range(d: &mut TensorData) -> (*mut u8, usize) {
    match d {
        TensorData::Host(b) => (b.as_mut_ptr(), b.len()),
        TensorData::Pinned(b) => (b.as_mut_ptr(), b.len()),
        TensorData::Device(_) => (std::ptr::null_mut(), 0),
    }
}

fn extents_of(entries: &[&TensorEntry]) -> Vec<Extent> {
    entries
        .iter()
        .enumerate()
        .map(|(i, t)| Extent { file: t.file as u32, offset: t.offset, len: t.nbytes, dest: i as u32, dest_offset: 0 })
        .collect()
}

/// An index of raw byte ranges of `paths` (each a 1-D byte tensor named `""`).
fn ranges_index(files: Vec<weightlift_format::SourceFile>, ranges: &[(usize, u64, u64)]) -> Result<TensorIndex> {
    let mut tensors = Vec::with_capacity(ranges.len());
    for &(file, offset, len) in ranges {
        let f = files
            .get(file)
            .ok_or_else(|| Error::InvalidArgument(format!("range names file {file} of {}", files.len())))?;
        if offset.checked_add(len).is_none_or(|end| end > f.len) {
            return Err(Error::Io(weightlift_io::IoError::PastEnd {
                path: f.path.clone(),
                offset,
                len,
                file_len: f.len,
            }));
        }
        tensors.push(TensorEntry {
            name: String::new(),
            dtype: DType::U8,
            shape: vec![len],
            file,
            offset,
            nbytes: len,
        });
    }
    Ok(TensorIndex { files, tensors })
}

/// Allocates one device buffer per length, in order, on a stream of its own, publishing them to `targets` in
/// growing batches (each followed by an event the lanes' streams wait for). The lanes are already reading.
pub(crate) fn allocate_published(
    gpu: &Gpu,
    lens: &[u64],
    targets: &Targets,
    lanes: usize,
    external: Option<&dyn weightlift_cuda::DeviceAllocator>,
    out: &mut Vec<DeviceBuffer>,
) -> Result<()> {
    let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
    gpu.bind()?;
    let stream = gpu.stream(lanes)?;
    tracing::debug!("allocation stream ready");
    let mut batch: Vec<(u32, u64, u64)> = Vec::new();
    let (mut batch_bytes, mut limit) = (0u64, 1u64);
    let publish = |batch: &mut Vec<(u32, u64, u64)>| -> Result<()> {
        if let Some(a) = external {
            // The allocator's memory is free to write after what its stream has queued (a block freed by its
            // last reader there): the lanes wait for that through the published event.
            // SAFETY: the allocator promises its stream lives in this context.
            unsafe { weightlift_cuda::wait_for_stream(gpu, &stream, a.ready_stream()) }?;
        }
        let event = stream.record_event(None).map_err(|error| weightlift_cuda::CudaError::Driver {
            device: gpu.ordinal(),
            call: "cuEventRecord",
            error,
        })?;
        tracing::debug!(blocks = batch.len(), first = batch.first().map(|b| b.0), "published");
        // SAFETY: every published range is a buffer of `out`, which the caller keeps alive and unused by anything
        // else until the read using `targets` has returned.
        unsafe { targets.publish(batch, Some(event)) };
        batch.clear();
        Ok(())
    };
    for (i, &len) in lens.iter().enumerate() {
        let b = match external {
            Some(a) if len > 0 => a.alloc(gpu, len as usize)?,
            _ => DeviceBuffer::alloc(gpu, len as usize, &stream)?,
        };
        batch.push((i as u32, b.device_ptr(), len));
        out.push(b);
        batch_bytes += len;
        if batch_bytes >= limit {
            publish(&mut batch)?;
            batch_bytes = 0;
            limit = (limit * 2).clamp(64 << 20, MAX_PUBLISH_BYTES);
        }
    }
    if !batch.is_empty() {
        publish(&mut batch)?;
    }
    Ok(())
}
