//! The load pipeline: a checkpoint's index → destinations → the storage engine → tensors, with a report.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Instant;

use weightlift_cuda::{CudaPinner, DeviceBuffer, DeviceSink, Gpu, PinnedBuffer};
use weightlift_format::{DType, TensorEntry, TensorIndex};
use weightlift_io::fault::FaultPlan;
use weightlift_io::{Extent, HostBuffer, HostSink, IoConfig, IoError, LoadOptions, LoadRequest, OpenFile, StagingPool};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::placement;
use crate::report::Report;

/// The engine's settings.
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub io: IoConfig,
}

impl Config {
    /// Defaults overridden by `WEIGHTLIFT_*` environment variables.
    pub fn from_env() -> Result<Config> {
        Ok(Config { io: IoConfig::from_env()? })
    }
}

/// Per-call options of a load.
#[derive(Debug, Default)]
pub struct LoadOpts<'a> {
    /// Incremented with every byte read (for progress bars).
    pub progress: Option<&'a AtomicU64>,
    /// Set to abandon the load.
    pub cancel: Option<&'a AtomicBool>,
    /// Injected faults (tests).
    pub faults: Option<&'a FaultPlan>,
}

/// A tensor's bytes inside a device allocation that neighbouring small tensors may share (see `placement`); the
/// allocation is freed when its last tensor is dropped.
#[derive(Debug, Clone)]
pub struct DeviceTensor {
    pub block: Arc<DeviceBuffer>,
    pub offset: u64,
    pub len: u64,
}

impl DeviceTensor {
    /// The tensor's device address.
    pub fn device_ptr(&self) -> weightlift_cuda::CUdeviceptr {
        self.block.device_ptr() + self.offset
    }
}

/// A loaded tensor's bytes.
#[derive(Debug)]
pub enum TensorData {
    Host(HostBuffer),
    Pinned(PinnedBuffer),
    Device(DeviceTensor),
}

