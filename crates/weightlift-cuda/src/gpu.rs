//! A CUDA device opened through its primary context (the one PyTorch and the runtime API use), with a pool of
//! streams handed to I/O lanes.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, sys};

use crate::driver;
use crate::error::CudaError;

/// Facts about a device.
#[derive(Clone, Debug)]
pub struct GpuInfo {
    /// The device's CUDA index (`cuda:N`).
    pub ordinal: u32,
    /// Its name, as the driver gives it ("NVIDIA H100 80GB HBM3", say).
    pub name: String,
    /// Its memory in bytes.
    pub total_bytes: u64,
    /// Its PCI address (`0000:3b:00.0`); empty where the driver would not say.
    pub pci_bus_id: String,
    /// Its compute capability, (major, minor): (9, 0) for an H100.
    pub compute_capability: (i32, i32),
    /// PCIe link as the kernel reports it (`/sys/bus/pci/devices/*/current_link_{speed,width}`), when readable.
    pub pcie_link: Option<String>,
    /// The CUDA version the driver supports, e.g. 13000 for 13.0 (`cuDriverGetVersion`).
    pub driver_version: i32,
}

/// An open device. Cloning shares it.
#[derive(Clone, Debug)]
pub struct Gpu {
    /// The last handle may go on any thread (a caller's, dropping an engine): its streams, events and context bind
    /// the context there as they go, so they go under a `ContextRestore`.
    pub(crate) inner: Arc<KeepsContext<GpuInner>>,
}

#[derive(Debug)]
pub(crate) struct GpuInner {
    pub ctx: Arc<CudaContext>,
    pub ordinal: u32,
    pub info: GpuInfo,
    streams: Mutex<Vec<Arc<CudaStream>>>,
    /// Completed events kept for the next deliveries (creating one per copy would cost a driver call each).
    events: Mutex<Vec<CudaEvent>>,
}

impl Gpu {
    /// Opens device `ordinal`: retains its primary context and makes it current on this thread.
    pub fn open(ordinal: u32) -> Result<Gpu, CudaError> {
        let drv = driver::driver().map_err(CudaError::Unavailable)?;
        if ordinal >= drv.devices {
            return Err(CudaError::NoSuchDevice { ordinal, count: drv.devices });
        }
        let _restore = ContextRestore::save(); // retaining the primary context binds it to this thread
        let t = std::time::Instant::now();
        let ctx = CudaContext::new(ordinal as usize).map_err(CudaError::driver(ordinal, "cuDevicePrimaryCtxRetain"))?;
        let retained = t.elapsed();
        // weightlift orders its work with explicit events; cudarc's automatic tracking would add an event per
        // allocation and synchronise the context when the first stream is made.
        // SAFETY: no cudarc-managed allocation of this context relies on event tracking (weightlift allocates
        // device memory itself).
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().map_err(CudaError::driver(ordinal, "cuDeviceGetName"))?;
        let total_bytes = ctx.total_mem().map_err(CudaError::driver(ordinal, "cuDeviceTotalMem"))? as u64;
        let compute_capability =
            ctx.compute_capability().map_err(CudaError::driver(ordinal, "cuDeviceGetAttribute"))?;
        let pci_bus_id = pci_bus_id(ctx.cu_device()).unwrap_or_default();
        let pcie_link = pcie_link(&pci_bus_id);
        let info = GpuInfo {
            ordinal,
            name,
            total_bytes,
            pci_bus_id,
            compute_capability,
            pcie_link,
            driver_version: drv.version,
        };
        tracing::debug!(
            device = ordinal,
            retain_secs = retained.as_secs_f64(),
            secs = t.elapsed().as_secs_f64(),
            "device opened"
        );
        Ok(Gpu {
            inner: Arc::new(KeepsContext::new(GpuInner {
                ctx,
                ordinal,
                info,
                streams: Mutex::new(Vec::new()),
                events: Mutex::new(Vec::new()),
            })),
        })
    }

    /// Facts about the device, gathered when it was opened.
    pub fn info(&self) -> &GpuInfo {
        &self.inner.info
    }

    /// The device's CUDA index.
    pub fn ordinal(&self) -> u32 {
        self.inner.ordinal
    }

    /// Makes this device's primary context current on the calling thread. Where that thread is not weightlift's own (a
    /// caller's, freeing a buffer or probing devices), hold a [`ContextRestore`] around it.
    pub fn bind(&self) -> Result<(), CudaError> {
        self.inner.ctx.bind_to_thread().map_err(CudaError::driver(self.inner.ordinal, "cuCtxSetCurrent"))
    }

