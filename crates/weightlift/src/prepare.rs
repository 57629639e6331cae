//! Setting the engine up for loads onto a device before the first of them: what a program's first load otherwise
//! pays for while it runs.

use std::time::Instant;

use serde_json::{Value, json};
use weightlift_cuda::unpack::GpuUnpacker;
use weightlift_cuda::{CudaPinner, DeviceBuffer};
use weightlift_io::{IoError, Pinner, StagingPrepared};

use crate::device::Device;
use crate::engine::Engine;
use crate::error::Result;
use crate::path::PathKind;

/// Bytes allocated from (and given back to) a device's stream-ordered pool by [`Engine::prepare`], so that the
/// pool's first use in the process is not the first load's.
const POOL_TOUCH_BYTES: usize = 2 << 20;

/// Events made ready per lane by [`Engine::prepare`]: a lane's copies in flight (one per staging slot, a few slots).
const WARM_EVENTS_PER_LANE: usize = 4;

/// What [`Engine::prepare`] did.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The device prepared.
    pub device: Device,
    /// The lanes' staging (pinned for a GPU), or `None` where the device's data path does not read through the
    /// lanes (cuFile peer-to-peer, the NVMe simulator).
    pub staging: Option<StagingPrepared>,
    /// For a GPU, the step before: the same staging faulted in without a device (`staging` then only pinned it).
    pub staging_host: Option<StagingPrepared>,
    /// The GPU's data path and why it was chosen (GPUs only).
    pub path: Option<String>,
    /// CUDA streams made ready: one per lane and one for the destinations' allocation (GPUs only).
    pub streams: usize,
    /// Time to allocate and free a small block of the device's pool (GPUs only).
    pub pool_secs: Option<f64>,
    /// Wall time of the call.
    pub seconds: f64,
}

impl Prepared {
    /// The same as JSON, as the CLI and the Python package print it.
    pub fn to_json(&self) -> Value {
        let staging = |s: &StagingPrepared| {
            json!({
                "lanes": s.lanes, "lanes_set_up": s.lanes_set_up, "slot_bytes": s.slot_bytes,
                "slots_per_lane": s.slots_per_lane, "bytes": s.slot_bytes * s.slots_per_lane as u64 * s.lanes as u64,
                "pinned": s.pinned, "seconds": s.seconds, "setup_thread_secs": s.setup_thread_secs,
                "wait_thread_secs": s.wait_thread_secs,
            })
        };
        json!({
            "device": self.device.to_string(), "staging": self.staging.as_ref().map(staging),
            "staging_host": self.staging_host.as_ref().map(staging), "path": self.path, "streams": self.streams,
            "pool_secs": self.pool_secs, "seconds": self.seconds,
        })
    }
}

impl Engine {
    /// Sets the engine up for loads onto `device` now, so that a first load from the page cache pays for none of
    /// it: the lanes' staging (mapped, faulted in, pinned for a GPU and registered with each lane's ring), and for
    /// a GPU its context, data path, the lanes' streams (each carrying a first small copy), the events the copies
    /// use and a first use of its memory pool. A program's first load
    /// otherwise does this while it runs: on the H100 machine a fresh process's first 4 GiB load took 1.16–1.45×
    /// its second (bench/results/2026-11-24-h100-zj), 0.93–1.06× after `prepare` (-zn, -zo). It moves that work,
    /// it does not make it cheaper (37–55 ms there): it saves time only run beside other start-up work. Faulting
    /// the staging in (most of its set-up) needs no device and runs first, so a thread started before the device's
    /// context exists does it while another thread creates the context; pinning it, the streams and the pool wait
    /// for the context. A load that
    /// reads from disk sets up its own larger slots (see `IoEngine::prepare_staging`). Cheap when the engine is set
    /// up already; waits for loads in progress to leave the lanes. The staging stays until
    /// [`Engine::release_memory`], the engine's end, or a load that needs other slots.
    pub fn prepare(&self, device: Device) -> Result<Prepared> {
        self.prepare_with(device, None)
    }

