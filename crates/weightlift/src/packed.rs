//! Loading packed checkpoints (`.wlpack`, see [`weightlift_format::wlpack`]).
//!
//! The stored streams of the tensors asked for are cut into batches of whole chunks (contiguous in the pack) and
//! read by a streaming load over those byte ranges, so the reads go through the same lanes, page-cache policy and
//! pinned ring as any load and run ahead of the decoding by at most [`READ_AHEAD_BATCHES`] batches (or
//! `prefetch_bytes`, if smaller). Each batch is then decoded
//! into the destination tensors as soon as it has landed:
//!
//! - on the GPU (device destinations, the GPU decoder available): the stored bytes land in device memory and
//!   weightlift's Huffman kernel (or nvCOMP's batched decoders, for zstd, LZ4 and deflate streams), its plane-merge
//!   kernel and its xxh3 kernels turn them into the tensors' bytes and check every chunk's checksum on the device,
//!   on a stream of their own, while the lanes read the next batches; at most two batches are in flight;
//! - on the CPU (host destinations, or no NVRTC, or no nvCOMP for a pack of its codecs, or asked for): the stored
//!   bytes land in host memory and the chunks of a batch are decoded in parallel (rayon) and checked with xxh3; for
//!   a device destination they are decoded into pinned memory and copied.
//!
//! Every chunk's checksum is checked either way; a mismatch is [`PackError::Checksum`] naming the tensor and the
//! chunk. The report says which decoder ran and why.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use weightlift_cuda::unpack::{BatchError, ChunkJob, GpuCodec, GpuUnpacker, PendingBatch, StreamSrc, UnpackError};
use weightlift_cuda::{DeviceBuffer, Gpu, PinnedBuffer};
use weightlift_format::wlpack::{Codec, Item, ItemKind, PackIndex};
use weightlift_format::{DType, Format, SourceFile, TensorEntry, TensorIndex};
use weightlift_io::HostBuffer;
use weightlift_pack::PackError;

use crate::device::Device;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::keep::KeptBytes;
use crate::path::LoadOpts;
use crate::report::PackStats;
use crate::tensor::{DeviceTensor, Loaded, Tensor, TensorData};

/// Whether `path` is a packed checkpoint (by its first bytes). Opened as a regular file only: a FIFO or a device
/// must not block here (the reader that follows names it).
pub fn is_pack_file(path: &Path) -> bool {
    // An object is not fetched to tell: its name says it (`weightlift pack` writes `.wlpack` files).
    match weightlift_remote::Location::new(path) {
        Ok(location @ weightlift_remote::Location::Object(_)) => return location.extension() == Some("wlpack"),
        Err(_) => return false,
        Ok(weightlift_remote::Location::Local(_)) => {}
    }
    let mut head = [0u8; 8];
    let Ok(mut f) = weightlift_format::regular::open(path, weightlift_format::regular::Access::READ) else {
        return false;
    };
    std::io::Read::read_exact(&mut f, &mut head).is_ok() && weightlift_format::wlpack::is_pack(&head)
}

/// Which decoder a packed load uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Decoder {
    /// The GPU for device destinations where NVRTC loads (and nvCOMP, for a pack with streams of its codecs), the CPU
    /// otherwise.
    #[default]
    Auto,
    /// The GPU; an error where it cannot run (host destination, NVRTC missing, or nvCOMP for its codecs).
    Gpu,
    /// The CPU, whatever the destination.
    Cpu,
}

impl Decoder {
    /// `auto`, `gpu` or `cpu`, as the settings and the fronts spell them.
    pub fn parse(s: &str) -> Result<Decoder> {
        match s {
            "auto" => Ok(Decoder::Auto),
            "gpu" => Ok(Decoder::Gpu),
            "cpu" => Ok(Decoder::Cpu),
            _ => Err(Error::InvalidArgument(format!("decoder must be auto, gpu or cpu, not {s:?}"))),
        }
    }
}

/// Lanes that read a pack decoded on the GPU: three quarters of the engine's, leaving CPUs to the decoder's thread
/// and the copies' completions. Measured on the H100 machine (16 vCPUs, 16 lanes; bench/pack_settings.py, 4 GiB of
/// weight-like bf16, warm): 16 lanes 0.740–0.764 of the pinned copy, 14 lanes 0.761–0.771, 12 lanes 0.833–0.868,
/// 10 lanes 0.829–0.886, where plain loads of the same file moved by less than their run-to-run spread (zstd packs);
/// Huffman packs (bench/results/2026-11-25-h100-d at b3a4ec8): 16 lanes 0.763, 14 lanes 0.944, 12 lanes 0.961. Other CPU counts
/// were not measured. The `pack_read_lanes` setting overrides it.
pub fn gpu_decode_read_lanes(lanes: usize) -> usize {
    (lanes * 3 / 4).max(1)
}

