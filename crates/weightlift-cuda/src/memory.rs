//! Device memory, page-locked host memory, and host memory registered with the driver, each freed or unregistered
//! when dropped.

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaStream, sys};

use crate::error::CudaError;
use crate::gpu::{ContextRestore, Gpu};

/// A device allocation: from the device's stream-ordered memory pool (`cuMemAllocAsync`, freed with
/// `cuMemFreeAsync`), or memory another allocator handed out ([`DeviceBuffer::external`]), released by dropping
/// what that allocator gave with it.
pub struct DeviceBuffer {
    gpu: Gpu,
    ptr: sys::CUdeviceptr,
    len: usize,
    /// Stream the free is ordered on; the legacy default stream unless the owner said otherwise.
    free_stream: sys::CUstream,
    /// What keeps external memory alive (its allocator's handle); `None` for the pool's memory.
    owner: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// Where a load's device memory comes from when not from the device's stream-ordered pool: a framework's own
/// allocator (PyTorch's caching allocator, say), which then accounts for, reuses and frees that memory itself.
pub trait DeviceAllocator: Send + Sync + fmt::Debug {
    /// `len` (> 0) bytes on `gpu`'s device, free to write by work ordered after what
    /// [`ready_stream`](Self::ready_stream) has queued when this returns.
    fn alloc(&self, gpu: &Gpu, len: usize) -> Result<DeviceBuffer, CudaError>;
    /// The stream the memory is handed out on (raw handle; null or [`LEGACY_STREAM`] for the legacy default stream).
    fn ready_stream(&self) -> sys::CUstream;
    /// A short name for reports ("torch", say).
    fn name(&self) -> String;
}

// SAFETY: the buffer is a device address plus a handle to its (thread-safe) context; nothing here is tied to the
// thread that allocated it.
unsafe impl Send for DeviceBuffer {}
// SAFETY: shared access only reads the address and length, or issues driver calls that are thread-safe.
unsafe impl Sync for DeviceBuffer {}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer(cuda:{}, {:#x}, {} bytes)", self.gpu.ordinal(), self.ptr, self.len)
    }
}

/// The legacy default stream: work on it waits for all blocking streams' earlier work (PyTorch's default stream is
/// this one), so a free ordered on it cannot overtake a kernel still reading the buffer there.
pub const LEGACY_STREAM: sys::CUstream = 0x1 as sys::CUstream;

impl DeviceBuffer {
    /// Allocates `len` bytes ordered on `stream` (zero bytes allocate nothing).
    pub fn alloc(gpu: &Gpu, len: usize, stream: &CudaStream) -> Result<DeviceBuffer, CudaError> {
        let dev = gpu.ordinal();
        let mut ptr: sys::CUdeviceptr = 0;
        if len > 0 {
            // SAFETY: the context is current (bound by the caller's `Gpu::bind`); the out-pointer is valid.
            let r = unsafe { sys::cuMemAllocAsync(&mut ptr, len, stream.cu_stream()) };
            if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                let (free, total) = gpu.mem_info().unwrap_or((0, 0));
                return Err(CudaError::OutOfMemory { device: dev, bytes: len as u64, free, total });
            }
            r.result().map_err(CudaError::driver(dev, "cuMemAllocAsync"))?;
        }
        Ok(DeviceBuffer { gpu: gpu.clone(), ptr, len, free_stream: LEGACY_STREAM, owner: None })
    }