    /// [`Engine::prepare`], giving up with `Error::Io(IoError::Cancelled)` once `cancel` is set (while it waits for
    /// busy lanes).
    pub fn prepare_with(&self, device: Device, cancel: Option<&std::sync::atomic::AtomicBool>) -> Result<Prepared> {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        let t = Instant::now();
        let mut out = Prepared {
            device,
            staging: None,
            staging_host: None,
            path: None,
            streams: 0,
            pool_secs: None,
            seconds: 0.0,
        };
        match device {
            Device::Cpu | Device::PinnedCpu => out.staging = Some(self.io().prepare_staging(false, None, cancel)?),
            Device::Cuda(n) => {
                // Refused before any staging is made: a device that is not there is an error that leaves nothing.
                let driver = weightlift_cuda::available().map_err(weightlift_cuda::CudaError::Unavailable)?;
                if n >= driver.devices {
                    return Err(weightlift_cuda::CudaError::NoSuchDevice { ordinal: n, count: driver.devices }.into());
                }
                // Deciding the path needs no context (cuFile is loaded only where nvidia-fs is present).
                let path = self.gpu_path(n)?;
                out.path = Some(path.reason.clone());
                let pipeline = path.kind == PathKind::Pipeline;
                if pipeline {
                    // Faulting the staging in (most of its set-up) needs no device either: done before the context,
                    // it runs beside another thread's creating it (a program starting `prepare` on a thread early).
                    out.staging_host = Some(self.io().prepare_staging(true, None, cancel)?);
                }
                let gpu = self.gpu(n)?;
                let lanes = self.io().lanes();
                // On a thread of its own: binding the device's context here would change the caller's current
                // device (a PyTorch program's, say).
                std::thread::scope(|s| {
                    s.spawn(|| -> Result<()> {
                        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
                        gpu.bind()?;
                        // `allocate_published` allocates on stream `lanes`, lane i copies on stream i.
                        for i in 0..=lanes {
                            gpu.stream(i)?;
                        }
                        // Each lane's stream carries a first copy, and deliveries find their events made.
                        weightlift_cuda::warm_streams(&gpu, lanes, lanes * WARM_EVENTS_PER_LANE)?;
                        out.streams = lanes + 1;
                        let p = Instant::now();
                        let stream = gpu.stream(lanes)?;
                        let mut b = DeviceBuffer::alloc(&gpu, POOL_TOUCH_BYTES, &stream)?;
                        // SAFETY: the stream is the device's own (kept by `gpu`, alive past the buffer's drop).
                        unsafe { b.set_free_stream(stream.cu_stream()) };
                        drop(b);
                        stream.synchronize().map_err(weightlift_cuda::CudaError::driver(n, "cuStreamSynchronize"))?;
                        out.pool_secs = Some(p.elapsed().as_secs_f64());
                        Ok(())
                    })
                    .join()
                    .unwrap_or_else(|_| Err(IoError::Panicked(format!("preparing cuda:{n} panicked")).into()))
                })?;
                if pipeline {
                    let pinner: std::sync::Arc<dyn Pinner> = std::sync::Arc::new(CudaPinner::new(&gpu));
                    out.staging = Some(self.io().prepare_staging(true, Some(pinner), cancel)?);
                }
            }
        }
        out.seconds = t.elapsed().as_secs_f64();
        Ok(out)
    }