/// A run of whole chunks, contiguous in the pack: `(selected tensor, chunk index in the pack)` each.
struct Batch {
    start: u64,
    end: u64,
    chunks: Vec<(usize, usize)>,
}

/// Stored bytes read ahead of the batches the decoder has taken, in batches. The decoder takes a batch once it has
/// landed, so two more keep the reads going; a wider window only holds more stored bytes. Measured on the H100
/// (bench/results/2026-11-24-h100-za at b3a4ec8, a warm 4 GiB packed load decoded on the GPU): with the 2 GiB of
/// `prefetch_bytes` the stored batches freed during the load (about 3 GB) went back to the system at the caller's
/// next synchronisation, 5.3 ms, and the load reached 0.857 of the pinned-copy ceiling; with 1 GiB 0.913 (2.3 ms),
/// with 512 MiB (two batches) 0.915 (1.5 ms).
pub const READ_AHEAD_BATCHES: u64 = 2;

/// Stored bytes per decode batch by default. Measured on the H100 (bench/pack_settings.py, 4 GiB of weight-like bf16
/// packed with the Huffman codec, warm, fresh processes; bench/results/2026-11-25-h100-c at b3a4ec8 and -d, two machines, one
/// sample each): 128 MiB gave 0.990 and 1.023 of the pinned-copy ceiling against 0.875 and 0.961 with 256 MiB;
/// 64 MiB 0.786, 512 MiB 0.866. Smaller batches fill and drain the pipeline sooner while the Huffman kernel keeps
/// up with them.
pub const BATCH_BYTES: u64 = 128 << 20;

/// Stored bytes per decode batch by default where nvCOMP decodes on the GPU (zstd, LZ4, deflate streams): its
/// batched decoders need thousands of streams per call to fill the GPU (see `plan_batches`); with zstd packs
/// 128 MiB batches gave 0.56–0.64 of the pinned copy against 0.77–0.82 with 256 MiB (bench/results/2026-11-24-h100-r at b3a4ec8,
/// -t).
pub const NVCOMP_BATCH_BYTES: u64 = 256 << 20;

/// Cuts the chunks of `items` into batches in pack order; a batch ends at `batch_bytes` of stored bytes (the
/// `pack_batch_bytes` setting) or where the next chunk does not follow the previous one (a tensor not asked for
/// lies between). Batches should be large enough that nvCOMP's batched decoders have thousands of streams to spread
/// over the GPU and a batch's fixed cost (a take, a descriptor upload, a result read-back) is small against its
/// bytes: on the H100, batches of 64 MiB decoded a 4 GiB bf16 pack at 22 GB/s of raw bytes, where one batch of
/// 512 MiB decodes at 74 GB/s. Two batches are in flight at most.
fn plan_batches(index: &PackIndex, items: &[&Item], batch_bytes: u64) -> Vec<Batch> {
    let mut order: Vec<(u64, usize, usize)> = Vec::new();
    for (t, item) in items.iter().enumerate() {
        for c in item.chunks.clone() {
            let streams = index.chunk_streams(c, item.planes);
            if let Some(first) = streams.first() {
                order.push((first.offset, t, c));
            }
        }
    }
    order.sort_unstable();
    let mut batches: Vec<Batch> = Vec::new();
    for (_, t, c) in order {
        let streams = index.chunk_streams(c, items[t].planes);
        let (start, end) = (streams[0].offset, streams[streams.len() - 1].end());
        match batches.last_mut() {
            // Streams start at multiples of 16: a chunk follows its predecessor when only padding lies between.
            Some(b) if start >= b.end && start - b.end < 16 && end - b.start <= batch_bytes => {
                b.end = end;
                b.chunks.push((t, c));
            }
            _ => batches.push(Batch { start, end, chunks: vec![(t, c)] }),
        }
    }
    batches
}

/// The batches as a raw "checkpoint" of byte tensors over the pack, for a streaming load.
fn batch_index(path: &Path, index: &PackIndex, batches: &[Batch]) -> TensorIndex {
    TensorIndex {
        files: vec![SourceFile {
            path: path.to_path_buf(),
            format: Format::Raw,
            len: index.len,
            data_start: index.data_start,
            metadata: weightlift_format::Metadata::None,
            gguf_version: None,
            etag: index.etag.clone(),
            header: None,
            object: index.object.clone(),
        }],
        tensors: batches
            .iter()
            .enumerate()
            .map(|(i, b)| TensorEntry {
                name: format!("batch {i}"),
                dtype: DType::U8,
                shape: vec![b.end - b.start],
                file: 0,
                offset: b.start,
                nbytes: b.end - b.start,
            })
            .collect(),
    }
}

fn gpu_codec(c: Codec) -> Option<GpuCodec> {
    use weightlift_cuda::nvcomp::NvCodec;
    match c {
        Codec::Raw => None,
        Codec::Huffman => Some(GpuCodec::Huffman),
        Codec::Zstd => Some(GpuCodec::Nvcomp(NvCodec::Zstd)),
        Codec::Lz4 => Some(GpuCodec::Nvcomp(NvCodec::Lz4)),
        Codec::Deflate => Some(GpuCodec::Nvcomp(NvCodec::Deflate)),
    }
}

