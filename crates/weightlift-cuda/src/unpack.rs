//! Decoding packed chunks on the GPU, stream-ordered: weightlift's Huffman kernel (`wl_huff_decode`) and nvCOMP's
//! batched decoders turn compressed planes (already in device memory) into a scratch buffer, `wl_merge` interleaves
//! the planes into each chunk's destination, and the xxh3 kernels hash every destination range; the statuses,
//! decoded sizes and hashes come back to pinned host memory, checked by [`PendingBatch::wait`]. The same hashing
//! checks plain tensors against a checksum manifest ([`GpuUnpacker::hash_batch`]).
//!
//! One [`GpuUnpacker`] per CUDA stream: its scratch buffers are reused batch after batch, which stream order makes
//! safe. Kernels are compiled by NVRTC on first use; nvCOMP is loaded only when a batch holds streams of its codecs.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg, sys};

use crate::error::CudaError;
use crate::gpu::Gpu;
use crate::memory::{DeviceBuffer, PinnedBuffer};
use crate::nvcomp::{NvCodec, Nvcomp};

/// The kernels' CUDA source (plain enough for a host C++ compiler too; see the tests).
pub const KERNEL_SOURCE: &str = include_str!("pack_kernels.cu");

/// Which decoder reads a compressed stream on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuCodec {
    /// One of nvCOMP's batched decoders.
    Nvcomp(NvCodec),
    /// weightlift's Huffman streams (`weightlift_pack::huffman`), decoded by `wl_huff_decode`.
    Huffman,
}

impl GpuCodec {
    /// The codec's lowercase name (`huffman`, or the nvCOMP codec's [`NvCodec::name`]).
    pub fn name(self) -> &'static str {
        match self {
            GpuCodec::Nvcomp(c) => c.name(),
            GpuCodec::Huffman => "huffman",
        }
    }
}

/// What a status of `wl_huff_decode` means.
pub fn huffman_status(status: i32) -> &'static str {
    match status {
        1 => "malformed header",
        2 => "a segment's end is out of order or past the stream",
        3 => "bits that start no code",
        4 => "a segment needs more bits than it holds",
        _ => "unknown status",
    }
}

/// Where one stored stream (one plane of one chunk) sits in device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamSrc {
    /// Device address of the stream's first byte.
    pub ptr: sys::CUdeviceptr,
    /// The stream's length in bytes, as stored.
    pub stored_len: u64,
    /// `None`: stored raw (the plane's bytes as they are).
    pub codec: Option<GpuCodec>,
}

/// One chunk to decode: its streams (`planes` entries of the batch's stream list from `first_stream`), where its
/// raw bytes go, and the checksum they must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkJob {
    /// Index of the chunk's first stream in the batch's stream list.
    pub first_stream: u32,
    /// How many streams (byte planes) the chunk has; they follow `first_stream` in plane order.
    pub planes: u32,
    /// Device address the chunk's raw bytes are written to.
    pub dst: sys::CUdeviceptr,
    /// The chunk's length in bytes once decoded (a multiple of `planes`).
    pub raw_len: u64,
    /// The xxh3-64 (seed 0) its raw bytes must have.
    pub checksum: u64,
}

/// Why a decoded batch is not what it should be; `chunk` indexes the batch's chunk list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// A decoder refused a stream.
    #[error("chunk {chunk}, plane {plane}: the {codec} decoder reported status {status} ({what})")]
    Decode {
        /// The chunk's index in the batch.
        chunk: usize,
        /// The plane whose stream failed.
        plane: u32,
        /// The codec's name ([`GpuCodec::name`]).
        codec: &'static str,
        /// The decoder's status: nvCOMP's `nvcompStatus_t`, or `wl_huff_decode`'s (see [`huffman_status`]).
        status: i32,
        /// What the status means, in words.
        what: String,
    },
    /// A stream decoded to a length other than its plane's.
    #[error("chunk {chunk}, plane {plane}: decoded {actual} bytes, expected {expected}")]
    Size {
        /// The chunk's index in the batch.
        chunk: usize,
        /// The plane whose stream decoded short or long.
        plane: u32,
        /// Bytes decoded.
        actual: u64,
        /// The plane's length in bytes.
        expected: u64,
    },
    /// A chunk's decoded bytes have another xxh3-64 than the one recorded.
    #[error("chunk {chunk}: checksum {actual:#018x} does not match the recorded {expected:#018x}")]
    Checksum {
        /// The chunk's index in the batch.
        chunk: usize,
        /// The recorded xxh3-64.
        expected: u64,
        /// The xxh3-64 computed on the GPU.
        actual: u64,
    },
}

