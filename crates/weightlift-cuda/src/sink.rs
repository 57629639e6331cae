//! The device sink: each completed read becomes `cuMemcpyHtoDAsync` copies from its staging slot (pinned) to the
//! destination ranges it feeds, on the lane's own stream, followed by an event; the slot is reused once the event
//! has completed. Reads wait for copies only when every slot of a lane is busy.
//!
//! Destinations may be allocated while the reads run ([`Targets::lazy`]): a delivery into a destination not yet
//! allocated waits for it on the CPU, and the lane's stream waits for the allocation's event before copying.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use cudarc::driver::{CudaEvent, CudaStream, sys};
use weightlift_io::{Pending, Piece, Sink, SinkError};

use crate::error::CudaError;
use crate::gpu::Gpu;

/// Where each destination of a device load lives: known up front, or published as it is allocated.
pub struct Targets {
    state: Mutex<Published>,
    ready: Condvar,
}

struct Published {
    /// Address, length and allocation generation of each destination, once published.
    dests: Vec<Option<(sys::CUdeviceptr, u64, usize)>>,
    /// `events[g - 1]` follows the allocations of generation `g` on the allocating stream.
    events: Vec<CudaEvent>,
    failed: Option<String>,
}

impl std::fmt::Debug for Targets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Targets({} destinations)", self.lock().dests.len())
    }
}

impl Targets {
    /// Destinations allocated already (and usable by any stream).
    ///
    /// # Safety
    /// Each `(address, length)` must be device memory that stays allocated, and is not used by anything else,
    /// until every load using these targets has returned.
    pub unsafe fn fixed(dests: Vec<(sys::CUdeviceptr, u64)>) -> Arc<Targets> {
        Arc::new(Targets {
            state: Mutex::new(Published {
                dests: dests.into_iter().map(|(p, l)| Some((p, l, 0))).collect(),
                events: Vec::new(),
                failed: None,
            }),
            ready: Condvar::new(),
        })
    }