    /// Sets how much freed memory the device's default stream-ordered pool (where weightlift's device memory comes
    /// from) keeps for later allocations instead of returning it to the system at the next synchronisation. The
    /// pool is the process's: this applies to every user of it in the process.
    pub fn keep_freed_memory(&self, bytes: u64) -> Result<(), CudaError> {
        let pool = self.default_pool()?;
        let mut value = bytes;
        // SAFETY: `pool` is the device's default pool; the attribute takes a pointer to a u64.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut value as *mut u64).cast(),
            )
        }
        .result()
        .map_err(CudaError::driver(self.inner.ordinal, "cuMemPoolSetAttribute"))
    }

    /// How much freed memory the device's default pool keeps (its release threshold; see
    /// [`Gpu::keep_freed_memory`]).
    pub fn freed_memory_kept(&self) -> Result<u64, CudaError> {
        let pool = self.default_pool()?;
        let mut value = 0u64;
        // SAFETY: `pool` is the device's default pool; the attribute is written to a u64.
        unsafe {
            sys::cuMemPoolGetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut value as *mut u64).cast(),
            )
        }
        .result()
        .map_err(CudaError::driver(self.inner.ordinal, "cuMemPoolGetAttribute"))?;
        Ok(value)
    }

    /// Returns the freed memory the device's default pool keeps to the system (see [`Gpu::keep_freed_memory`]).
    pub fn trim_freed_memory(&self) -> Result<(), CudaError> {
        let pool = self.default_pool()?;
        // SAFETY: `pool` is the device's default pool.
        unsafe { sys::cuMemPoolTrimTo(pool, 0) }
            .result()
            .map_err(CudaError::driver(self.inner.ordinal, "cuMemPoolTrimTo"))
    }

    fn default_pool(&self) -> Result<sys::CUmemoryPool, CudaError> {
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: the out-pointer is valid; the device handle is this context's.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, self.inner.ctx.cu_device()) }
            .result()
            .map_err(CudaError::driver(self.inner.ordinal, "cuDeviceGetDefaultMemPool"))?;
        Ok(pool)
    }

    /// Stream number `i` of this device's pool (created on first use, kept for later loads).
    pub fn stream(&self, i: usize) -> Result<Arc<CudaStream>, CudaError> {
        let mut streams = self.inner.streams.lock().unwrap_or_else(|p| p.into_inner());
        if streams.len() <= i {
            let _restore = ContextRestore::save(); // making a stream binds its context on this thread
            let t = std::time::Instant::now();
            let had = streams.len();
            while streams.len() <= i {
                let s = self.inner.ctx.new_stream().map_err(CudaError::driver(self.inner.ordinal, "cuStreamCreate"))?;
                streams.push(s);
            }
            tracing::debug!(made = streams.len() - had, secs = t.elapsed().as_secs_f64(), "streams made");
        }
        Ok(streams[i].clone())
    }

    /// An event (without timing) from the pool, or a new one.
    pub fn take_event(&self) -> Result<CudaEvent, CudaError> {
        if let Some(e) = self.inner.events.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(e);
        }
        let _restore = ContextRestore::save(); // making an event binds its context on this thread
        self.inner
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(CudaError::driver(self.inner.ordinal, "cuEventCreate"))
    }

    /// Returns a completed event to the pool.
    pub fn give_event(&self, e: CudaEvent) {
        let mut pool = self.inner.events.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < 1024 {
            pool.push(e);
        }
    }

    /// Free and total device memory.
    pub fn mem_info(&self) -> Result<(u64, u64), CudaError> {
        self.bind()?;
        let (free, total) =
            self.inner.ctx.mem_get_info().map_err(CudaError::driver(self.inner.ordinal, "cuMemGetInfo"))?;
        Ok((free as u64, total as u64))
    }

    /// Waits for all work on this device's context.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.bind()?;
        self.inner.ctx.synchronize().map_err(CudaError::driver(self.inner.ordinal, "cuCtxSynchronize"))
    }

    /// The device's primary context, as cudarc holds it (for cudarc's safe API: streams, modules, memory).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }
}

fn pci_bus_id(dev: sys::CUdevice) -> Option<String> {
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: the buffer holds 32 bytes and its length is passed; the driver writes a NUL-terminated string.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) }.result().ok()?;
    // SAFETY: the driver NUL-terminated the string inside the buffer.
    let id = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(id.to_string_lossy().to_lowercase())
}

