//! The host→device ceiling: how fast this machine copies from pinned host memory to a device, measured with device
//! events over several repetitions.

use cudarc::driver::sys;

use crate::error::CudaError;
use crate::gpu::Gpu;
use crate::memory::{DeviceBuffer, PinnedBuffer};

/// Best rate (GB/s, 10^9) of `reps` pinned host→device copies of `bytes` bytes, after one untimed copy.
pub fn pinned_h2d_gbps(gpu: &Gpu, bytes: usize, reps: usize) -> Result<Vec<f64>, CudaError> {
    let dev = gpu.ordinal();
    gpu.bind()?;
    let mut host = PinnedBuffer::alloc(gpu, bytes)?;
    // Real bytes, not zeros (a copy engine could in principle treat them differently).
    for (i, chunk) in host.chunks_mut(4096).enumerate() {
        chunk.fill((i % 251) as u8 + 1);
    }
    let stream = gpu.stream(0)?;
    let device = DeviceBuffer::alloc(gpu, bytes, &stream)?;
    let copy = || {
        // SAFETY: both buffers hold `bytes` bytes and outlive the copy (the stream is synchronised below).
        unsafe { sys::cuMemcpyHtoDAsync_v2(device.device_ptr(), host.as_ptr().cast(), bytes, stream.cu_stream()) }
            .result()
            .map_err(CudaError::driver(dev, "cuMemcpyHtoDAsync"))
    };
    copy()?;
    let mut rates = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(CudaError::driver(dev, "cuEventRecord"))?;
        copy()?;
        let end = stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(CudaError::driver(dev, "cuEventRecord"))?;
        let ms = start.elapsed_ms(&end).map_err(CudaError::driver(dev, "cuEventElapsedTime"))?;
        rates.push(bytes as f64 / (f64::from(ms) / 1e3) / 1e9);
    }
    stream.synchronize().map_err(CudaError::driver(dev, "cuStreamSynchronize"))?;
    Ok(rates)
}

/// Rate (GB/s) of copying `total` bytes of pinned host memory to a device as copies of `chunk` bytes spread over
/// `streams` streams: the copy pattern of a load, without the reads. Best of `reps`.
pub fn chunked_h2d_gbps(gpu: &Gpu, total: usize, chunk: usize, streams: usize, reps: usize) -> Result<f64, CudaError> {
    let dev = gpu.ordinal();
    gpu.bind()?;
    let mut host = PinnedBuffer::alloc(gpu, total)?;
    for (i, c) in host.chunks_mut(4096).enumerate() {
        c.fill((i % 249) as u8 + 3);
    }
    let lanes: Vec<_> = (0..streams.max(1)).map(|i| gpu.stream(i)).collect::<Result<_, _>>()?;
    let device = DeviceBuffer::alloc(gpu, total, &lanes[0])?;
    lanes[0].synchronize().map_err(CudaError::driver(dev, "cuStreamSynchronize"))?;
    let chunk = chunk.clamp(1, total.max(1));
    let mut best = 0.0f64;
    for _ in 0..reps.max(1) + 1 {
        let t = std::time::Instant::now();
        for (k, off) in (0..total).step_by(chunk).enumerate() {
            let n = chunk.min(total - off);
            let s = &lanes[k % lanes.len()];
            // SAFETY: `off + n <= total` for both buffers, which outlive the copies (all streams are synchronised
            // below before they drop).
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    device.device_ptr() + off as u64,
                    host.as_ptr().add(off).cast(),
                    n,
                    s.cu_stream(),
                )
            }
            .result()
            .map_err(CudaError::driver(dev, "cuMemcpyHtoDAsync"))?;
        }
        for s in &lanes {
            s.synchronize().map_err(CudaError::driver(dev, "cuStreamSynchronize"))?;
        }
        best = best.max(total as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    Ok(best)
}