    /// `n` destinations, published later with [`Targets::publish`].
    pub fn lazy(n: usize) -> Arc<Targets> {
        Arc::new(Targets {
            state: Mutex::new(Published { dests: vec![None; n], events: Vec::new(), failed: None }),
            ready: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Published> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes destinations `(id, address, length)` allocated on a stream; `after` is an event recorded on that
    /// stream after the allocations (copies wait for it).
    ///
    /// # Safety
    /// As for [`Targets::fixed`], for each published range.
    pub unsafe fn publish(&self, dests: &[(u32, sys::CUdeviceptr, u64)], after: Option<CudaEvent>) {
        let mut s = self.lock();
        let generation = match after {
            Some(e) => {
                s.events.push(e);
                s.events.len()
            }
            None => 0,
        };
        for &(id, ptr, len) in dests {
            if let Some(d) = s.dests.get_mut(id as usize) {
                *d = Some((ptr, len, generation));
            }
        }
        self.ready.notify_all();
    }

    /// Whether destination `id` has been published.
    pub fn is_published(&self, id: u32) -> bool {
        self.lock().dests.get(id as usize).is_some_and(Option::is_some)
    }

    /// No more destinations will be published: deliveries waiting for one fail with `why`.
    pub fn fail(&self, why: String) {
        self.lock().failed.get_or_insert(why);
        self.ready.notify_all();
    }

    /// Destination `id` (address, length, allocation generation), waiting until it is published.
    pub fn wait(&self, id: u32) -> Result<(sys::CUdeviceptr, u64, usize), SinkError> {
        let mut s = self.lock();
        loop {
            match s.dests.get(id as usize) {
                None => return Err(format!("no destination {id}").into()),
                Some(Some(d)) => return Ok(*d),
                Some(None) => {}
            }
            if let Some(why) = &s.failed {
                return Err(why.clone().into());
            }
            s = self.ready.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits until the allocations up to `generation` (as [`Targets::wait`] returns it) have been made on their
    /// stream, for a writer outside this process's streams, which cannot wait for the allocation events itself.
    pub fn synchronize(&self, generation: usize) -> Result<(), cudarc::driver::DriverError> {
        if generation == 0 {
            return Ok(());
        }
        // The event's handle, waited on outside the lock (publishing goes on meanwhile). Events are only ever
        // added while the targets live, so the handle stays valid.
        let event = match self.lock().events.get(generation - 1) {
            Some(e) => e.cu_event(),
            None => return Ok(()),
        };
        // SAFETY: a live event of these targets (see above).
        unsafe { sys::cuEventSynchronize(event) }.result()
    }

    /// Makes `stream` wait for the allocations up to `generation` (if it has not already).
    fn order(
        &self,
        stream: &CudaStream,
        waited: &mut usize,
        generation: usize,
    ) -> Result<(), cudarc::driver::DriverError> {
        if generation <= *waited {
            return Ok(());
        }
        let s = self.lock();
        if let Some(e) = s.events.get(generation - 1) {
            stream.wait(e)?;
        }
        *waited = generation;
        Ok(())
    }
}

struct LaneCtx {
    stream: Arc<CudaStream>,
    start: Option<CudaEvent>,
    /// Allocation generation this lane's stream already waits for.
    waited: usize,
}

/// A delivery whose copies may still be reading their slot: an event on the lane's stream, given back to the
/// device's event pool when done.
pub struct PendingCopy {
    gpu: Gpu,
    event: Option<CudaEvent>,
}

impl std::fmt::Debug for PendingCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingCopy(cuda:{})", self.gpu.ordinal())
    }
}

fn driver_err(device: u32, call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> SinkError {
    move |error| Box::new(CudaError::Driver { device, call, error }) as SinkError
}

impl Pending for PendingCopy {
    fn poll(&mut self) -> Result<bool, SinkError> {
        match &self.event {
            Some(e) => e.try_is_complete().map_err(driver_err(self.gpu.ordinal(), "cuEventQuery")),
            None => Ok(true),
        }
    }

    fn wait(mut self: Box<Self>) -> Result<(), SinkError> {
        if let Some(e) = &self.event {
            e.synchronize().map_err(driver_err(self.gpu.ordinal(), "cuEventSynchronize"))?;
        }
        if let Some(e) = self.event.take() {
            self.gpu.give_event(e);
        }
        Ok(())
    }
}

impl Drop for PendingCopy {
    fn drop(&mut self) {
        // Polled complete (or abandoned after an error): the event goes back to the pool only once it is known
        // complete, since a recycled event re-recorded early would make a waiter miss this copy.
        if let Some(e) = self.event.take()
            && e.try_is_complete().unwrap_or(false)
        {
            self.gpu.give_event(e);
        }
    }
}

/// Copies loaded bytes into device memory (destination id `i` is `targets`' destination `i`).
pub struct DeviceSink {
    gpu: Gpu,
    targets: Arc<Targets>,
    lanes: Vec<Mutex<Option<LaneCtx>>>,
    spans: Mutex<Vec<f64>>,
}

impl std::fmt::Debug for DeviceSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceSink(cuda:{}, {:?})", self.gpu.ordinal(), self.targets)
    }
}

impl DeviceSink {
    /// A sink for up to `max_lanes` lanes, into `targets` (whose safety contract covers the memory).
    pub fn new(gpu: &Gpu, targets: Arc<Targets>, max_lanes: usize) -> DeviceSink {
        DeviceSink {
            gpu: gpu.clone(),
            targets,
            lanes: (0..max_lanes.max(1)).map(|_| Mutex::new(None)).collect(),
            spans: Mutex::new(Vec::new()),
        }
    }

    /// Where this sink's destinations live (shared with whoever publishes them).
    pub fn targets(&self) -> &Arc<Targets> {
        &self.targets
    }

    /// The longest time any lane spent from its first copy to the completion of its last (seconds).
    pub fn copy_span_secs(&self) -> f64 {
        self.spans.lock().map(|s| s.iter().copied().fold(0.0, f64::max)).unwrap_or(0.0)
    }

    fn lane(&self, lane: usize) -> Result<MutexGuard<'_, Option<LaneCtx>>, SinkError> {
        let m = self
            .lanes
            .get(lane)
            .ok_or_else(|| format!("lane {lane} beyond the {} the device sink was made for", self.lanes.len()))?;
        Ok(m.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn err(&self, call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> SinkError {
        driver_err(self.gpu.ordinal(), call)
    }
}

impl Sink for DeviceSink {
    fn asynchronous(&self) -> bool {
        true
    }

    fn begin_lane(&self, lane: usize) -> Result<(), SinkError> {
        let t = std::time::Instant::now();
        self.gpu.bind()?;
        let stream = self.gpu.stream(lane)?;
        let start =
            stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(self.err("cuEventRecord"))?;
        *self.lane(lane)? = Some(LaneCtx { stream, start: Some(start), waited: 0 });
        tracing::debug!(lane, ms = t.elapsed().as_secs_f64() * 1e3, "lane begun");
        Ok(())
    }

    fn deliver(&self, lane: usize, pieces: &[Piece], data: &[u8]) -> Result<Option<Box<dyn Pending>>, SinkError> {
        let mut guard = self.lane(lane)?;
        let ctx = guard.as_mut().ok_or("deliver before begin_lane")?;
        let t = std::time::Instant::now();
        let mut waited = std::time::Duration::ZERO;
        for p in pieces {
            let w = std::time::Instant::now();
            let (dst, cap, generation) = self.targets.wait(p.dest)?;
            waited += w.elapsed();
            if p.at.checked_add(p.len).is_none_or(|e| e > data.len() as u64)
                || p.dest_offset.checked_add(p.len).is_none_or(|e| e > cap)
            {
                return Err(format!("piece {p:?} out of bounds (read {} bytes, destination {cap})", data.len()).into());
            }
            self.targets.order(&ctx.stream, &mut ctx.waited, generation).map_err(self.err("cuStreamWaitEvent"))?;
            // SAFETY: both ranges were bounds-checked just above; the source is pinned staging memory that the lane
            // leaves untouched until this delivery's event completes (the `Sink` contract); the destination is
            // device memory kept alive for the whole load (`Targets`' contract), and the stream waits for its
            // allocation.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst + p.dest_offset,
                    data.as_ptr().add(p.at as usize).cast(),
                    p.len as usize,
                    ctx.stream.cu_stream(),
                )
            }
            .result()
            .map_err(self.err("cuMemcpyHtoDAsync"))?;
        }
        let event = self.gpu.take_event().map_err(|e| Box::new(e) as SinkError)?;
        event.record(&ctx.stream).map_err(self.err("cuEventRecord"))?;
        let took = t.elapsed();
        if took > std::time::Duration::from_micros(300) {
            tracing::debug!(
                lane,
                dest = pieces.first().map(|p| p.dest),
                wait_ms = waited.as_secs_f64() * 1e3,
                issue_ms = (took - waited).as_secs_f64() * 1e3,
                "slow delivery"
            );
        }
        Ok(Some(Box::new(PendingCopy { gpu: self.gpu.clone(), event: Some(event) })))
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
        *guard = None;
        Ok(())
    }
}