/// Failure to enqueue or finish a batch.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// A CUDA call failed (device or pinned memory, a copy, compiling the kernels).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The batch could not be set up or run: its description is inconsistent, nvCOMP could not be loaded for its
    /// codecs, or a kernel could not be loaded or launched, or an event failed.
    #[error("{0}")]
    Setup(String),
    /// An nvCOMP call failed.
    #[error(transparent)]
    Nvcomp(#[from] crate::nvcomp::NvcompError),
    /// The batch ran, and a chunk is not what it should be.
    #[error("{0}")]
    Batch(#[from] BatchError),
}

const THREADS: u32 = 256;
/// Threads per Huffman stream: one per segment of a 64 KiB plane (1 KiB segments).
const HUFFMAN_THREADS: u32 = 64;

fn config(grid: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid.clamp(1, 65535), 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

fn launch_failed(kernel: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> UnpackError {
    move |e| UnpackError::Setup(format!("launching {kernel}: {e}"))
}
/// Scratch offsets for decoded planes are aligned to this (more than any nvCOMP decoder asks for).
const SCRATCH_ALIGN: u64 = 256;

/// A device buffer that grows to the largest size asked of it; the old one's free is ordered on the owner's stream.
#[derive(Debug, Default)]
struct Grow(Option<DeviceBuffer>);

impl Grow {
    fn at_least(&mut self, gpu: &Gpu, stream: &Arc<CudaStream>, len: usize) -> Result<u64, CudaError> {
        if self.0.as_ref().is_none_or(|b| b.len() < len) {
            let t = std::time::Instant::now();
            let mut fresh = DeviceBuffer::alloc(gpu, len.next_power_of_two().max(4096), stream)?;
            tracing::debug!(bytes = fresh.len(), secs = t.elapsed().as_secs_f64(), "unpacker buffer grown");
            // SAFETY: the stream belongs to this buffer's context and outlives it (the unpacker holds both).
            unsafe { fresh.set_free_stream(stream.cu_stream()) };
            if let Some(mut old) = self.0.replace(fresh) {
                // SAFETY: as above; freeing on the owner's stream orders it after the batches that used it.
                unsafe { old.set_free_stream(stream.cu_stream()) };
            }
        }
        Ok(self.0.as_ref().map_or(0, |b| b.device_ptr()))
    }
}

struct Kernels {
    huffman: CudaFunction,
    merge: CudaFunction,
    blocks: CudaFunction,
    lanes: CudaFunction,
    finals: CudaFunction,
    _module: Arc<CudaModule>,
}

/// Decodes batches of packed chunks on one CUDA stream.
pub struct GpuUnpacker {
    gpu: Gpu,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    nvcomp: Option<Nvcomp>,
    desc: Grow,
    scratch: Grow,
    temp: Grow,
    sums: Grow,
    results: Grow,
    pinned: Vec<PinnedBuffer>,
}

impl std::fmt::Debug for GpuUnpacker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuUnpacker(cuda:{})", self.gpu.ordinal())
    }
}

fn setup(what: &str) -> impl FnOnce(String) -> UnpackError + '_ {
    move |e| UnpackError::Setup(format!("{what}: {e}"))
}