    /// Makes the GPU kernels of packed checkpoints and of checked loads (`verify`) ready on `device` now: compiled
    /// with NVRTC, or read from the kernel cache (see `weightlift_cuda::kernel_cache`), loaded into the device's
    /// context and run once on a small chunk, where a program's first packed or checked load would otherwise do it
    /// while it runs. Returns the
    /// seconds it took (close to nothing when they are ready already). `Device::Cpu` has no kernels: `Ok(0.0)`.
    /// Errors as the first packed load on the GPU would give them (NVRTC missing, say).
    pub fn prepare_kernels(&self, device: Device) -> Result<f64> {
        let Device::Cuda(n) = device else { return Ok(0.0) };
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        let t = Instant::now();
        let gpu = self.gpu(n)?;
        // An unpacker kept from an earlier call or load has run its kernels: nothing to do.
        if self.unpackers().lock().unwrap_or_else(|p| p.into_inner()).contains_key(&n) {
            return Ok(t.elapsed().as_secs_f64());
        }
        let mut unpacker = self.take_unpacker(&gpu)?;
        let warmed = warm_unpacker(&gpu, &mut unpacker);
        self.give_unpacker(n, unpacker);
        warmed?;
        Ok(t.elapsed().as_secs_f64())
    }
}

/// Decodes one small Huffman-coded chunk (checked by its xxh3) with `unpacker`: every kernel of a packed or checked
/// load runs once (a kernel's first launch in a process costs more than later ones), and the unpacker's device
/// buffers and pinned result buffer exist, as after a first load. Its errors are those a first packed load would
/// meet.
fn warm_unpacker(gpu: &weightlift_cuda::Gpu, unpacker: &mut GpuUnpacker) -> Result<()> {
    use weightlift_cuda::unpack::{ChunkJob, GpuCodec, StreamSrc, UnpackError};
    use weightlift_pack::{Codec, Level};
    const RAW: usize = 64 << 10;
    // Two byte planes of bf16-like values (varied, never zeros): a small xorshift sequence.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let raw: Vec<u8> = (0..RAW)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 2 == 1 { 0x3C | (x as u8 & 0x3) } else { x as u8 }
        })
        .collect();
    let half = RAW / 2;
    let (mut lo, mut hi) = (vec![0u8; half], vec![0u8; half]);
    weightlift_pack::planes::split(&raw, &mut [&mut lo[..], &mut hi[..]]);
    let mut blob = Vec::new();
    let mut streams = Vec::new();
    for plane in [&lo, &hi] {
        let stored = weightlift_pack::compress(Codec::Huffman, Level(3), plane)
            .map_err(|e| crate::error::gpu_decoder(UnpackError::Setup(format!("encoding the warm-up chunk: {e}"))))?;
        blob.resize(blob.len().next_multiple_of(16), 0);
        streams.push((blob.len() as u64, stored.len() as u64));
        blob.extend_from_slice(&stored);
    }
    let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
    gpu.bind()?;
    let stream = gpu.stream(0)?;
    let src = DeviceBuffer::alloc(gpu, blob.len(), &stream)?;
    let dst = DeviceBuffer::alloc(gpu, RAW, &stream)?;
    stream.synchronize().map_err(weightlift_cuda::CudaError::driver(gpu.ordinal(), "cuStreamSynchronize"))?;
    // SAFETY: `src` holds `blob.len()` bytes of device memory, allocated (stream synchronized above).
    unsafe { weightlift_cuda::copy_host_to_device(gpu, src.device_ptr(), &blob) }?;
    let srcs: Vec<StreamSrc> = streams
        .iter()
        .map(|&(at, len)| StreamSrc { ptr: src.device_ptr() + at, stored_len: len, codec: Some(GpuCodec::Huffman) })
        .collect();
    let job = ChunkJob {
        first_stream: 0,
        planes: 2,
        dst: dst.device_ptr(),
        raw_len: RAW as u64,
        checksum: weightlift_pack::checksum(&raw),
    };
    // SAFETY: the streams are device memory holding the stored bytes, the destination RAW writable bytes disjoint
    // from them; both live past the wait below (which also covers the failure of the enqueue).
    let batch = unsafe { unpacker.decode_batch(&[job], &srcs) }.map_err(crate::error::gpu_decoder)?;
    let waited = batch.wait().map_err(crate::error::gpu_decoder);
    unpacker.recycle(batch);
    waited
}