/// A destination range that decoding threads write (disjoint per chunk).
#[derive(Clone, Copy)]
struct Out(*mut u8);
// SAFETY: each chunk writes only its own disjoint range of a destination the load owns until it returns.
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}

/// A packed checkpoint opened once: its path and parsed index, for loads that should not parse the index again
/// (a 4 GiB pack's index of 32,768 chunks takes about 5 ms to read and check). The file is not held open: loads
/// open it, and a pack changed since it was opened fails their chunk checksums.
#[derive(Debug)]
pub struct Pack {
    path: std::path::PathBuf,
    index: PackIndex,
}

impl Pack {
    /// Reads and checks the index of the pack at `path`.
    pub fn open(path: &Path) -> Result<Pack> {
        Ok(Pack { path: path.to_path_buf(), index: weightlift_format::wlpack::read(path)? })
    }

    /// The pack file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pack's parsed and checked index: tensors, chunks, streams.
    pub fn index(&self) -> &PackIndex {
        &self.index
    }

    /// What the pack was packed from (`safetensors`, `safetensors-sharded` or `gguf`).
    pub fn source(&self) -> &str {
        &self.index.source
    }

    /// The pack's tensors as a tensor index over the pack file, for the fronts that list, look up and select
    /// tensors by index: names, dtypes, shapes and sizes, with the offsets of the original files (a pack stores
    /// its tensors encoded, so its tensors are loaded by decoding them, never read at those offsets). The
    /// original's metadata (safetensors `__metadata__`) comes along.
    pub fn tensor_index(&self) -> TensorIndex {
        let p = &self.index;
        let tensors = p
            .tensors()
            .filter_map(|item| match &item.kind {
                ItemKind::Tensor { name, dtype, shape } => Some(TensorEntry {
                    name: name.clone(),
                    dtype: *dtype,
                    shape: shape.clone(),
                    file: 0,
                    offset: item.offset,
                    nbytes: item.nbytes,
                }),
                ItemKind::Gap => None,
            })
            .collect();
        let metadata = if p.metadata.is_empty() {
            weightlift_format::Metadata::None
        } else {
            weightlift_format::Metadata::Safetensors(p.metadata.clone())
        };
        let file = SourceFile {
            path: self.path.clone(),
            format: Format::Raw,
            len: p.len,
            data_start: p.data_start,
            metadata,
            gguf_version: None,
            etag: None,
            header: None,
            object: None,
        };
        TensorIndex { files: vec![file], tensors }
    }
}

impl Engine {
    /// Loads the tensors at positions `which` (in the pack's tensor order; `None`: all of them, in that order) of
    /// the packed checkpoint at `path` onto `device`, decoding with `decoder`. `opts.progress` counts raw bytes as
    /// batches are decoded; `opts.cancel` abandons the load between batches (and while one is awaited).
    pub fn load_pack(
        &self,
        path: &Path,
        which: Option<&[usize]>,
        device: Device,
        decoder: Decoder,
        opts: &LoadOpts<'_>,
    ) -> Result<Loaded> {
        let start = Instant::now();
        let pack = Pack::open(path)?;
        let opened = start.elapsed().as_secs_f64();
        let mut loaded = self.load_pack_with(&pack, which, device, decoder, opts, None)?;
        loaded.report.seconds += opened; // reading the index is part of this load
        Ok(loaded)
    }

