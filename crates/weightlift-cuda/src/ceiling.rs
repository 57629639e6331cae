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