impl GpuUnpacker {
    /// Compiles the kernels for `gpu` (NVRTC) and binds the unpacker to `stream`.
    pub fn new(gpu: &Gpu, stream: Arc<CudaStream>) -> Result<GpuUnpacker, UnpackError> {
        let module = crate::nvrtc::load_module(gpu, KERNEL_SOURCE, "weightlift_unpack.cu")
            .map_err(setup("compiling and loading the unpack kernels"))?;
        gpu.bind()?;
        let f = |name: &str| module.load_function(name).map_err(|e| UnpackError::Setup(format!("kernel {name}: {e}")));
        let kernels = Kernels {
            huffman: f("wl_huff_decode")?,
            merge: f("wl_merge")?,
            blocks: f("wl_xxh3_blocks")?,
            lanes: f("wl_xxh3_lanes")?,
            finals: f("wl_xxh3_final")?,
            _module: module,
        };
        Ok(GpuUnpacker {
            gpu: gpu.clone(),
            stream,
            kernels,
            nvcomp: None,
            desc: Grow::default(),
            scratch: Grow::default(),
            temp: Grow::default(),
            sums: Grow::default(),
            results: Grow::default(),
            pinned: Vec::new(),
        })
    }

    fn nvcomp(&mut self) -> Result<Nvcomp, UnpackError> {
        if self.nvcomp.is_none() {
            self.nvcomp = Some(crate::nvcomp::nvcomp().map_err(UnpackError::Setup)?);
        }
        self.nvcomp.clone().ok_or_else(|| UnpackError::Setup("nvCOMP".into()))
    }

    /// Enqueues the decoding of `chunks` (whose streams are `streams`) on this unpacker's stream: decode, merge,
    /// hash, results back to the host. Nothing is checked until [`PendingBatch::wait`].
    ///
    /// # Safety
    /// Every stream's `ptr..ptr + stored_len` must be device memory of this GPU holding the stored bytes, and every
    /// chunk's `dst..dst + raw_len` writable device memory, disjoint from each other and from the sources, all
    /// valid until the batch completes on the stream (wait for it, or order later work after it on the stream).
    pub unsafe fn decode_batch(
        &mut self,
        chunks: &[ChunkJob],
        streams: &[StreamSrc],
    ) -> Result<PendingBatch, UnpackError> {
        // SAFETY: the caller's contract, passed on.
        let r = unsafe { self.enqueue_decode(chunks, streams) };
        if r.is_err() {
            // Part of the batch may be queued already: let it finish before the caller frees what it uses.
            let _ = self.stream.synchronize();
        }
        r
    }