fn pcie_link(bus_id: &str) -> Option<String> {
    let dir = std::path::Path::new("/sys/bus/pci/devices").join(bus_id);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok().map(|s| s.trim().to_string());
    let (speed, width) = (read("current_link_speed")?, read("current_link_width")?);
    let max = match (read("max_link_speed"), read("max_link_width")) {
        (Some(s), Some(w)) => format!(" (max {s} x{w})"),
        _ => String::new(),
    };
    Some(format!("{speed} x{width}{max}"))
}

/// Whether CUDA is usable here, and if not why; never panics.
pub fn available() -> Result<crate::driver::DriverInfo, String> {
    driver::driver()
}

/// Streams kept for the whole process, one per device (see [`process_stream`]).
static PROCESS_STREAMS: Mutex<Vec<(u32, Arc<CudaStream>)>> = Mutex::new(Vec::new());

/// A non-blocking stream of device `ordinal`'s primary context, made on first use and never destroyed, so that a
/// handle to it given to another library (PyTorch's `ExternalStream`) stays valid for the rest of the process
/// (unless something resets the primary context; a child made by `fork` cannot use CUDA at all). The calling
/// thread keeps its current context.
pub fn process_stream(ordinal: u32) -> Result<sys::CUstream, CudaError> {
    let mut streams = PROCESS_STREAMS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, s)) = streams.iter().find(|(n, _)| *n == ordinal) {
        return Ok(s.cu_stream());
    }
    let gpu = Gpu::open(ordinal)?;
    let _restore = ContextRestore::save(); // the caller's thread keeps its device
    gpu.bind()?;
    let s = gpu.inner.ctx.new_stream().map_err(CudaError::driver(ordinal, "cuStreamCreate"))?;
    let handle = s.cu_stream();
    streams.push((ordinal, s));
    Ok(handle)
}

/// The calling thread's current CUDA context when made, put back when dropped. weightlift binds its devices'
/// contexts on whatever thread calls it, and a CUDA runtime (torch's `current_device`, say) takes the thread's
/// device from that context: without this, freeing a `cuda:1` tensor or probing the devices on a caller's thread
/// would leave that thread on another device than it chose.
#[derive(Debug)]
pub struct ContextRestore(Option<sys::CUcontext>);

/// The calling thread's current context (null: none), once the driver is loaded.
fn current() -> Option<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer; callers load the driver library first.
    unsafe { sys::cuCtxGetCurrent(&mut ctx) }.result().ok().map(|()| ctx)
}

impl ContextRestore {
    /// Records the current context. Before weightlift has initialised the driver in this process it starts nothing
    /// (a host load must not start CUDA), but where another library (PyTorch's runtime) has loaded the driver and
    /// made a context current on this thread, that context is recorded: weightlift's first driver call may then
    /// bind its own devices' contexts on this thread, and the caller's device must come back (a
    /// `torch.cuda.set_device(0)` then `weightlift.probe()` left torch on the last GPU probed).
    pub fn save() -> ContextRestore {
        if crate::driver::initialised() {
            ContextRestore(current())
        } else {
            ContextRestore(current_if_loaded_by_another())
        }
    }
}

/// The calling thread's current context where another library of this process has loaded and initialised the
/// driver, without loading it or initialising it; `None` otherwise. Calls the driver's `cuCtxGetCurrent` through the
/// library's own handle: cudarc's loader is not touched before weightlift probes the driver (`driver::driver`),
/// which checks its symbols first.
fn current_if_loaded_by_another() -> Option<sys::CUcontext> {
    let get = loaded_get_current()?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer; before cuInit the call returns an error and writes nothing.
    let status = unsafe { get(&mut ctx) };
    (status == sys::CUresult::CUDA_SUCCESS).then_some(ctx)
}

type GetCurrent = unsafe extern "C" fn(*mut sys::CUcontext) -> sys::CUresult;