impl TensorData {
    pub fn len(&self) -> usize {
        match self {
            TensorData::Host(b) => b.len(),
            TensorData::Pinned(b) => b.len(),
            TensorData::Device(d) => d.len as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `out.len()` bytes starting at `offset` into `out` (from device memory where the tensor lives there).
    pub fn read_back(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let host: &[u8] = match self {
            TensorData::Host(b) => b,
            TensorData::Pinned(b) => b,
            TensorData::Device(d) => {
                if offset + out.len() as u64 > d.len {
                    return Err(Error::InvalidArgument("read past tensor".into()));
                }
                return Ok(d.block.read_back((d.offset + offset) as usize, out)?);
            }
        };
        let start = offset as usize;
        let src =
            host.get(start..start + out.len()).ok_or_else(|| Error::InvalidArgument("read past tensor".into()))?;
        out.copy_from_slice(src);
        Ok(())
    }
}

/// One loaded tensor.
#[derive(Debug)]
pub struct Tensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub data: TensorData,
}

/// The tensors of a load (in index order) and what the load did.
#[derive(Debug)]
pub struct Loaded {
    pub tensors: Vec<Tensor>,
    pub report: Report,
}

/// Loads checkpoints. Keeps its staging memory between loads so that repeated loads do not pay for it again.
#[derive(Debug)]
pub struct Engine {
    config: Config,
    pool: StagingPool,
    gpus: HashMap<u32, Gpu>,
}

/// Lanes a device sink is prepared for: io_uring uses `threads` lanes, the pread fallback up to 64.
const MAX_LANES: usize = 64;

impl Engine {
    pub fn new(config: Config) -> Result<Engine> {
        config.io.validate()?;
        Ok(Engine { config, pool: StagingPool::new(), gpus: HashMap::new() })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Device `n`, opened on first use (its primary context, shared with PyTorch and the CUDA runtime).
    pub fn gpu(&mut self, n: u32) -> Result<Gpu> {
        if let Some(g) = self.gpus.get(&n) {
            return Ok(g.clone());
        }
        let g = Gpu::open(n)?;
        self.gpus.insert(n, g.clone());
        Ok(g)
    }

    /// Whether GPU loads go through cuFile, and why (or why not).
    fn gpu_path(&self) -> Result<(Option<weightlift_cuda::cufile::Cufile>, String)> {
        use weightlift_io::Backend;
        Ok(match self.config.io.backend.value {
            Backend::Gds => match weightlift_cuda::cufile::driver() {
                Ok(c) => (Some(c), "cuFile requested".into()),
                Err(e) => {
                    return Err(Error::Cuda(format!("cuFile was requested (backend gds) but is unavailable: {e}")));
                }
            },
            Backend::Auto => match weightlift_cuda::cufile::driver() {
                Ok(c) if c.is_peer_to_peer() => (Some(c), "cuFile runs peer-to-peer here".into()),
                Ok(c) => (
                    None,
                    format!(
                        "GPU path: the io_uring pipeline, since cuFile runs in compat mode here ({:?}), through host bounce buffers the pipeline outruns",
                        c.mode
                    ),
                ),
                Err(e) => (None, format!("GPU path: the io_uring pipeline (no cuFile: {e})")),
            },
            _ => (None, "GPU path: the io_uring pipeline (set by WEIGHTLIFT_IO)".into()),
        })
    }

    /// Frees the cached staging memory (it is kept between loads otherwise).
    pub fn release_staging(&mut self) {
        self.pool.release();
    }

    /// Loads every tensor of `index` onto `device`.
    pub fn load(&mut self, index: &TensorIndex, device: Device, opts: &LoadOpts<'_>) -> Result<Loaded> {
        let all: Vec<usize> = (0..index.tensors.len()).collect();
        self.load_some(index, &all, device, opts)
    }

    /// Loads the tensors of `index` at positions `which` (in that order).
    pub fn load_some(
        &mut self,
        index: &TensorIndex,
        which: &[usize],
        device: Device,
        opts: &LoadOpts<'_>,
    ) -> Result<Loaded> {
        let start = Instant::now();
        let entries: Vec<&TensorEntry> = which
            .iter()
            .map(|&i| index.tensors.get(i).ok_or_else(|| Error::InvalidArgument(format!("no tensor at position {i}"))))
            .collect::<Result<_>>()?;
        let files = open_checked(index, &self.config.io)?;
        let extents: Vec<Extent> = entries
            .iter()
            .enumerate()
            .map(|(i, t)| Extent {
                file: t.file as u32,
                offset: t.offset,
                len: t.nbytes,
                dest: i as u32,
                dest_offset: 0,
            })
            .collect();
        let dest_lens: Vec<u64> = entries.iter().map(|t| t.nbytes).collect();
        let t_alloc = Instant::now();
        let mut copy_span = None;
        let mut gpu_info = None;
        let mut nvme = None;
        let (datas, io, alloc_secs) = match device {
            Device::Cpu => {
                let mut bufs = dest_lens
                    .iter()
                    .map(|&n| {
                        HostBuffer::new(n as usize).map_err(|_| Error::OutOfMemory {
                            what: "host",
                            bytes: n,
                            detail: String::new(),
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let alloc_secs = t_alloc.elapsed().as_secs_f64();
                let io = self.run(&files, &extents, &dest_lens, &HostSink::new(&mut bufs), opts, None)?;
                (bufs.into_iter().map(TensorData::Host).collect::<Vec<_>>(), io, alloc_secs)
            }
            Device::PinnedCpu => {
                let gpu = self.gpu(0)?;
                let mut bufs =
                    dest_lens.iter().map(|&n| PinnedBuffer::alloc(&gpu, n as usize)).collect::<Result<Vec<_>, _>>()?;
                let alloc_secs = t_alloc.elapsed().as_secs_f64();
                let io = self.run(&files, &extents, &dest_lens, &HostSink::new(&mut bufs), opts, None)?;
                (bufs.into_iter().map(TensorData::Pinned).collect(), io, alloc_secs)
            }
            Device::Cuda(n) => {
                let gpu = self.gpu(n)?;
                gpu_info = Some(gpu.info().clone());
                gpu.bind()?;
                let placement = placement::pack(&entries);
                let alloc_stream = gpu.stream(0)?;
                let blocks = placement
                    .blocks
                    .iter()
                    .map(|b| DeviceBuffer::alloc(&gpu, b.len as usize, &alloc_stream))
                    .collect::<Result<Vec<_>, _>>();
                let blocks = match blocks {
                    Ok(b) => b,
                    Err(e) => {
                        // The blocks allocated so far are freed (in stream order) as they drop.
                        let _ = alloc_stream.synchronize();
                        return Err(e.into());
                    }
                };
                let ready = alloc_stream.record_event(None).map_err(|e| Error::Cuda(format!("cuEventRecord: {e}")))?;
                let alloc_secs = t_alloc.elapsed().as_secs_f64();
                let block_extents: Vec<Extent> = placement
                    .blocks
                    .iter()
                    .enumerate()
                    .map(|(i, b)| Extent {
                        file: b.file as u32,
                        offset: b.start,
                        len: b.len,
                        dest: i as u32,
                        dest_offset: 0,
                    })
                    .collect();
                let block_lens: Vec<u64> = placement.blocks.iter().map(|b| b.len).collect();
                let dests: Vec<(u64, u64)> = blocks.iter().map(|b| (b.device_ptr(), b.len() as u64)).collect();
                let (cufile, path_reason) = self.gpu_path()?;
                let mut blocks = blocks;
                let io = if self.config.io.backend.value == weightlift_io::Backend::NvmeSim {
                    ready.synchronize().map_err(|e| Error::Cuda(format!("cuEventSynchronize: {e}")))?;
                    let paths: Vec<PathBuf> = index.files.iter().map(|f| f.path.clone()).collect();
                    let threads = self.config.io.threads.value as usize;
                    let (io, stats) =
                        crate::nvme_sim::load_blocks(&gpu, &paths, &placement.blocks, &mut blocks, threads)?;
                    nvme = Some(stats);
                    io
                } else {
                    match cufile {
                        Some(cf) => {
                            ready.synchronize().map_err(|e| Error::Cuda(format!("cuEventSynchronize: {e}")))?;
                            let paths: Vec<PathBuf> = index.files.iter().map(|f| f.path.clone()).collect();
                            let threads = self.config.io.threads.value as usize;
                            crate::gds::load_blocks(
                                &cf,
                                &gpu,
                                &paths,
                                &placement.blocks,
                                &dests,
                                threads,
                                opts.progress,
                            )?
                        }
                        None => {
                            // SAFETY: `blocks` owns every destination and outlives the load below; nothing else uses them.
                            let sink = unsafe {
                                DeviceSink::new(
                                    &gpu,
                                    dests,
                                    MAX_LANES.max(self.config.io.threads.value as usize),
                                    Some(ready),
                                )
                            };
                            let pinner = CudaPinner::new(&gpu);
                            let mut io = self.run(&files, &block_extents, &block_lens, &sink, opts, Some(&pinner))?;
                            copy_span = Some(sink.copy_span_secs());
                            io.backend_reason = format!("{}; {path_reason}", io.backend_reason);
                            io
                        }
                    }
                };
                let blocks: Vec<Arc<DeviceBuffer>> = blocks.into_iter().map(Arc::new).collect();
                let datas = placement
                    .tensors
                    .iter()
                    .zip(&dest_lens)
                    .map(|(&(b, offset), &len)| {
                        TensorData::Device(DeviceTensor { block: blocks[b].clone(), offset, len })
                    })
                    .collect();
                (datas, io, alloc_secs)
            }
        };
        let tensors: Vec<Tensor> = entries
            .iter()
            .zip(datas)
            .map(|(t, data)| Tensor { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone(), data })
            .collect();
        let seconds = start.elapsed().as_secs_f64();
        let files_list: Vec<PathBuf> = index.files.iter().map(|f| f.path.clone()).collect();
        let mut report = Report::new(device, &files_list, &tensors, seconds, alloc_secs, io);
        report.copy_span_secs = copy_span;
        report.gpu = gpu_info;
        report.nvme = nvme;
        Ok(Loaded { tensors, report })
    }

    fn run<S: weightlift_io::Sink>(
        &mut self,
        files: &[OpenFile],
        extents: &[Extent],
        dest_lens: &[u64],
        sink: &S,
        opts: &LoadOpts<'_>,
        pinner: Option<&dyn weightlift_io::Pinner>,
    ) -> Result<weightlift_io::IoReport> {
        let req = LoadRequest { files, extents, dest_lens };
        let io_opts = LoadOptions { progress: opts.progress, cancel: opts.cancel, faults: opts.faults, pinner };
        Ok(weightlift_io::load(&self.config.io, &req, &io_opts, &mut self.pool, sink)?)
    }
}

/// Opens the index's files, refusing any whose length changed since the index was read.
fn open_checked(index: &TensorIndex, io: &IoConfig) -> Result<Vec<OpenFile>> {
    let want_direct = io.direct.value != weightlift_io::DirectMode::Never;
    let mut files = Vec::with_capacity(index.files.len());
    for f in &index.files {
        let file = OpenFile::open(&f.path, want_direct)?;
        if file.len != f.len {
            return Err(Error::Io(IoError::PastEnd {
                path: f.path.clone(),
                offset: 0,
                len: f.len,
                file_len: file.len,
            }));
        }
        files.push(file);
    }
    Ok(files)
}

/// A caller-owned destination for [`Engine::read_into`].
#[derive(Clone, Copy, Debug)]
pub enum RawDest {
    /// Host memory (pageable or pinned).
    Host(*mut u8),
    /// Memory of CUDA device `ordinal`.
    Device { ordinal: u32, ptr: weightlift_cuda::CUdeviceptr },
}

/// A caller-owned source for [`Engine::write_from`].
#[derive(Clone, Copy, Debug)]
pub enum RawSrc {
    Host(*const u8),
    Device { ordinal: u32, ptr: weightlift_cuda::CUdeviceptr },
}

impl Engine {
    /// Loads byte ranges `(file, offset, len)` of `paths` as 1-D byte tensors (named `""`), in the order given,
    /// through one plan: the front ends compute ranges from headers (tensors, slices of tensors, raw files).
    pub fn load_ranges(
        &mut self,
        paths: &[PathBuf],
        ranges: &[(usize, u64, u64)],
        device: Device,
        opts: &LoadOpts<'_>,
    ) -> Result<Loaded> {
        let mut files = Vec::with_capacity(paths.len());
        for p in paths {
            let len = std::fs::metadata(p).map_err(|cause| Error::Io(IoError::Open { path: p.clone(), cause }))?.len();
            files.push(weightlift_format::SourceFile {
                path: p.clone(),
                format: weightlift_format::Format::Raw,
                len,
                data_start: 0,
                metadata: weightlift_format::Metadata::None,
                gguf_version: None,
            });
        }
        let mut tensors = Vec::with_capacity(ranges.len());
        for &(file, offset, len) in ranges {
            let f = files
                .get(file)
                .ok_or_else(|| Error::InvalidArgument(format!("range names file {file} of {}", paths.len())))?;
            if offset.checked_add(len).is_none_or(|end| end > f.len) {
                return Err(Error::Io(IoError::PastEnd { path: f.path.clone(), offset, len, file_len: f.len }));
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
        let index = TensorIndex { files, tensors };
        self.load(&index, device, opts)
    }

    /// Reads up to `len` bytes of `path` at `offset` into caller memory, like `pread`: returns the bytes read, fewer
    /// at the end of the file (none past it).
    ///
    /// # Safety
    /// `dest` must be valid for writes of `len` bytes (device memory of the named device for `Device`) and not be
    /// accessed by anything else until this returns.
    pub unsafe fn read_into(&mut self, path: &Path, offset: u64, len: u64, dest: RawDest) -> Result<(u64, Report)> {
        let start = Instant::now();
        let file = OpenFile::open(path, self.config.io.direct.value != weightlift_io::DirectMode::Never)?;
        let n = len.min(file.len.saturating_sub(offset));
        if n == 0 {
            let report = Report::new(
                Device::Cpu,
                &[path.to_path_buf()],
                &[],
                start.elapsed().as_secs_f64(),
                0.0,
                Default::default(),
            );
            return Ok((0, report));
        }
        let files = [file];
        let extents = [Extent { file: 0, offset, len: n, dest: 0, dest_offset: 0 }];
        let lens = [n];
        let opts = LoadOpts::default();
        let mut gpu_info = None;
        let io = match dest {
            RawDest::Host(ptr) => {
                // SAFETY: the caller guarantees `ptr` is valid for `len >= n` bytes and unaliased during the call.
                let slice = unsafe { std::slice::from_raw_parts_mut(ptr, n as usize) };
                let mut dests = [slice];
                self.run(&files, &extents, &lens, &HostSink::new(&mut dests), &opts, None)?
            }
            RawDest::Device { ordinal, ptr } => {
                let gpu = self.gpu(ordinal)?;
                gpu_info = Some(gpu.info().clone());
                // SAFETY: the caller guarantees `ptr` is device memory of `ordinal`, valid for `n` bytes and unused
                // by anything else until the load (which synchronises its copies) returns.
                let sink = unsafe {
                    DeviceSink::new(&gpu, vec![(ptr, n)], MAX_LANES.max(self.config.io.threads.value as usize), None)
                };
                let pinner = CudaPinner::new(&gpu);
                self.run(&files, &extents, &lens, &sink, &opts, Some(&pinner))?
            }
        };
        let device = match dest {
            RawDest::Host(_) => Device::Cpu,
            RawDest::Device { ordinal, .. } => Device::Cuda(ordinal),
        };
        let mut report = Report::new(device, &[path.to_path_buf()], &[], start.elapsed().as_secs_f64(), 0.0, io);
        report.bytes = n;
        report.tensors = 1;
        report.gpu = gpu_info;
        Ok((n, report))
    }

    /// Writes a loaded tensor's bytes into `path` at `offset` (durably when asked); returns the bytes written.
    pub fn write_tensor(&mut self, path: &Path, offset: u64, data: &TensorData, durable: bool) -> Result<u64> {
        let src = match data {
            TensorData::Host(b) => RawSrc::Host(b.as_ptr()),
            TensorData::Pinned(b) => RawSrc::Host(b.as_ptr()),
            TensorData::Device(d) => RawSrc::Device { ordinal: d.block.gpu().ordinal(), ptr: d.device_ptr() },
        };
        // SAFETY: `data` is borrowed for the whole call: its memory stays allocated and unmodified meanwhile.
        unsafe { self.write_from(path, offset, data.len() as u64, src, durable) }
    }

    /// Writes `len` bytes of caller memory into `path` at `offset` (creating the file if needed, never truncating
    /// it), then `fsync`s it when `durable`. Returns the bytes written.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes (device memory of the named device for `Device`) and not be
    /// written by anything else until this returns.
    pub unsafe fn write_from(&mut self, path: &Path, offset: u64, len: u64, src: RawSrc, durable: bool) -> Result<u64> {
        use weightlift_io::write::{HostSource, WriteRequest, WriteSource, write_at};
        let req = WriteRequest { path, offset, len, durable };
        let report = match src {
            RawSrc::Host(ptr) => {
                // SAFETY: the caller guarantees `ptr` is valid for reads of `len` bytes during the call.
                let data = unsafe { std::slice::from_raw_parts(ptr, len as usize) };
                write_at(&self.config.io, &req, &HostSource(data), &mut self.pool, None)?
            }
            RawSrc::Device { ordinal, ptr } => {
                let gpu = self.gpu(ordinal)?;
                /// Device memory copied out chunk by chunk into (pinned) staging slots.
                struct DeviceSource<'a> {
                    gpu: &'a Gpu,
                    ptr: weightlift_cuda::CUdeviceptr,
                }
                impl WriteSource for DeviceSource<'_> {
                    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), weightlift_io::SinkError> {
                        // SAFETY: `write_from`'s caller guarantees the device range is readable; `buf` lies within it.
                        Ok(unsafe { weightlift_cuda::copy_device_to_host(self.gpu, self.ptr + offset, buf) }?)
                    }
                }
                let pinner = CudaPinner::new(&gpu);
                write_at(&self.config.io, &req, &DeviceSource { gpu: &gpu, ptr }, &mut self.pool, Some(&pinner))?
            }
        };
        Ok(report.bytes)
    }
}

impl Engine {
    /// Reads byte ranges `(file, offset, len, dest_offset)` of `paths` into one device buffer, through the
    /// configured GPU path (the io_uring pipeline, or GPU-initiated NVMe with backend `nvme-sim`). For paged or
    /// scattered reads (KV caches, expert weights) and for IOPS measurements.
    pub fn read_ranges_into(
        &mut self,
        paths: &[PathBuf],
        ranges: &[(usize, u64, u64, u64)],
        dest: &mut DeviceBuffer,
    ) -> Result<Report> {
        let start = Instant::now();
        let gpu = dest.gpu().clone();
        gpu.bind()?;
        let cap = dest.len() as u64;
        for &(file, offset, len, dest_offset) in ranges {
            if file >= paths.len() || dest_offset.checked_add(len).is_none_or(|e| e > cap) {
                return Err(Error::InvalidArgument(format!(
                    "range ({file}, {offset}, {len}, {dest_offset}) does not fit {} file(s) and a {cap}-byte buffer",
                    paths.len()
                )));
            }
        }
        let mut nvme = None;
        let io = if self.config.io.backend.value == weightlift_io::Backend::NvmeSim {
            let blocks_by_file: Vec<Vec<(u64, u64, u64)>> = (0..paths.len())
                .map(|f| ranges.iter().filter(|r| r.0 == f).map(|&(_, o, l, d)| (o, l, d)).collect())
                .collect();
            let (io, stats) = crate::nvme_sim::load_ranges(
                &gpu,
                paths,
                &blocks_by_file,
                dest,
                self.config.io.threads.value as usize,
            )?;
            nvme = Some(stats);
            io
        } else {
            let want_direct = self.config.io.direct.value != weightlift_io::DirectMode::Never;
            let files =
                paths.iter().map(|p| OpenFile::open(p, want_direct)).collect::<std::result::Result<Vec<_>, _>>()?;
            let extents: Vec<Extent> = ranges
                .iter()
                .map(|&(file, offset, len, dest_offset)| Extent {
                    file: file as u32,
                    offset,
                    len,
                    dest: 0,
                    dest_offset,
                })
                .collect();
            // SAFETY: `dest` is borrowed mutably for the whole load, so the device range stays allocated and unused
            // by anything else; extents were checked to lie inside it.
            let sink = unsafe {
                DeviceSink::new(
                    &gpu,
                    vec![(dest.device_ptr(), cap)],
                    MAX_LANES.max(self.config.io.threads.value as usize),
                    None,
                )
            };
            let pinner = CudaPinner::new(&gpu);
            self.run(&files, &extents, &[cap], &sink, &LoadOpts::default(), Some(&pinner))?
        };
        let mut report = Report::new(Device::Cuda(gpu.ordinal()), paths, &[], start.elapsed().as_secs_f64(), 0.0, io);
        report.bytes = ranges.iter().map(|r| r.2).sum();
        report.tensors = ranges.len();
        report.nvme = nvme;
        report.gpu = Some(gpu.info().clone());
        Ok(report)
    }
}