    /// [`GpuUnpacker::decode_batch`] without the clean-up on failure.
    ///
    /// # Safety
    /// As for [`GpuUnpacker::decode_batch`].
    unsafe fn enqueue_decode(
        &mut self,
        chunks: &[ChunkJob],
        streams: &[StreamSrc],
    ) -> Result<PendingBatch, UnpackError> {
        let plan = Plan::new(chunks, streams)?;
        self.gpu.bind()?;
        let nv = if plan.groups.iter().any(|g| matches!(g.codec, GpuCodec::Nvcomp(_))) {
            Some(self.nvcomp()?)
        } else {
            None
        };
        let scratch = self.scratch.at_least(&self.gpu, &self.stream, plan.scratch_bytes.max(1) as usize)?;
        let mut temp_bytes = 0usize;
        if let Some(nv) = &nv {
            for g in &plan.groups {
                if let GpuCodec::Nvcomp(codec) = g.codec {
                    let t =
                        nv.decompress_temp_bytes(codec, g.streams.len(), g.max_out as usize, g.total_out as usize)?;
                    temp_bytes = temp_bytes.max(t);
                }
            }
        }
        let temp = self.temp.at_least(&self.gpu, &self.stream, temp_bytes.max(1))?;
        let (desc_host, layout) = plan.descriptors(scratch);
        let desc = self.desc.at_least(&self.gpu, &self.stream, desc_host.len())?;
        let results = self.results.at_least(&self.gpu, &self.stream, layout.results_bytes.max(8))?;
        let sums = self.sums.at_least(&self.gpu, &self.stream, (plan.total_blocks as usize * 64).max(64))?;
        let s = self.stream.cu_stream();
        // SAFETY: `desc` holds at least `desc_host.len()` bytes; the source is pageable host memory, which the
        // driver copies into its own staging before returning, and it lives in the pending batch anyway.
        unsafe { sys::cuMemcpyHtoDAsync_v2(desc, desc_host.as_ptr().cast(), desc_host.len(), s) }
            .result()
            .map_err(CudaError::driver(self.gpu.ordinal(), "cuMemcpyHtoDAsync"))?;
        for (g, at) in plan.groups.iter().zip(&layout.groups) {
            let (codec, nv) = match (g.codec, &nv) {
                (GpuCodec::Huffman, _) => {
                    self.launch_huffman(g.streams.len() as u32, desc, at, results)?;
                    continue;
                }
                (GpuCodec::Nvcomp(codec), Some(nv)) => (codec, nv),
                (GpuCodec::Nvcomp(_), None) => return Err(UnpackError::Setup("nvCOMP was not loaded".into())),
            };
            // SAFETY: the descriptor arrays were just copied to `desc` at these offsets; outputs are scratch ranges
            // aligned to 256 bytes; results has room for every status and size; per the caller's contract the
            // inputs hold the stored bytes.
            unsafe {
                nv.decompress_async(
                    codec,
                    g.streams.len(),
                    desc + at.in_ptrs,
                    desc + at.in_sizes,
                    desc + at.out_caps,
                    results + at.out_sizes,
                    temp,
                    temp_bytes,
                    desc + at.out_ptrs,
                    results + at.statuses,
                    s,
                )?;
            }
        }
        self.launch_merge(desc + layout.merge_jobs, desc + layout.merge_srcs, chunks.len() as u32)?;
        self.launch_hash(desc + layout.hash_jobs, chunks.len() as u32, sums, results + layout.hashes)?;
        self.finish(plan, layout, desc_host, results)
    }

    /// Enqueues xxh3-64 of every `(device address, length)` range (a checksum manifest's chunks, say); the hashes
    /// come back through [`PendingBatch::hashes`] after [`PendingBatch::wait`].
    ///
    /// # Safety
    /// Every range must be readable device memory of this GPU, valid until the batch completes on the stream.
    pub unsafe fn hash_batch(&mut self, ranges: &[(sys::CUdeviceptr, u64)]) -> Result<PendingBatch, UnpackError> {
        let chunks: Vec<ChunkJob> = ranges
            .iter()
            .map(|&(dst, raw_len)| ChunkJob { first_stream: 0, planes: 0, dst, raw_len, checksum: 0 })
            .collect();
        let plan = Plan::hash_only(&chunks);
        self.gpu.bind()?;
        let (desc_host, layout) = plan.descriptors(0);
        let desc = self.desc.at_least(&self.gpu, &self.stream, desc_host.len())?;
        let results = self.results.at_least(&self.gpu, &self.stream, layout.results_bytes.max(8))?;
        let sums = self.sums.at_least(&self.gpu, &self.stream, (plan.total_blocks as usize * 64).max(64))?;
        // SAFETY: as in `decode_batch`.
        unsafe { sys::cuMemcpyHtoDAsync_v2(desc, desc_host.as_ptr().cast(), desc_host.len(), self.stream.cu_stream()) }
            .result()
            .map_err(CudaError::driver(self.gpu.ordinal(), "cuMemcpyHtoDAsync"))?;
        self.launch_hash(desc + layout.hash_jobs, chunks.len() as u32, sums, results + layout.hashes)?;
        self.finish(plan, layout, desc_host, results)
    }

