//! The device sink: each completed read becomes `cuMemcpyHtoDAsync` copies from its staging slot (pinned) to the
//! destination ranges it feeds, on the lane's own stream, followed by an event; the slot is reused once the event
//! has completed. Reads wait for copies only when every slot of a lane is busy.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaEvent, CudaStream, sys};
use weightlift_io::{Piece, Sink, SinkError};

use crate::error::CudaError;
use crate::gpu::Gpu;

struct LaneCtx {
    stream: Arc<CudaStream>,
    spare: Vec<CudaEvent>,
    start: Option<CudaEvent>,
}

/// A delivery whose copies may still be reading their slot.
pub struct PendingCopy {
    lane: usize,
    event: CudaEvent,
}

impl std::fmt::Debug for PendingCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingCopy(lane {})", self.lane)
    }
}

/// Copies loaded bytes into device buffers (destination id `i` is `dests[i]`: address and length).
pub struct DeviceSink {
    gpu: Gpu,
    dests: Vec<(sys::CUdeviceptr, u64)>,
    lanes: Vec<Mutex<Option<LaneCtx>>>,
    ready: Option<CudaEvent>,
    spans: Mutex<Vec<f64>>,
}

impl std::fmt::Debug for DeviceSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceSink(cuda:{}, {} destinations)", self.gpu.ordinal(), self.dests.len())
    }
}

impl DeviceSink {
    /// A sink for up to `max_lanes` lanes. `ready`, if given, is an event every lane's stream waits for before its
    /// first copy (the allocation of the destinations).
    ///
    /// # Safety
    /// Each `(address, length)` in `dests` must be device memory of `gpu` that stays allocated, and is not used by
    /// anything else, until the load using this sink has returned.
    pub unsafe fn new(
        gpu: &Gpu,
        dests: Vec<(sys::CUdeviceptr, u64)>,
        max_lanes: usize,
        ready: Option<CudaEvent>,
    ) -> DeviceSink {
        DeviceSink {
            gpu: gpu.clone(),
            dests,
            lanes: (0..max_lanes.max(1)).map(|_| Mutex::new(None)).collect(),
            ready,
            spans: Mutex::new(Vec::new()),
        }
    }

    /// The longest time any lane spent from its first copy to the completion of its last (seconds).
    pub fn copy_span_secs(&self) -> f64 {
        self.spans.lock().map(|s| s.iter().copied().fold(0.0, f64::max)).unwrap_or(0.0)
    }

    fn lane(&self, lane: usize) -> Result<std::sync::MutexGuard<'_, Option<LaneCtx>>, SinkError> {
        let m = self
            .lanes
            .get(lane)
            .ok_or_else(|| format!("lane {lane} beyond the {} the device sink was made for", self.lanes.len()))?;
        Ok(m.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn err(&self, call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> SinkError {
        let device = self.gpu.ordinal();
        move |error| Box::new(CudaError::Driver { device, call, error }) as SinkError
    }
}

impl Sink for DeviceSink {
    type Pending = PendingCopy;

    fn asynchronous(&self) -> bool {
        true
    }

    fn begin_lane(&self, lane: usize) -> Result<(), SinkError> {
        self.gpu.bind()?;
        let stream = self.gpu.stream(lane)?;
        if let Some(ready) = &self.ready {
            stream.wait(ready).map_err(self.err("cuStreamWaitEvent"))?;
        }
        let start =
            stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(self.err("cuEventRecord"))?;
        *self.lane(lane)? = Some(LaneCtx { stream, spare: Vec::new(), start: Some(start) });
        Ok(())
    }

    fn deliver(&self, lane: usize, pieces: &[Piece], data: &[u8]) -> Result<Option<PendingCopy>, SinkError> {
        let mut guard = self.lane(lane)?;
        let ctx = guard.as_mut().ok_or("deliver before begin_lane")?;
        let stream = ctx.stream.cu_stream();
        for p in pieces {
            let &(dst, cap) = self.dests.get(p.dest as usize).ok_or_else(|| format!("no destination {}", p.dest))?;
            if p.at.checked_add(p.len).is_none_or(|e| e > data.len() as u64)
                || p.dest_offset.checked_add(p.len).is_none_or(|e| e > cap)
            {
                return Err(format!("piece {p:?} out of bounds (read {} bytes, destination {cap})", data.len()).into());
            }
            // SAFETY: both ranges were bounds-checked just above; the source is pinned staging memory that the engine
            // leaves untouched until this delivery's event completes (the `Sink` contract); the destination is device
            // memory kept alive for the whole load (`DeviceSink::new`'s contract).
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst + p.dest_offset,
                    data.as_ptr().add(p.at as usize).cast(),
                    p.len as usize,
                    stream,
                )
            }
            .result()
            .map_err(self.err("cuMemcpyHtoDAsync"))?;
        }
        let event = match ctx.spare.pop() {
            Some(e) => e,
            None => self.gpu.context().new_event(None).map_err(self.err("cuEventCreate"))?,
        };
        event.record(&ctx.stream).map_err(self.err("cuEventRecord"))?;
        Ok(Some(PendingCopy { lane, event }))
    }

    fn poll(&self, pending: &PendingCopy) -> Result<bool, SinkError> {
        pending.event.try_is_complete().map_err(self.err("cuEventQuery"))
    }

    fn wait(&self, pending: PendingCopy) -> Result<(), SinkError> {
        pending.event.synchronize().map_err(self.err("cuEventSynchronize"))?;
        if let Some(ctx) = self.lane(pending.lane)?.as_mut() {
            ctx.spare.push(pending.event);
        }
        Ok(())
    }

    fn end_lane(&self, lane: usize) -> Result<(), SinkError> {
        let mut guard = self.lane(lane)?;
        let Some(ctx) = guard.as_mut() else { return Ok(()) };
        let end =
            ctx.stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(self.err("cuEventRecord"))?;
        ctx.stream.synchronize().map_err(self.err("cuStreamSynchronize"))?;
        if let Some(start) = ctx.start.take() {
            let ms = start.elapsed_ms(&end).map_err(self.err("cuEventElapsedTime"))?;
            self.spans.lock().unwrap_or_else(|p| p.into_inner()).push(f64::from(ms) / 1e3);
        }
        Ok(())
    }
}