    /// [`Engine::load_pack`] of a pack already opened, with faults injected into its reads (tests).
    pub fn load_pack_with(
        &self,
        pack: &Pack,
        which: Option<&[usize]>,
        device: Device,
        decoder: Decoder,
        opts: &LoadOpts<'_>,
        faults: Option<Arc<weightlift_io::fault::FaultPlan>>,
    ) -> Result<Loaded> {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        let start = Instant::now();
        if opts.checks.is_some() {
            // A pack carries its own checksums, all checked as its chunks decode.
            return Err(Error::InvalidArgument("a packed load checks the pack's own checksums; none are taken".into()));
        }
        let (path, index) = (pack.path(), pack.index());
        let all: Vec<&Item> = index.tensors().collect();
        let items: Vec<&Item> = match which {
            None => all.clone(),
            Some(w) => w
                .iter()
                .map(|&i| {
                    all.get(i).copied().ok_or_else(|| Error::InvalidArgument(format!("no tensor at position {i}")))
                })
                .collect::<Result<_>>()?,
        };
        let needs_nvcomp = items
            .iter()
            .any(|i| i.chunks.clone().any(|c| index.chunk_streams(c, i.planes).iter().any(|s| s.codec.needs_nvcomp())));
        let (mut kind, mut reason) = choose(decoder, device, needs_nvcomp)?;
        if let (Decoder::Gpu, Decoder::Auto, Device::Cuda(n)) = (kind, decoder, device) {
            // The decoder's libraries load, but it may still not start (NVRTC's code refused by this driver...):
            // auto then decodes on the CPU, saying why.
            let ready = self.gpu(n).and_then(|g| {
                let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
                g.bind()?;
                let u = self.take_unpacker(&g)?;
                self.give_unpacker(n, u);
                Ok(())
            });
            if let Err(e) = ready {
                kind = Decoder::Cpu;
                reason = format!("decoded on the CPU and copied (slower): the GPU decoder cannot start: {e}");
            }
        }
        let batch_bytes = match self.settings().pack_batch_bytes.value {
            0 if kind == Decoder::Gpu && needs_nvcomp => NVCOMP_BATCH_BYTES,
            0 => BATCH_BYTES,
            n => n,
        };
        let batches = plan_batches(index, &items, batch_bytes);
        let mut stats = PackStats {
            stored_bytes: batches.iter().map(|b| b.end - b.start).sum(),
            raw_bytes: items.iter().map(|i| i.nbytes).sum(),
            chunks: batches.iter().map(|b| b.chunks.len() as u64).sum(),
            batches: batches.len() as u64,
            decoder: if kind == Decoder::Gpu { "gpu" } else { "cpu" },
            decoder_reason: reason,
            decode_secs: 0.0,
            read_lanes: 0,
            batch_bytes,
        };
        let bindex = batch_index(path, index, &batches);
        // A keeper that keeps the pack file serves it from its memory: the chunks decode from there into this
        // load's own tensors, nothing read from storage (on the GPU for a device load: a load decoding on the CPU
        // does not ask; a `cpu` keeper's shared memory for a host load).
        let mut not_kept = crate::keep::NotServed::default();
        let mut asked_files = Vec::new();
        let kept = if faults.is_some()
            || batches.is_empty()
            || (matches!(device, Device::Cuda(_)) && kind != Decoder::Gpu)
            || self.settings().keeper.value == crate::settings::KeeperSocket::Off
        {
            None
        } else {
            asked_files = self.open_index(&bindex)?;
            crate::keep::ask_packed(self, &asked_files[0], device, opts).map_err(|n| not_kept = n).ok()
        };
        // The stream that reads the batches from the pack (where no keeper serves it, or its memory fails to
        // decode): the stream and the lanes it reads with.
        let mut start_stream = Some(|| -> Result<(crate::stream::Stream, usize)> {
            let positions: Vec<usize> = (0..batches.len()).collect();
            let object = index.object.is_some();
            let (stream_device, lanes) = if kind == Decoder::Gpu {
                let lanes = self.io().lanes();
                let read = match self.settings().pack_read_lanes.value {
                    // An object's reads cost the lanes little (the network runtime copies the bodies): every lane
                    // takes parts, so that the staging bound, not a quarter of it, sizes the GETs in flight.
                    0 if object => lanes,
                    0 => gpu_decode_read_lanes(lanes),
                    n => (n as usize).min(lanes),
                };
                (device, Some(read))
            } else {
                (Device::Cpu, None)
            };
            let read_lanes = lanes.unwrap_or(self.io().lanes()).min(self.io().lanes());
            // Counted in the batches as cut (one chunk larger than `pack_batch_bytes` makes a larger batch) and in
            // the device blocks they land in (small batches share blocks of up to `BLOCK_MAX`): the window must
            // hold two of either for the reads to run beside the decoding.
            let largest = batches.iter().map(|b| b.end - b.start).max().unwrap_or(0);
            let batch_bytes = batch_bytes.max(largest).max(crate::placement::BLOCK_MAX);
            let mut ahead = batch_bytes.saturating_mul(READ_AHEAD_BATCHES);
            if object {
                // A bucket answers each GET late and slowly: the window holds what the GETs the staging allows
                // in flight cover, else the reads wait on the decoder's batches (two of them let a 4.2 GiB pack
                // from a cloud-shaped bucket read at 2.0 GB/s onto an H100 where the plain file read at 5.6).
                let s = self.settings();
                ahead = ahead.max(s.staging_bytes.value.saturating_mul(s.remote_range_bytes.value) >> 20);
            }
            let ahead = self.settings().prefetch_bytes.value.min(ahead);
            let stream = self.stream_on_lanes(&bindex, &positions, stream_device, faults, lanes, Some(ahead))?;
            Ok((stream, read_lanes))
        });
        // The reads start first; the destinations are allocated while the first batches land (a failed allocation
        // drops the stream, which stops it).
        let mut stream = None;
        if !batches.is_empty()
            && kept.is_none()
            && let Some(start) = start_stream.take()
        {
            let (s, lanes) = start()?;
            stats.read_lanes = lanes;
            stream = Some(s);
        }
        let alloc_start = Instant::now();
        let (mut datas, gpu) = match device {
            Device::Cuda(n) => {
                let gpu = self.gpu(n)?;
                let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
                gpu.bind()?;
                let s = gpu.context().new_stream().map_err(weightlift_cuda::CudaError::driver(n, "cuStreamCreate"))?;
                let mut datas = Vec::with_capacity(items.len());
                for item in &items {
                    // Freed on the legacy stream (the default): after the decoder's work, which is waited for.
                    let b = DeviceBuffer::alloc(&gpu, item.nbytes as usize, &s)?;
                    datas.push(TensorData::Device(DeviceTensor { block: Arc::new(b), offset: 0, len: item.nbytes }));
                }
                s.synchronize().map_err(weightlift_cuda::CudaError::driver(n, "cuStreamSynchronize"))?;
                (datas, Some(gpu))
            }
            Device::PinnedCpu => {
                let gpu = self.gpu(0)?;
                let datas = items
                    .iter()
                    .map(|i| Ok(TensorData::Pinned(PinnedBuffer::alloc(&gpu, i.nbytes as usize)?)))
                    .collect::<Result<Vec<_>>>()?;
                (datas, None)
            }
            Device::Cpu => {
                let datas = items
                    .iter()
                    .map(|i| Ok(TensorData::Host(HostBuffer::new(i.nbytes as usize, Some(self.host_cache()))?)))
                    .collect::<Result<Vec<_>>>()?;
                (datas, None)
            }
        };
        let alloc_secs = alloc_start.elapsed().as_secs_f64();
        let dsts: Vec<u64> = datas
            .iter_mut()
            .map(|d| match d {
                TensorData::Device(t) => t.device_ptr(),
                TensorData::Host(b) => b.as_mut_ptr() as u64,
                TensorData::Pinned(b) => b.as_mut_ptr() as u64,
            })
            .collect();
        let mut io = None;
        let mut network = None;
        let ctx = Ctx { path, index, items: &items, dsts: &dsts, opts, counted: Default::default() };
        let mut served = None;
        if let Some(kept) = kept {
            let decoded = match (kept.bytes(index.len), &gpu) {
                (KeptBytes::Device(base), Some(gpu)) => self
                    .decode_on_gpu(gpu, Stored::Device(base), &batches, &ctx, &mut stats)
                    .map(|()| "decoded on the GPU from its memory into the caller's own"),
                (KeptBytes::Host(bytes), None) => decode_on_cpu(Stored::Host(bytes), &batches, &ctx, None, &mut stats)
                    .map(|()| "decoded from its shared memory"),
                _ => Err(Error::InvalidArgument("its memory is mapped where this load's device is not".into())),
            };
            match decoded {
                Ok(what) => served = Some(kept.served(what)),
                Err(e @ Error::Io(weightlift_io::IoError::Cancelled)) => return Err(e),
                Err(e) => {
                    // A keeper never fails a load the file would give: the pack is read and decoded as if it had
                    // not been asked (every tensor written again), and the report says why.
                    let at = kept.socket().display().to_string();
                    drop(kept);
                    not_kept.why = Some(format!("keeper at {at}: decoding the pack from its memory failed: {e}"));
                    ctx.undo_progress();
                    stats.decode_secs = 0.0;
                    if let Some(start) = start_stream.take() {
                        let (s, lanes) = start()?;
                        stats.read_lanes = lanes;
                        stream = Some(s);
                    }
                }
            }
        }
        if let Some(stream) = stream {
            let decoded = match (&gpu, kind) {
                (Some(gpu), Decoder::Gpu) => {
                    self.decode_on_gpu(gpu, Stored::Stream(&stream), &batches, &ctx, &mut stats)
                }
                (Some(gpu), _) => decode_on_cpu(Stored::Stream(&stream), &batches, &ctx, Some(gpu), &mut stats),
                (None, _) => decode_on_cpu(Stored::Stream(&stream), &batches, &ctx, None, &mut stats),
            };
            network = stream.network();
            let finished = stream.finish();
            decoded?;
            io = finished?.1;
            // How many GETs were in flight, and why: known once the stream's job has ended.
            if let (Some(n), Some(io)) = (network.as_mut(), io.as_ref()) {
                n.gets = io.gets.clone();
            }
        }
        let io = io.unwrap_or_else(|| {
            let why = if served.is_some() { "nothing read: served by the keeper" } else { "nothing to read" };
            weightlift_io::IoReport::blank(weightlift_io::ReadEngineUsed::Pread, why.into())
        });
        let tensors: Vec<Tensor> = items
            .iter()
            .zip(datas)
            .map(|(item, data)| match &item.kind {
                ItemKind::Tensor { name, dtype, shape } => {
                    Tensor { name: name.clone(), dtype: *dtype, shape: shape.clone(), data }
                }
                // `PackIndex::tensors` yields tensors only.
                ItemKind::Gap => Tensor { name: String::new(), dtype: DType::U8, shape: vec![item.nbytes], data },
            })
            .collect();
        let mut report = self.report(device, vec![path.to_path_buf()], tensors.len(), stats.raw_bytes, io);
        report.alloc_secs = alloc_secs;
        report.gpu = gpu.as_ref().map(|g| g.info().clone());
        report.pack = Some(stats);
        report.network = network;
        match served {
            Some(note) => {
                report.path = crate::report::PathUsed::Keeper;
                report.path_reason = note.clone();
                report.keeper = Some(note);
            }
            None => {
                report.keeper = not_kept.why;
                if let Some(socket) = not_kept.keep_after {
                    // Asked only now, so that the keeper reads what this load has just read instead of reading
                    // beside it.
                    let answer = crate::keep::keep_after(self, &socket, &asked_files, device);
                    report.keeper = Some(format!("{}; after the load: {answer}", report.keeper.unwrap_or_default()));
                }
            }
        }
        report.seconds = start.elapsed().as_secs_f64();
        Ok(Loaded { tensors, report })
    }

