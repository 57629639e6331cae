//! Byte-range reads into caller memory: one request type, [`ReadRequest`], says where the bytes come from
//! ([`Sources`]), which ranges ([`ByteRange`]) and where they go ([`Dests`]); [`Engine::read`] runs it through one
//! plan, and [`Engine::read_at`] is `pread` over it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use weightlift_cuda::{DeviceBuffer, Targets};
use weightlift_format::SourceFile;
use weightlift_io::{Extent, HostSink, LoadRequest, OpenFile};

use super::{Engine, io_opts, settle_copies};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::path::{DeviceRead, LoadOpts};
use crate::report::{NetworkStats, Report};
use crate::tensor::RawDest;

/// `len` bytes of source `file` at `offset`, written to destination `dest` at `dest_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    /// The source's position in [`ReadRequest::sources`].
    pub file: usize,
    /// The first byte's position in the source.
    pub offset: u64,
    /// How many bytes.
    pub len: u64,
    /// The destination's position in [`ReadRequest::dests`].
    pub dest: u32,
    /// Where the first byte lands in the destination.
    pub dest_offset: u64,
}

impl ByteRange {
    /// `len` bytes of `file` at `offset` into the first destination, at `dest_offset`.
    pub fn new(file: usize, offset: u64, len: u64, dest_offset: u64) -> ByteRange {
        ByteRange { file, offset, len, dest: 0, dest_offset }
    }

    /// The same range, into destination `dest`.
    pub fn into_dest(self, dest: u32) -> ByteRange {
        ByteRange { dest, ..self }
    }
}