/// `cuCtxGetCurrent` of a driver library already loaded in this process, if one is. Cheap on every call, since
/// every native entry point asks ([`ContextRestore::save`]): found once and kept (the library stays loaded: the
/// handle that found it is never closed); while none is loaded, looked for again only after the process loaded
/// another library (`dlopen` with `RTLD_NOLOAD` of a name not loaded searches the library path: 0.2 ms).
fn loaded_get_current() -> Option<GetCurrent> {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static FOUND: OnceLock<GetCurrent> = OnceLock::new();
    static LOOKED_AT: AtomicU64 = AtomicU64::new(u64::MAX);
    if let Some(get) = FOUND.get() {
        return Some(*get);
    }
    let loads = libraries_loaded_ever();
    if loads.is_some() && loads == Some(LOOKED_AT.load(Ordering::Relaxed)) {
        return None; // no library came since the last look, which found no driver
    }
    let found = ["libcuda.so.1", "libcuda.so"].into_iter().find_map(|name| {
        // SAFETY: RTLD_NOLOAD only returns a library already loaded in this process; nothing is initialised.
        let lib =
            unsafe { libloading::os::unix::Library::open(Some(name), libc::RTLD_NOW | libc::RTLD_NOLOAD) }.ok()?;
        // SAFETY: cuCtxGetCurrent has this C signature in every driver release.
        let get = *unsafe { lib.get::<GetCurrent>(b"cuCtxGetCurrent\0") }.ok()?;
        std::mem::forget(lib); // the function pointer is kept: the library must stay loaded
        Some(get)
    });
    match found {
        Some(get) => Some(*FOUND.get_or_init(|| get)),
        None => {
            LOOKED_AT.store(loads.unwrap_or(u64::MAX), Ordering::Relaxed);
            None
        }
    }
}

/// How many libraries this process has loaded so far (glibc's `dlpi_adds`, which only grows), without opening
/// anything; `None` where the C library does not say.
fn libraries_loaded_ever() -> Option<u64> {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, size: usize, out: *mut libc::c_void) -> libc::c_int {
        let has_adds = size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_adds) + std::mem::size_of::<u64>();
        if has_adds {
            // SAFETY: the loader passes a valid `info` of `size` bytes, which cover `dlpi_adds`; `out` is the
            // `Option<u64>` below.
            unsafe { *out.cast::<Option<u64>>() = Some((*info).dlpi_adds) };
        }
        1 // the first object tells: stop
    }
    let mut adds: Option<u64> = None;
    // SAFETY: `first` matches the callback's C signature and writes only through the pointer to `adds`, which
    // outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut adds as *mut Option<u64>).cast()) };
    adds
}

/// A value dropped under a [`ContextRestore`]: for what a caller's thread may drop (a Python object freed by the
/// garbage collector, a handle a C caller closes) whose drop can bind a CUDA context there (cudarc's contexts,
/// streams, events and modules bind theirs when dropped).
pub(crate) struct KeepsContext<T>(std::mem::ManuallyDrop<T>);

impl<T> KeepsContext<T> {
    pub(crate) fn new(value: T) -> KeepsContext<T> {
        KeepsContext(std::mem::ManuallyDrop::new(value))
    }
}

impl<T> std::ops::Deref for KeepsContext<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for KeepsContext<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for KeepsContext<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<T> Drop for KeepsContext<T> {
    fn drop(&mut self) {
        let _restore = ContextRestore::save();
        // SAFETY: the value is dropped once, here, and `self` is never used again.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.0) };
    }
}

/// The calling thread's current CUDA context as an address (0: none), or None without a driver.
pub fn current_context() -> Option<usize> {
    crate::driver::driver().ok()?; // probes: for tests and callers who ask
    current().map(|c| c as usize)
}

impl Drop for ContextRestore {
    fn drop(&mut self) {
        let Some(saved) = self.0 else { return };
        // Without weightlift's own driver start nothing of weightlift bound a context here.
        if !crate::driver::initialised() {
            return;
        }
        if current().is_some_and(|now| now != saved) {
            // SAFETY: `saved` was current on this thread when the call began (or null: none was). Should its owner
            // have destroyed it on another thread meanwhile, the thread is left with that stale handle, as it would
            // have been without weightlift.
            let _ = unsafe { sys::cuCtxSetCurrent(saved) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every native entry point of the Python module and the C API takes a `ContextRestore`: where no driver is
    /// loaded (this CPU machine, a host-only process), taking one must cost next to nothing. Looking for the driver
    /// with `dlopen(RTLD_NOLOAD)` each time cost 0.2 ms (a search of the library path).
    #[test]
    fn a_context_restore_without_a_driver_is_cheap_and_starts_nothing() {
        if crate::driver::initialised() || loaded_get_current().is_some() {
            eprintln!("skipped: a CUDA driver is loaded in this process");
            return;
        }
        assert!(libraries_loaded_ever().is_some_and(|n| n > 0), "glibc counts the libraries it loaded");
        let t = std::time::Instant::now();
        for _ in 0..10_000 {
            drop(ContextRestore::save());
        }
        let took = t.elapsed();
        assert!(took < std::time::Duration::from_millis(500), "10,000 saves took {took:?}");
        assert!(!crate::driver::initialised(), "a save must not start the driver");
    }
}