    /// `len` bytes at `ptr` on `gpu`'s device that another allocator handed out; `owner` keeps them alive and
    /// releases them when dropped (this buffer never frees them itself).
    ///
    /// # Safety
    /// `ptr` must be device memory of `gpu`'s context, valid for `len` bytes for as long as `owner` lives.
    pub unsafe fn external(
        gpu: &Gpu,
        ptr: sys::CUdeviceptr,
        len: usize,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> DeviceBuffer {
        DeviceBuffer { gpu: gpu.clone(), ptr, len, free_stream: LEGACY_STREAM, owner: Some(owner) }
    }

    /// Whether another allocator handed this memory out ([`DeviceBuffer::external`]).
    pub fn is_external(&self) -> bool {
        self.owner.is_some()
    }

    /// The buffer's device address (0 for an empty buffer of the pool).
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The buffer's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the memory belongs to.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Orders the eventual free on `stream` (the owner's stream, where the last work reading the buffer runs)
    /// instead of the legacy default stream.
    ///
    /// # Safety
    /// `stream` must belong to this buffer's context and still exist when the buffer is dropped.
    pub unsafe fn set_free_stream(&mut self, stream: sys::CUstream) {
        self.free_stream = stream;
    }

    /// Copies `out.len()` bytes from `offset` to host memory (synchronously).
    pub fn read_back(&self, offset: usize, out: &mut [u8]) -> Result<(), CudaError> {
        let dev = self.gpu.ordinal();
        if offset.checked_add(out.len()).is_none_or(|end| end > self.len) {
            return Err(CudaError::OutOfBounds {
                device: dev,
                offset: offset as u64,
                len: out.len() as u64,
                size: self.len as u64,
            });
        }
        if out.is_empty() {
            return Ok(());
        }
        let _restore = crate::ContextRestore::save(); // the caller's thread keeps its device
        self.gpu.bind()?;
        // SAFETY: the device range was bounds-checked above and `out` is a writable host buffer of that length.
        unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr + offset as u64, out.len()) }
            .result()
            .map_err(CudaError::driver(dev, "cuMemcpyDtoH"))
    }
}

/// Frees memory from the device's stream-ordered pool (`cuMemAllocAsync`), ordered on `stream`.
///
/// # Safety
/// `ptr` must come from `cuMemAllocAsync` on `gpu`, be freed once, and `stream` must be a live stream of
/// `gpu`'s context (or [`LEGACY_STREAM`]).
pub unsafe fn free_device_memory(gpu: &Gpu, ptr: sys::CUdeviceptr, stream: sys::CUstream) -> Result<(), CudaError> {
    if ptr == 0 {
        return Ok(());
    }
    let _restore = crate::ContextRestore::save(); // the caller's thread keeps its device
    gpu.bind()?;
    // SAFETY: per this function's contract.
    unsafe { sys::cuMemFreeAsync(ptr, stream) }.result().map_err(CudaError::driver(gpu.ordinal(), "cuMemFreeAsync"))
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.owner.take().is_some() {
            return; // the owner, dropped here, gives the memory back to its allocator
        }
        let _restore = crate::ContextRestore::save(); // dropped on any thread (a tensor freed by its consumer)
        // SAFETY: this buffer owns `ptr`, allocated on `gpu`; `free_stream` is the legacy stream (after any work of
        // blocking streams that may still read the buffer) or one the owner promised would outlive the buffer.
        if let Err(e) = unsafe { free_device_memory(&self.gpu, self.ptr, self.free_stream) } {
            tracing::warn!("freeing device memory: {e}");
        }
    }
}

/// Page-locked host memory from `cuMemHostAlloc` (a pinned-host destination: later copies to a device run at DMA
/// speed).
pub struct PinnedBuffer {
    gpu: Gpu,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: owned exclusively, like Vec<u8>.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access hands out `&[u8]` only.
unsafe impl Sync for PinnedBuffer {}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PinnedBuffer({} bytes)", self.len)
    }
}