/// Where a read's bytes come from.
#[derive(Debug, Clone, Copy)]
pub enum Sources<'a> {
    /// Paths or URLs, opened now (an object by one GET that brings its first bytes too).
    Paths(&'a [PathBuf]),
    /// Files as a parsed index describes them: an object's ranges are read from the version the index was parsed
    /// from, or not at all, and from its valid local copy where there is one (`remote_cache_dir`). Ranges covering
    /// the whole of an object (at least 15/16 of its bytes past the header) write its local copy, published once
    /// the read has succeeded.
    Described(&'a [SourceFile]),
    /// Files this engine has open already.
    Open(&'a [Arc<OpenFile>]),
}

/// Where a read's bytes go.
#[derive(Debug, Clone, Copy)]
pub enum Dests<'a> {
    /// Caller memory `(memory, capacity)`: all of it host memory, or all of it memory of one CUDA device.
    Memory(&'a [(RawDest, u64)]),
    /// Device memory of `ordinal` published into `targets` while the read runs (by another thread): each range
    /// waits only for its own destination, and the read fails if `targets` fails. `lens` are the destinations'
    /// lengths.
    Targets {
        /// The CUDA device the destinations live on.
        ordinal: u32,
        /// The destinations, published as they are allocated.
        targets: &'a Arc<Targets>,
        /// Each destination's length in bytes.
        lens: &'a [u64],
    },
}

/// One read: byte ranges of some sources into some destinations, through one plan (host memory: the lanes;
/// device memory: the device's data path). For paged or scattered reads (KV caches, expert weights, row segments
/// of a tensor), a distributed load's steps, and IOPS measurements.
#[derive(Debug, Clone, Copy)]
pub struct ReadRequest<'a> {
    /// Where the bytes come from.
    pub sources: Sources<'a>,
    /// Which bytes, and where each range lands.
    pub ranges: &'a [ByteRange],
    /// Where the bytes go.
    pub dests: Dests<'a>,
    /// Cancellation, progress and injected faults (checksums are checked by tensor loads, not by raw reads).
    pub opts: LoadOpts<'a>,
}

impl<'a> ReadRequest<'a> {
    /// `ranges` of `sources` into `dests`, with default options.
    pub fn new(sources: Sources<'a>, ranges: &'a [ByteRange], dests: Dests<'a>) -> ReadRequest<'a> {
        ReadRequest { sources, ranges, dests, opts: LoadOpts::default() }
    }

    /// The same read with options `opts`.
    pub fn with_opts(self, opts: LoadOpts<'a>) -> ReadRequest<'a> {
        ReadRequest { opts, ..self }
    }
}

impl Engine {
    /// The length of `path` (for a URL, its object's length now, from one ranged GET).
    pub fn len_of(&self, path: &Path) -> Result<u64> {
        Ok(self.open(path)?.len)
    }

    /// Runs `req`: every range is checked to name a source and a destination, to lie inside its source and to
    /// fit its destination before anything is read.
    ///
    /// # Safety
    /// Each destination (for [`Dests::Targets`], each one published) must be valid for writes of its capacity
    /// (device memory of the named device for `RawDest::Device`), the destinations must not overlap, and nothing
    /// else may access them until this returns.
    pub unsafe fn read(&self, req: &ReadRequest<'_>) -> Result<Report> {
        match req.sources {
            Sources::Open(files) => {
                // SAFETY: the same contract.
                unsafe { self.read_open(files, req) }
            }
            Sources::Paths(paths) => {
                let files: Vec<Arc<OpenFile>> = paths.iter().map(|p| self.open(p)).collect::<Result<_>>()?;
                // SAFETY: the same contract.
                unsafe { self.read_open(&files, req) }
            }
            Sources::Described(described) => {
                let open = self.open_files_writing(described, &whole_files_of_ranges(described, req.ranges))?;
                let before = NetworkStats::before(&open);
                // SAFETY: the same contract.
                let read = unsafe { self.read_open(&open, req) };
                let mut report = settle_copies(&open, read)?;
                report.network = NetworkStats::of(&open, &before, Some(&report.io));
                Ok(report)
            }
        }
    }

    /// Reads up to `len` bytes of `path` at `offset` into caller memory, like `pread`: returns the bytes read,
    /// fewer at the end of the file (none past it).
    ///
    /// # Safety
    /// `dest` must be valid for writes of `len` bytes (device memory of the named device for `Device`) and not be
    /// accessed by anything else until this returns.
    pub unsafe fn read_at(
        &self,
        path: &Path,
        offset: u64,
        len: u64,
        dest: RawDest,
        opts: &LoadOpts<'_>,
    ) -> Result<(u64, Report)> {
        let file = self.open(path)?;
        let n = len.min(file.len.saturating_sub(offset));
        let files = [file];
        let ranges = [ByteRange::new(0, offset, n, 0)];
        let dests = [(dest, n)];
        let req = ReadRequest::new(Sources::Open(&files), &ranges, Dests::Memory(&dests)).with_opts(*opts);
        // SAFETY: per this function's contract, `dest` holds `len >= n` writable bytes.
        let mut report = unsafe { self.read(&req) }?;
        report.files = vec![path.to_path_buf()];
        Ok((n, report))
    }

    /// Reads `ranges` of `sources` into a device buffer (destination 0).
    pub fn read_into_buffer(
        &self,
        sources: Sources<'_>,
        ranges: &[ByteRange],
        dest: &mut DeviceBuffer,
    ) -> Result<Report> {
        let raw = [(RawDest::Device { ordinal: dest.gpu().ordinal(), ptr: dest.device_ptr() }, dest.len() as u64)];
        // SAFETY: `dest` is borrowed mutably for the whole call: allocated on its device, used by nothing else.
        unsafe { self.read(&ReadRequest::new(sources, ranges, Dests::Memory(&raw))) }
    }

    /// [`Engine::read`] on files already open.
    ///
    /// # Safety
    /// As for [`Engine::read`].
    unsafe fn read_open(&self, files: &[Arc<OpenFile>], req: &ReadRequest<'_>) -> Result<Report> {
        let opts = &req.opts;
        if opts.checks.is_some() {
            return Err(Error::InvalidArgument("checksums are checked by tensor loads, not by raw reads".into()));
        }
        let start = Instant::now();
        let before = NetworkStats::before(files);
        let paths: Vec<PathBuf> = files.iter().map(|f| f.path.clone()).collect();
        let caps: Vec<u64> = match req.dests {
            Dests::Memory(dests) => dests.iter().map(|d| d.1).collect(),
            Dests::Targets { lens, .. } => lens.to_vec(),
        };
        let extents = extents_of_ranges(files, req.ranges, caps.len())?;
        crate::path::check_extents(&extents, &caps)?;
        let bytes = req.ranges.iter().map(|r| r.len).sum();
        let mut report = match req.dests {
            Dests::Targets { ordinal, targets, .. } => {
                self.read_targets(ordinal, files, &extents, &caps, targets, opts)?
            }
            Dests::Memory(dests) => match dests.first().map(|d| d.0) {
                None | Some(RawDest::Host(_)) => {
                    let mut host = Vec::with_capacity(dests.len());
                    for (d, cap) in dests {
                        let RawDest::Host(ptr) = *d else {
                            return Err(Error::InvalidArgument("destinations mix host and device memory".into()));
                        };
                        host.push((ptr, *cap as usize));
                    }
                    // SAFETY: the caller guarantees each pointer is valid for its capacity and unaliased during
                    // the call.
                    let sink = unsafe { HostSink::new(host) };
                    let load = LoadRequest { files, extents: &extents, dest_lens: &caps };
                    let io = self.io.load(&load, &io_opts(opts), &sink)?;
                    self.report(Device::Cpu, Vec::new(), 0, bytes, io)
                }
                Some(RawDest::Device { ordinal, .. }) => {
                    let mut dev = Vec::with_capacity(dests.len());
                    for (d, cap) in dests {
                        match *d {
                            RawDest::Device { ordinal: o, ptr } if o == ordinal => dev.push((ptr, *cap)),
                            _ => {
                                return Err(Error::InvalidArgument(format!(
                                    "destinations mix cuda:{ordinal} memory with other memory"
                                )));
                            }
                        }
                    }
                    // SAFETY: the caller guarantees each pointer is device memory of `ordinal` valid for its
                    // capacity and unused by anything else until this returns.
                    let targets = unsafe { Targets::fixed(dev) };
                    self.read_targets(ordinal, files, &extents, &caps, &targets, opts)?
                }
            },
        };
        report.tensors = req.ranges.len();
        report.files = paths;
        report.network = NetworkStats::of(files, &before, Some(&report.io));
        report.seconds = start.elapsed().as_secs_f64();
        Ok(report)
    }

    /// The device read of [`Engine::read`].
    fn read_targets(
        &self,
        ordinal: u32,
        files: &[Arc<OpenFile>],
        extents: &[Extent],
        dest_lens: &[u64],
        targets: &Arc<Targets>,
        opts: &LoadOpts<'_>,
    ) -> Result<Report> {
        let gpu = self.gpu(ordinal)?;
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        gpu.bind()?;
        let path = self.gpu_path(ordinal)?;
        path.refuse_objects(files)?;
        let read = DeviceRead { gpu: &gpu, files, extents, dest_lens, targets, opts, observer: None };
        let outcome = path.imp.read(&self.io, &read, &mut || Ok(()))?;
        let bytes = extents.iter().map(|e| e.len).sum();
        Ok(self.device_report(Device::Cuda(ordinal), &gpu, &path, outcome, extents.len(), bytes))
    }
}

/// Per file, whether byte ranges cover at least 15/16 of its bytes past the header: the rule of whole loads
/// (`load::whole_files`) for reads of ranges, where a local copy's completion fetches little.
fn whole_files_of_ranges(files: &[SourceFile], ranges: &[ByteRange]) -> Vec<bool> {
    let mut spans: Vec<Vec<(u64, u64)>> = vec![Vec::new(); files.len()];
    for r in ranges {
        if let Some(s) = spans.get_mut(r.file) {
            s.push((r.offset, r.offset.saturating_add(r.len)));
        }
    }
    files
        .iter()
        .zip(&mut spans)
        .map(|(f, spans)| {
            spans.sort_unstable();
            let (mut covered, mut at) = (0u64, f.data_start);
            for &(start, end) in spans.iter() {
                let (start, end) = (start.max(at), end.min(f.len));
                if end > start {
                    covered += end - start;
                    at = end;
                }
            }
            u128::from(covered) * 16 >= u128::from(f.len.saturating_sub(f.data_start)) * 15
        })
        .collect()
}

/// The extents of `ranges` of `files` into `dests` destinations (empty ranges dropped), each checked to name a
/// file and a destination and to lie inside its file.
fn extents_of_ranges(files: &[Arc<OpenFile>], ranges: &[ByteRange], dests: usize) -> Result<Vec<Extent>> {
    let mut extents = Vec::with_capacity(ranges.len());
    for &ByteRange { file, offset, len, dest, dest_offset } in ranges {
        let f = files.get(file).ok_or_else(|| {
            Error::InvalidArgument(format!("range ({file}, {offset}, {len}) names file {file} of {}", files.len()))
        })?;
        if len > 0 && offset.checked_add(len).is_none_or(|end| end > f.len) {
            return Err(weightlift_io::IoError::PastEnd { path: f.path.clone(), offset, len, file_len: f.len }.into());
        }
        if dest as usize >= dests {
            return Err(Error::InvalidArgument(format!(
                "range ({file}, {offset}, {len}) names destination {dest} of {dests}"
            )));
        }
        if len > 0 {
            extents.push(Extent { file: file as u32, offset, len, dest, dest_offset });
        }
    }
    Ok(extents)
}