    fn decode_on_gpu(
        &self,
        gpu: &Gpu,
        from: Stored<'_>,
        batches: &[Batch],
        ctx: &Ctx<'_>,
        stats: &mut PackStats,
    ) -> Result<()> {
        let mut unpacker = self.take_unpacker(gpu)?;
        let mut in_flight: VecDeque<(usize, PendingBatch, Option<TensorData>)> = VecDeque::new();
        let result = (|| {
            for (i, b) in batches.iter().enumerate() {
                let stored = ctx.take(&from, i)?;
                let base = match (&stored, &from) {
                    (Some(TensorData::Device(src)), _) => src.device_ptr(),
                    (None, Stored::Device(pack)) => pack + b.start,
                    _ => return Err(Error::InvalidArgument("a GPU decode batch lies outside device memory".into())),
                };
                let mut srcs = Vec::new();
                let mut jobs = Vec::with_capacity(b.chunks.len());
                for &(t, c) in &b.chunks {
                    let item = ctx.items[t];
                    let chunk = ctx.index.chunks[c];
                    jobs.push(ChunkJob {
                        first_stream: srcs.len() as u32,
                        planes: u32::from(item.planes),
                        dst: ctx.dsts[t] + chunk.raw_offset,
                        raw_len: chunk.raw_len,
                        checksum: chunk.checksum,
                    });
                    for s in ctx.index.chunk_streams(c, item.planes) {
                        srcs.push(StreamSrc {
                            ptr: base + (s.offset - b.start),
                            stored_len: s.stored_len,
                            codec: gpu_codec(s.codec),
                        });
                    }
                }
                // SAFETY: the sources lie inside the batch's landed block (`stored`, kept until the batch is
                // waited) or the kept pack's mapping (alive until the load returns); every destination is a
                // disjoint range of a tensor allocated above, alive until the load returns; the batch is waited
                // below before either goes.
                let pending = unsafe { unpacker.decode_batch(&jobs, &srcs) }.map_err(|e| ctx.gpu_error(b, e))?;
                in_flight.push_back((i, pending, stored));
                if in_flight.len() > 1
                    && let Some((k, p, _stored)) = in_flight.pop_front()
                {
                    let t = Instant::now();
                    p.wait().map_err(|e| ctx.gpu_error(&batches[k], e))?;
                    stats.decode_secs += t.elapsed().as_secs_f64();
                    unpacker.recycle(p);
                    ctx.done(&batches[k]);
                }
            }
            while let Some((k, p, _stored)) = in_flight.pop_front() {
                let t = Instant::now();
                p.wait().map_err(|e| ctx.gpu_error(&batches[k], e))?;
                stats.decode_secs += t.elapsed().as_secs_f64();
                unpacker.recycle(p);
                ctx.done(&batches[k]);
            }
            Ok(())
        })();
        // A failed load leaves batches in flight: dropping them waits for them before their sources go.
        drop(in_flight);
        self.give_unpacker(gpu.ordinal(), unpacker);
        result
    }
}