    /// Zeroes the group's statuses, then one block of [`HUFFMAN_THREADS`] threads per stream decodes it (a thread
    /// per 1 KiB segment: a 64 KiB plane's 64 segments at once).
    fn launch_huffman(&self, n: u32, desc: u64, at: &GroupLayout, results: u64) -> Result<(), UnpackError> {
        if n == 0 {
            return Ok(());
        }
        let s = self.stream.cu_stream();
        // SAFETY: `results` has room for the group's `n` statuses at this offset (`Plan::descriptors`).
        unsafe { sys::cuMemsetD32Async(results + at.statuses, 0, n as usize, s) }
            .result()
            .map_err(CudaError::driver(self.gpu.ordinal(), "cuMemsetD32Async"))?;
        let (in_ptrs, in_sizes, out_ptrs, out_lens) =
            (desc + at.in_ptrs, desc + at.in_sizes, desc + at.out_ptrs, desc + at.out_caps);
        let (sizes, statuses) = (results + at.out_sizes, results + at.statuses);
        let mut b = self.stream.launch_builder(&self.kernels.huffman);
        b.arg(&in_ptrs).arg(&in_sizes).arg(&out_ptrs).arg(&out_lens).arg(&sizes).arg(&statuses).arg(&n);
        let cfg = LaunchConfig {
            grid_dim: (n.clamp(1, 65535), 1, 1),
            block_dim: (HUFFMAN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `wl_huff_decode(const u64*, const u64*, const u64*, const u64*, u64*, u32*, u32)`; the
        // four descriptor arrays hold `n` words each (copied to `desc` on this stream before), the results buffer
        // has `n` sizes and statuses at these offsets, and the kernel reads and writes only inside each stream's
        // given input and output ranges (scratch, or the caller's stored bytes).
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(launch_failed("wl_huff_decode"))
    }

    fn launch_merge(&self, jobs: u64, srcs: u64, n: u32) -> Result<(), UnpackError> {
        if n == 0 {
            return Ok(());
        }
        let mut b = self.stream.launch_builder(&self.kernels.merge);
        b.arg(&jobs).arg(&srcs).arg(&n);
        // SAFETY: the arguments match `wl_merge(const MergeJob*, const u64*, u32)`; the job and source tables were
        // copied to `desc` on this stream before, and every address in them is scratch or the caller's memory.
        unsafe { b.launch(config(n)) }.map(|_| ()).map_err(launch_failed("wl_merge"))
    }

    /// Three launches: block sums (into `sums`), lane chains (accumulators after the hashes in `out`'s buffer), and
    /// the final merge (hashes at `out`).
    fn launch_hash(&self, jobs: u64, n: u32, sums: u64, out: u64) -> Result<(), UnpackError> {
        if n == 0 {
            return Ok(());
        }
        let accs = out + 8 * u64::from(n);
        let mut b = self.stream.launch_builder(&self.kernels.blocks);
        b.arg(&jobs).arg(&n).arg(&sums);
        // SAFETY: matches `wl_xxh3_blocks(const HashJob*, u32, u64*)`; `sums` has a row of 64 bytes for every
        // 1 KiB block of every range (`Plan::total_blocks`).
        unsafe { b.launch(config(n)) }.map_err(launch_failed("wl_xxh3_blocks"))?;
        let lanes = (u64::from(n) * 8).div_ceil(u64::from(THREADS)).min(65535) as u32;
        let mut b = self.stream.launch_builder(&self.kernels.lanes);
        b.arg(&jobs).arg(&n).arg(&sums).arg(&accs);
        // SAFETY: matches `wl_xxh3_lanes(const HashJob*, u32, const u64*, u64*)`; `accs` has 8 words per range.
        unsafe { b.launch(config(lanes)) }.map_err(launch_failed("wl_xxh3_lanes"))?;
        let finals = u64::from(n).div_ceil(u64::from(THREADS)).min(65535) as u32;
        let mut b = self.stream.launch_builder(&self.kernels.finals);
        b.arg(&jobs).arg(&n).arg(&accs).arg(&out);
        // SAFETY: matches `wl_xxh3_final(const HashJob*, u32, const u64*, u64*)`; `out` has a word per range.
        unsafe { b.launch(config(finals)) }.map(|_| ()).map_err(launch_failed("wl_xxh3_final"))
    }

    fn finish(
        &mut self,
        plan: Plan,
        layout: Layout,
        desc_host: Vec<u8>,
        results: u64,
    ) -> Result<PendingBatch, UnpackError> {
        let need = layout.results_bytes.max(8);
        let mut host = match self.pinned.iter().position(|p| p.len() >= need) {
            Some(i) => self.pinned.swap_remove(i),
            None => {
                let t = std::time::Instant::now();
                let made = PinnedBuffer::alloc(&self.gpu, need.next_power_of_two())?;
                tracing::debug!(bytes = made.len(), secs = t.elapsed().as_secs_f64(), "pinned result buffer made");
                made
            }
        };
        let s = self.stream.cu_stream();
        // SAFETY: `host` is pinned and at least `need` bytes; `results` holds them on the device; the pending batch
        // owns `host` until the copy is known complete (its event).
        unsafe { sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), results, need, s) }
            .result()
            .map_err(CudaError::driver(self.gpu.ordinal(), "cuMemcpyDtoHAsync"))?;
        let event =
            self.stream.record_event(None).map_err(|e| UnpackError::Setup(format!("recording an event: {e}")))?;
        Ok(PendingBatch { plan, layout, host: Some(host), event, _desc: desc_host })
    }