impl PinnedBuffer {
    /// Allocates `len` bytes of page-locked host memory with `cuMemHostAlloc` (`PORTABLE`: pinned for every context),
    /// freed when the buffer is dropped; zero bytes allocate nothing. Errors: [`CudaError::OutOfMemory`] when the
    /// driver has no page-locked memory left, [`CudaError::Driver`] for other failures.
    pub fn alloc(gpu: &Gpu, len: usize) -> Result<PinnedBuffer, CudaError> {
        let dev = gpu.ordinal();
        if len == 0 {
            return Ok(PinnedBuffer {
                gpu: gpu.clone(),
                ptr: std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
                len,
            });
        }
        let _restore = crate::ContextRestore::save(); // the caller's thread keeps its device
        gpu.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; PORTABLE makes the memory pinned for every context.
        let r = unsafe { sys::cuMemHostAlloc(&mut p, len, sys::CU_MEMHOSTALLOC_PORTABLE) };
        if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(CudaError::OutOfMemory { device: dev, bytes: len as u64, free: 0, total: 0 });
        }
        r.result().map_err(CudaError::driver(dev, "cuMemHostAlloc"))?;
        Ok(PinnedBuffer { gpu: gpu.clone(), ptr: p.cast(), len })
    }
}

impl std::ops::Deref for PinnedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes (or dangling with `len == 0`); cuMemHostAlloc memory is readable.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for PinnedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`, with exclusive access through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.len > 0 {
            let _restore = crate::ContextRestore::save();
            let _ = self.gpu.bind();
            // SAFETY: allocated by cuMemHostAlloc above and freed once.
            if let Err(e) = unsafe { sys::cuMemFreeHost(self.ptr.cast()) }.result() {
                tracing::warn!("freeing pinned host memory: {e}");
            }
        }
    }
}

/// Pins host memory with `cuMemHostRegister` for as long as the guard lives: the staging ring's slots, anonymous
/// `mmap` memory that io_uring also accepts as fixed buffers.
#[derive(Debug, Clone)]
pub struct CudaPinner {
    gpu: Gpu,
}

impl CudaPinner {
    /// A pinner registering memory through `gpu`'s context (the registration is `PORTABLE`: every context sees it).
    pub fn new(gpu: &Gpu) -> CudaPinner {
        CudaPinner { gpu: gpu.clone() }
    }
}

#[derive(Debug)]
struct Registration {
    gpu: Gpu,
    ptr: *mut u8,
}

// SAFETY: the registration is an address known to the driver; unregistering is thread-safe.
unsafe impl Send for Registration {}
// SAFETY: as above; no access to the memory happens through it.
unsafe impl Sync for Registration {}

impl weightlift_io::PinGuard for Registration {}

impl Drop for Registration {
    fn drop(&mut self) {
        let _restore = crate::ContextRestore::save();
        let _ = self.gpu.bind();
        // SAFETY: `ptr` was registered by `pin` below and is unregistered once, before the mapping goes away.
        if let Err(e) = unsafe { sys::cuMemHostUnregister(self.ptr.cast()) }.result() {
            tracing::warn!("unregistering staging memory: {e}");
        }
    }
}

impl weightlift_io::Pinner for CudaPinner {
    unsafe fn pin(
        &self,
        ptr: *mut u8,
        len: usize,
    ) -> Result<Box<dyn weightlift_io::PinGuard>, weightlift_io::SinkError> {
        self.gpu.bind()?;
        // SAFETY: per the trait's contract the range is a live mapping that outlives the guard; PORTABLE pins it
        // for every context.
        unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, sys::CU_MEMHOSTREGISTER_PORTABLE) }
            .result()
            .map_err(CudaError::driver(self.gpu.ordinal(), "cuMemHostRegister"))?;
        Ok(Box::new(Registration { gpu: self.gpu.clone(), ptr }))
    }
}

/// Copies `out.len()` bytes from device address `src` of `gpu` into host memory (synchronously).
///
/// # Safety
/// `src..src + out.len()` must be readable device memory of `gpu`.
pub unsafe fn copy_device_to_host(gpu: &Gpu, src: sys::CUdeviceptr, out: &mut [u8]) -> Result<(), CudaError> {
    if out.is_empty() {
        return Ok(());
    }
    let _restore = crate::ContextRestore::save(); // the caller's thread keeps its device
    gpu.bind()?;
    // SAFETY: per the contract the source is readable; `out` is a writable host buffer of the copied length.
    unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), src, out.len()) }
        .result()
        .map_err(CudaError::driver(gpu.ordinal(), "cuMemcpyDtoH"))
}

/// Copies `src` into device address `dst` of `gpu` (synchronously; fastest from pinned memory).
///
/// # Safety
/// `dst..dst + src.len()` must be writable device memory of `gpu`.
pub unsafe fn copy_host_to_device(gpu: &Gpu, dst: sys::CUdeviceptr, src: &[u8]) -> Result<(), CudaError> {
    if src.is_empty() {
        return Ok(());
    }
    let _restore = crate::ContextRestore::save(); // the caller's thread keeps its device
    gpu.bind()?;
    // SAFETY: per the contract the destination is writable; `src` is a readable host buffer of the copied length.
    unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) }
        .result()
        .map_err(CudaError::driver(gpu.ordinal(), "cuMemcpyHtoD"))
}

/// Makes the legacy default stream wait for the work queued so far on `stream` (so that a free ordered on the
/// legacy stream cannot overtake a consumer's kernels on a non-blocking stream). Best effort: errors are logged.
///
/// # Safety
/// `stream` must be a live stream of `gpu`'s context.
pub unsafe fn order_after_stream(gpu: &Gpu, stream: sys::CUstream) {
    let _restore = crate::ContextRestore::save(); // called on the consumer's thread
    if gpu.bind().is_err() {
        return;
    }
    // SAFETY: `stream` is live per the contract; the legacy stream always is.
    if let Err(e) = unsafe { stream_waits_for(gpu.ordinal(), LEGACY_STREAM, stream) } {
        tracing::warn!("ordering a free after the consumer stream: {e}");
    }
}

/// Makes `waiter` wait for the work queued on the raw stream `after` so far (memory another allocator handed out on
/// `after` is then free for `waiter`'s work to write).
///
/// # Safety
/// `after` must be a live stream of `gpu`'s context (or null / [`LEGACY_STREAM`]).
pub unsafe fn wait_for_stream(gpu: &Gpu, waiter: &CudaStream, after: sys::CUstream) -> Result<(), CudaError> {
    // SAFETY: `after` is live per the contract, `waiter` is borrowed for the call.
    unsafe { stream_waits_for(gpu.ordinal(), waiter.cu_stream(), after) }
}

/// Makes the raw stream `waiter` wait for the work queued on `after` so far, through an event made for it (the
/// driver destroys it once the wait is resolved).
///
/// # Safety
/// Both streams must be live streams of the current context of device `dev` (or null / [`LEGACY_STREAM`]).
unsafe fn stream_waits_for(dev: u32, waiter: sys::CUstream, after: sys::CUstream) -> Result<(), CudaError> {
    let mut event: sys::CUevent = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the event is destroyed below (the driver defers that until the wait is resolved).
    unsafe { sys::cuEventCreate(&mut event, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }
        .result()
        .map_err(CudaError::driver(dev, "cuEventCreate"))?;
    // SAFETY: `event` was just created in this context; both streams are live per the contract.
    let r = unsafe {
        sys::cuEventRecord(event, after).result().map_err(CudaError::driver(dev, "cuEventRecord")).and_then(|()| {
            sys::cuStreamWaitEvent(waiter, event, 0).result().map_err(CudaError::driver(dev, "cuStreamWaitEvent"))
        })
    };
    // SAFETY: created above and destroyed once.
    let _ = unsafe { sys::cuEventDestroy_v2(event) }.result();
    r
}

/// An event recorded on a caller's stream: it completes once the work queued there before it has finished. Lets
/// a host thread wait for a consumer's kernels (e.g. before reusing memory they read) without synchronising the
/// whole device.
pub struct StreamMark {
    gpu: Gpu,
    event: sys::CUevent,
}

// SAFETY: an event is a driver handle usable from any thread of the process.
unsafe impl Send for StreamMark {}
// SAFETY: shared access only issues thread-safe driver calls on the handle.
unsafe impl Sync for StreamMark {}

impl fmt::Debug for StreamMark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamMark(cuda:{})", self.gpu.ordinal())
    }
}

impl StreamMark {
    /// Records a mark on `stream`.
    ///
    /// # Safety
    /// `stream` must be a live stream of `gpu`'s context (or [`LEGACY_STREAM`]).
    pub unsafe fn record(gpu: &Gpu, stream: sys::CUstream) -> Result<StreamMark, CudaError> {
        let _restore = crate::ContextRestore::save(); // the caller's thread keeps its device
        gpu.bind()?;
        let mut event: sys::CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { sys::cuEventCreate(&mut event, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }
            .result()
            .map_err(CudaError::driver(gpu.ordinal(), "cuEventCreate"))?;
        let mark = StreamMark { gpu: gpu.clone(), event };
        // SAFETY: the event was just created in this context; the stream is live per the contract.
        unsafe { sys::cuEventRecord(event, stream) }
            .result()
            .map_err(CudaError::driver(gpu.ordinal(), "cuEventRecord"))?;
        Ok(mark)
    }

    /// Blocks until the work queued before the mark has finished.
    pub fn wait(&self) -> Result<(), CudaError> {
        let _restore = crate::ContextRestore::save(); // the caller's thread keeps its device
        self.gpu.bind()?;
        // SAFETY: `event` is live (destroyed only on drop).
        unsafe { sys::cuEventSynchronize(self.event) }
            .result()
            .map_err(CudaError::driver(self.gpu.ordinal(), "cuEventSynchronize"))
    }
}

impl Drop for StreamMark {
    fn drop(&mut self) {
        let _restore = crate::ContextRestore::save();
        let _ = self.gpu.bind();
        // SAFETY: created in `record`, destroyed once here (the driver defers it past pending waits).
        let _ = unsafe { sys::cuEventDestroy_v2(self.event) };
    }
}

/// Has `gpu`'s streams `0..streams` each carry one small host-to-device copy from pinned memory, and fills its event
/// pool up to `events`: what a program's first load onto the device would otherwise do for the first time in its
/// first copies (the driver sets a stream up at its first work, and each delivery takes an event).
/// `Engine::prepare` calls it after making the lanes' streams. Here, beside the buffers it allocates: the device
/// (`gpu.rs`) sits below its memory.
pub fn warm_streams(gpu: &Gpu, streams: usize, events: usize) -> Result<(), CudaError> {
    const WARM_BYTES: usize = 64 << 10;
    if streams == 0 {
        return Ok(());
    }
    let _restore = ContextRestore::save(); // the caller's thread keeps its device
    gpu.bind()?;
    let first = gpu.stream(0)?;
    let buf = DeviceBuffer::alloc(gpu, WARM_BYTES, &first)?;
    let host = PinnedBuffer::alloc(gpu, WARM_BYTES)?;
    let done = |s: &Arc<CudaStream>| s.synchronize().map_err(CudaError::driver(gpu.ordinal(), "cuStreamSynchronize"));
    done(&first)?; // the allocation, before the other streams copy into it
    let mut used = Vec::with_capacity(streams);
    for i in 0..streams {
        let s = gpu.stream(i)?;
        // SAFETY: `buf` holds WARM_BYTES of device memory allocated above (complete: stream 0 was synchronized),
        // `host` WARM_BYTES of pinned memory; both live until every stream is synchronized below.
        unsafe { sys::cuMemcpyHtoDAsync_v2(buf.device_ptr(), host.as_ptr().cast(), WARM_BYTES, s.cu_stream()) }
            .result()
            .map_err(CudaError::driver(gpu.ordinal(), "cuMemcpyHtoDAsync"))?;
        used.push(s);
    }
    for s in &used {
        done(s)?;
    }
    // Taking `events` empties the pool and makes the rest; all go back.
    let taken = (0..events).map(|_| gpu.take_event()).collect::<Result<Vec<_>, _>>()?;
    for e in taken {
        gpu.give_event(e);
    }
    Ok(())
}