/// Picks the decoder for `device`: the kind and the reason. nvCOMP is needed only for streams of its codecs
/// (`needs_nvcomp`); weightlift's Huffman streams need NVRTC alone.
fn choose(decoder: Decoder, device: Device, needs_nvcomp: bool) -> Result<(Decoder, String)> {
    let on_device = matches!(device, Device::Cuda(_));
    let gpu_missing = || -> Option<String> {
        let nvrtc = weightlift_cuda::nvrtc::available().err();
        if needs_nvcomp { nvrtc.or_else(|| weightlift_cuda::nvcomp::nvcomp().err()) } else { nvrtc }
    };
    let ready = if needs_nvcomp { "nvCOMP and NVRTC loaded" } else { "NVRTC loaded (no nvCOMP codec in the pack)" };
    match decoder {
        Decoder::Cpu => Ok((Decoder::Cpu, "the CPU decoder was asked for".into())),
        Decoder::Gpu if !on_device => {
            Err(Error::InvalidArgument(format!("the GPU decoder needs a CUDA destination, not {device}")))
        }
        Decoder::Gpu => match gpu_missing() {
            None => Ok((Decoder::Gpu, "the GPU decoder was asked for".into())),
            Some(why) => Err(Error::InvalidArgument(format!("the GPU decoder cannot run: {why}"))),
        },
        Decoder::Auto if !on_device => Ok((Decoder::Cpu, format!("{device} destination: decoded on the CPU"))),
        Decoder::Auto => match gpu_missing() {
            None => Ok((Decoder::Gpu, format!("{ready}: decoded on the GPU"))),
            Some(why) => Ok((Decoder::Cpu, format!("decoded on the CPU and copied (slower): {why}"))),
        },
    }
}