    /// Hands a finished batch's host buffer back for reuse.
    pub fn recycle(&mut self, mut batch: PendingBatch) {
        if batch.event.synchronize().is_ok()
            && let Some(h) = batch.host.take()
        {
            self.pinned.push(h);
        }
    }
}

impl Drop for GpuUnpacker {
    fn drop(&mut self) {
        // The scratch buffers are freed on this unpacker's stream, which (fields dropping in declaration order)
        // would otherwise be destroyed before them: free them while it lives, and let the frees finish.
        for g in [&mut self.desc, &mut self.scratch, &mut self.temp, &mut self.sums, &mut self.results] {
            g.0.take();
        }
        let _ = self.stream.synchronize();
    }
}

/// A batch in flight: [`PendingBatch::wait`] blocks until its results are on the host and checks them.
pub struct PendingBatch {
    plan: Plan,
    layout: Layout,
    host: Option<PinnedBuffer>,
    event: cudarc::driver::CudaEvent,
    _desc: Vec<u8>,
}

impl std::fmt::Debug for PendingBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingBatch({} chunks)", self.plan.chunks.len())
    }
}

fn word(bytes: &[u8], at: usize) -> u64 {
    bytes.get(at..at + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
}

impl PendingBatch {
    /// Waits for the batch and checks every decoder's status, decoded size and checksum; the first failure is the
    /// error.
    pub fn wait(&self) -> Result<(), UnpackError> {
        self.event.synchronize().map_err(|e| UnpackError::Setup(format!("waiting for a batch: {e}")))?;
        let host: &[u8] = self.host.as_deref().unwrap_or(&[]);
        for (g, at) in self.plan.groups.iter().zip(&self.layout.groups) {
            for (k, &(chunk, plane, expected)) in g.streams.iter().enumerate() {
                let status = word(host, (at.statuses + 4 * k as u64) as usize) as u32 as i32;
                if status != 0 {
                    let what = match g.codec {
                        GpuCodec::Huffman => huffman_status(status).to_string(),
                        GpuCodec::Nvcomp(_) => crate::nvcomp::nvcomp().map(|n| n.describe(status)).unwrap_or_default(),
                    };
                    return Err(BatchError::Decode { chunk, plane, codec: g.codec.name(), status, what }.into());
                }
                let actual = word(host, (at.out_sizes + 8 * k as u64) as usize);
                if actual != expected {
                    return Err(BatchError::Size { chunk, plane, actual, expected }.into());
                }
            }
        }
        if self.plan.check {
            for (i, c) in self.plan.chunks.iter().enumerate() {
                let actual = word(host, self.layout.hashes as usize + 8 * i);
                if actual != c.checksum {
                    return Err(BatchError::Checksum { chunk: i, expected: c.checksum, actual }.into());
                }
            }
        }
        Ok(())
    }

    /// Whether the batch's work (and its results' copy to the host) has completed, without waiting.
    pub fn is_complete(&self) -> bool {
        self.event.is_complete()
    }

    /// The xxh3-64 of every chunk's (or range's) destination bytes, after [`PendingBatch::wait`].
    pub fn hashes(&self) -> Vec<u64> {
        let host: &[u8] = self.host.as_deref().unwrap_or(&[]);
        (0..self.plan.chunks.len()).map(|i| word(host, self.layout.hashes as usize + 8 * i)).collect()
    }
}

impl Drop for PendingBatch {
    fn drop(&mut self) {
        // The pinned buffer may still be the target of the results copy.
        let _ = self.event.synchronize();
    }
}

/// The compressed streams of one codec in a batch: `(chunk, plane, plane length)` each, with their sources.
struct Group {
    codec: GpuCodec,
    streams: Vec<(usize, u32, u64)>,
    srcs: Vec<(u64, u64)>,
    outs: Vec<u64>,
    max_out: u64,
    total_out: u64,
}

struct Plan {
    chunks: Vec<ChunkJob>,
    groups: Vec<Group>,
    /// Source of every plane of every chunk, in order (raw streams: their own address; others: a scratch offset,
    /// rebased when the scratch address is known).
    merge_srcs: Vec<(bool, u64)>,
    scratch_bytes: u64,
    total_blocks: u64,
    check: bool,
}

impl Plan {
    fn new(chunks: &[ChunkJob], streams: &[StreamSrc]) -> Result<Plan, UnpackError> {
        let mut groups: Vec<Group> = Vec::new();
        let mut merge_srcs = Vec::new();
        let mut scratch = 0u64;
        for (i, c) in chunks.iter().enumerate() {
            let first = c.first_stream as usize;
            let Some(own) = streams.get(first..first + c.planes as usize) else {
                return Err(UnpackError::Setup(format!(
                    "chunk {i}: streams {first}.. past the {} given",
                    streams.len()
                )));
            };
            if c.planes == 0 || c.raw_len % u64::from(c.planes) != 0 {
                return Err(UnpackError::Setup(format!("chunk {i}: {} planes for {} bytes", c.planes, c.raw_len)));
            }
            let plane_len = c.raw_len / u64::from(c.planes);
            for (p, s) in own.iter().enumerate() {
                match s.codec {
                    None => {
                        if s.stored_len != plane_len {
                            return Err(UnpackError::Setup(format!(
                                "chunk {i}: raw plane of {} bytes, expected {plane_len}",
                                s.stored_len
                            )));
                        }
                        merge_srcs.push((false, s.ptr));
                    }
                    Some(codec) => {
                        let g = match groups.iter().position(|g| g.codec == codec) {
                            Some(k) => &mut groups[k],
                            None => {
                                groups.push(Group {
                                    codec,
                                    streams: vec![],
                                    srcs: vec![],
                                    outs: vec![],
                                    max_out: 0,
                                    total_out: 0,
                                });
                                groups.last_mut().ok_or_else(|| UnpackError::Setup("group".into()))?
                            }
                        };
                        g.streams.push((i, p as u32, plane_len));
                        g.srcs.push((s.ptr, s.stored_len));
                        g.outs.push(scratch);
                        g.max_out = g.max_out.max(plane_len);
                        g.total_out += plane_len;
                        merge_srcs.push((true, scratch));
                        scratch = (scratch + plane_len).next_multiple_of(SCRATCH_ALIGN);
                    }
                }
            }
        }
        let mut plan = Plan::hash_only(chunks);
        plan.groups = groups;
        plan.merge_srcs = merge_srcs;
        plan.scratch_bytes = scratch;
        plan.check = true;
        Ok(plan)
    }

    fn hash_only(chunks: &[ChunkJob]) -> Plan {
        let total_blocks = chunks.iter().map(|c| if c.raw_len > 240 { (c.raw_len - 1) / 1024 } else { 0 }).sum();
        Plan {
            chunks: chunks.to_vec(),
            groups: Vec::new(),
            merge_srcs: Vec::new(),
            scratch_bytes: 0,
            total_blocks,
            check: false,
        }
    }

    /// Every device-side array of the batch in one host buffer, and where each sits (offsets 16-byte aligned): the
    /// kernels' `MergeJob` is 3 words (`dst`, `plane_len`, `first_src | planes << 32`), `HashJob` 3 words (`data`,
    /// `len`, `block_base`);
    /// device results (statuses, sizes, hashes, lane accumulators) get offsets in the results buffer.
    fn descriptors(&self, scratch: u64) -> (Vec<u8>, Layout) {
        let mut buf: Vec<u8> = Vec::new();
        let mut put = |words: &mut dyn Iterator<Item = u64>| -> u64 {
            buf.resize(buf.len().next_multiple_of(16), 0);
            let at = buf.len() as u64;
            for w in words {
                buf.extend_from_slice(&w.to_le_bytes());
            }
            at
        };
        let mut results = 0u64;
        let mut groups = Vec::with_capacity(self.groups.len());
        for g in &self.groups {
            let n = g.streams.len() as u64;
            let at = GroupLayout {
                in_ptrs: put(&mut g.srcs.iter().map(|s| s.0)),
                in_sizes: put(&mut g.srcs.iter().map(|s| s.1)),
                out_caps: put(&mut g.streams.iter().map(|s| s.2)),
                out_ptrs: put(&mut g.outs.iter().map(|o| scratch + o)),
                out_sizes: results,
                statuses: results + 8 * n,
            };
            results = (at.statuses + 4 * n).next_multiple_of(16);
            groups.push(at);
        }
        let mut merge = Vec::with_capacity(self.chunks.len() * 3);
        let mut first = 0u32;
        for c in &self.chunks {
            let plane_len = if c.planes == 0 { 0 } else { c.raw_len / u64::from(c.planes) };
            merge.extend([c.dst, plane_len, u64::from(first) | u64::from(c.planes) << 32]);
            first += c.planes;
        }
        let merge_jobs = put(&mut merge.into_iter());
        let merge_srcs =
            put(&mut self.merge_srcs.iter().map(|&(in_scratch, a)| if in_scratch { scratch + a } else { a }));
        let mut base = 0u64;
        let mut hash = Vec::with_capacity(self.chunks.len() * 3);
        for c in &self.chunks {
            hash.extend([c.dst, c.raw_len, base]);
            base += if c.raw_len > 240 { (c.raw_len - 1) / 1024 } else { 0 };
        }
        let hash_jobs = put(&mut hash.into_iter());
        let hashes = results;
        // Hashes, then 8 lane accumulators per chunk.
        let results_bytes = (hashes + 8 * self.chunks.len() as u64 + 64 * self.chunks.len() as u64) as usize;
        (buf, Layout { groups, merge_jobs, merge_srcs, hash_jobs, hashes, results_bytes })
    }
}

struct GroupLayout {
    in_ptrs: u64,
    in_sizes: u64,
    out_caps: u64,
    out_ptrs: u64,
    out_sizes: u64,
    statuses: u64,
}

struct Layout {
    groups: Vec<GroupLayout>,
    merge_jobs: u64,
    merge_srcs: u64,
    hash_jobs: u64,
    hashes: u64,
    results_bytes: usize,
}