/// What the decoders need to know of the load.
struct Ctx<'a> {
    path: &'a Path,
    index: &'a PackIndex,
    items: &'a [&'a Item],
    /// Each selected tensor's destination address (device or host).
    dsts: &'a [u64],
    opts: &'a LoadOpts<'a>,
    /// Raw bytes counted in `opts.progress` so far.
    counted: std::sync::atomic::AtomicU64,
}

/// Where the decoders find each batch's stored bytes.
enum Stored<'a> {
    /// Landed by a stream that reads the pack.
    Stream(&'a crate::stream::Stream),
    /// In a keeper's memory of the whole pack, mapped at this device address.
    Device(u64),
    /// In a keeper's shared host memory of the whole pack.
    Host(&'a [u8]),
}

impl Ctx<'_> {
    /// Batch `i`'s stored bytes once landed, where a stream reads them (`None` where they lie in a keeper's
    /// memory), or a cancellation error once asked to stop.
    fn take(&self, from: &Stored<'_>, i: usize) -> Result<Option<TensorData>> {
        if self.opts.cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
            return Err(Error::Io(weightlift_io::IoError::Cancelled));
        }
        match from {
            Stored::Stream(stream) => stream.take_with(i, self.opts.cancel).map(Some),
            Stored::Device(_) | Stored::Host(_) => Ok(None),
        }
    }

    /// Counts batch `b`'s raw bytes as done.
    fn done(&self, b: &Batch) {
        if let Some(p) = self.opts.progress {
            let raw: u64 = b.chunks.iter().map(|&(_, c)| self.index.chunks[c].raw_len).sum();
            p.fetch_add(raw, std::sync::atomic::Ordering::Relaxed);
            self.counted.fetch_add(raw, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Takes back what was counted, for a decode that starts over.
    fn undo_progress(&self) {
        if let Some(p) = self.opts.progress {
            p.fetch_sub(
                self.counted.swap(0, std::sync::atomic::Ordering::Relaxed),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    }

    /// A GPU batch's failure as the CPU decoder would report it: the tensor, its chunk, the plane.
    fn gpu_error(&self, b: &Batch, e: UnpackError) -> Error {
        let Some(be) = (match &e {
            UnpackError::Batch(be) => Some(be.clone()),
            _ => None,
        }) else {
            return crate::error::gpu_decoder(e);
        };
        let at = |chunk: usize| {
            let (t, c) = b.chunks[chunk];
            let item = self.items[t];
            (item, c, (c - item.chunks.start) as u64, item.label(&self.index.files))
        };
        let path = self.path.to_path_buf();
        Error::Pack(match be {
            BatchError::Checksum { chunk, expected, actual } => {
                let (_, c, k, item) = at(chunk);
                let ch = self.index.chunks[c];
                PackError::Checksum {
                    path,
                    item,
                    chunk: k,
                    start: ch.raw_offset,
                    end: ch.raw_offset + ch.raw_len,
                    expected,
                    actual,
                }
            }
            BatchError::Decode { chunk, plane, codec, status, what } => {
                let (_, _, k, item) = at(chunk);
                PackError::Codec {
                    path,
                    item,
                    chunk: k,
                    plane: plane as u8,
                    codec,
                    reason: format!("decoder status {status} ({what})"),
                }
            }
            BatchError::Size { chunk, plane, actual, expected } => {
                let (item, c, k, label) = at(chunk);
                let codec =
                    self.index.chunk_streams(c, item.planes).get(plane as usize).map_or("?", |s| s.codec.name());
                PackError::Codec {
                    path,
                    item: label,
                    chunk: k,
                    plane: plane as u8,
                    codec,
                    reason: format!("decoded {actual} bytes, expected {expected}"),
                }
            }
        })
    }
}

/// Decodes each landed batch on the CPU, its chunks in parallel; for a device destination (`gpu`), into pinned
/// memory first, then copied.
fn decode_on_cpu(
    from: Stored<'_>,
    batches: &[Batch],
    ctx: &Ctx<'_>,
    gpu: Option<&Gpu>,
    stats: &mut PackStats,
) -> Result<()> {
    let mut staging: Option<PinnedBuffer> = None;
    for (i, b) in batches.iter().enumerate() {
        let stored = ctx.take(&from, i)?;
        let bytes: &[u8] = match (&stored, &from) {
            (Some(TensorData::Host(h)), _) => h,
            (Some(TensorData::Pinned(p)), _) => p,
            (None, Stored::Host(pack)) => pack.get(b.start as usize..b.end as usize).ok_or_else(|| {
                Error::InvalidArgument(format!("batch {i} lies past the end of the kept pack ({} bytes)", pack.len()))
            })?,
            _ => return Err(Error::InvalidArgument("a CPU decode batch lies in device memory".into())),
        };
        let t = Instant::now();
        // Where each chunk's raw bytes go: its tensor (host destinations) or its place in the pinned staging.
        let mut outs: Vec<Out> = Vec::with_capacity(b.chunks.len());
        if let Some(gpu) = gpu {
            let raw: u64 = b.chunks.iter().map(|&(_, c)| ctx.index.chunks[c].raw_len).sum();
            if staging.as_ref().is_none_or(|s| (s.len() as u64) < raw) {
                staging = Some(PinnedBuffer::alloc(gpu, raw.next_power_of_two() as usize)?);
            }
            let base = staging.as_mut().map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
            let mut at = 0u64;
            for &(_, c) in &b.chunks {
                // SAFETY: `at + raw_len <= raw <= staging.len()`.
                outs.push(Out(unsafe { base.add(at as usize) }));
                at += ctx.index.chunks[c].raw_len;
            }
        } else {
            for &(t, c) in &b.chunks {
                outs.push(Out((ctx.dsts[t] + ctx.index.chunks[c].raw_offset) as *mut u8));
            }
        }
        b.chunks.par_iter().zip(outs.par_iter()).try_for_each(|(&(t, c), out)| {
            let item = ctx.items[t];
            let streams = ctx.index.chunk_streams(c, item.planes);
            let (s0, s1) = (streams[0].offset - b.start, streams[streams.len() - 1].end() - b.start);
            let raw_len = ctx.index.chunks[c].raw_len as usize;
            // SAFETY: `out` is this chunk's own range of `raw_len` bytes (a tensor's, or the staging's), written by
            // no other chunk and alive until this function returns.
            let dest = unsafe { std::slice::from_raw_parts_mut(out.0, raw_len) };
            weightlift_pack::decode_chunk(ctx.path, ctx.index, item, c, &bytes[s0 as usize..s1 as usize], dest)
        })?;
        if let Some(gpu) = gpu {
            // One copy per run of consecutive chunks of one tensor (they lie back to back in the staging and in
            // the tensor), not one per chunk: a 4 GiB pack has tens of thousands of chunks.
            let mut run: Option<(usize, u64, *const u8, usize)> = None; // tensor, offset in it, source, length
            let flush = |run: Option<(usize, u64, *const u8, usize)>| -> Result<()> {
                if let Some((t, at, src, len)) = run {
                    // SAFETY: the source is decoded bytes in the staging; the destination the same bytes' range of
                    // the tensor's device buffer.
                    unsafe {
                        weightlift_cuda::copy_host_to_device(
                            gpu,
                            ctx.dsts[t] + at,
                            std::slice::from_raw_parts(src, len),
                        )?
                    };
                }
                Ok(())
            };
            for (&(t, c), out) in b.chunks.iter().zip(&outs) {
                let ch = ctx.index.chunks[c];
                let src = out.0 as *const u8;
                match &mut run {
                    Some((rt, at, src0, len))
                        if *rt == t && *at + *len as u64 == ch.raw_offset && src0.wrapping_add(*len) == src =>
                    {
                        *len += ch.raw_len as usize;
                    }
                    _ => flush(run.replace((t, ch.raw_offset, src, ch.raw_len as usize)))?,
                }
            }
            flush(run)?;
        }
        stats.decode_secs += t.elapsed().as_secs_f64();
        ctx.done(b);
    }
    Ok(())
}

impl Engine {
    pub(crate) fn take_unpacker(&self, gpu: &Gpu) -> Result<GpuUnpacker> {
        if let Some(u) = self.unpackers().lock().unwrap_or_else(|p| p.into_inner()).remove(&gpu.ordinal()) {
            return Ok(u);
        }
        let stream =
            gpu.context().new_stream().map_err(weightlift_cuda::CudaError::driver(gpu.ordinal(), "cuStreamCreate"))?;
        GpuUnpacker::new(gpu, stream).map_err(crate::error::gpu_decoder)
    }

    pub(crate) fn give_unpacker(&self, ordinal: u32, u: GpuUnpacker) {
        self.unpackers().lock().unwrap_or_else(|p| p.into_inner()).insert(ordinal, u);
    }
}
