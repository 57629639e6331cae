//! Finding the CUDA driver at run time without ever panicking: cudarc resolves each symbol on first use and panics
//! if the library or the symbol is missing, so every symbol weightlift calls is checked here first, once.

use std::sync::OnceLock;

use cudarc::driver::{result, sys};

/// Driver symbols weightlift calls directly or through cudarc's safe layer.
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceGetPCIBusId",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuEventElapsedTime_v2",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemGetInfo_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoH_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemsetD8Async",
    "cuDeviceGetDefaultMemPool",
    "cuMemPoolSetAttribute",
    "cuMemPoolGetAttribute",
    "cuMemPoolTrimTo",
];

/// What the driver reports about itself.
#[derive(Clone, Debug)]
pub struct DriverInfo {
    /// CUDA version the driver supports, e.g. 13000 for 13.0.
    pub version: i32,
    /// CUDA devices the driver sees (`cuDeviceGetCount`).
    pub devices: u32,
}

static PROBE: OnceLock<Result<DriverInfo, String>> = OnceLock::new();

/// The driver, initialised, or the reason it cannot be used. Probed once per process.
pub fn driver() -> Result<DriverInfo, String> {
    PROBE
        .get_or_init(|| {
            let t = std::time::Instant::now();
            let probed = probe();
            tracing::debug!(secs = t.elapsed().as_secs_f64(), ok = probed.is_ok(), "CUDA driver probed");
            probed
        })
        .clone()
}

/// Whether the driver was probed and initialised in this process already (never probes: host-only work must not
/// start CUDA, whose state a forked child cannot use).
pub fn initialised() -> bool {
    PROBE.get().is_some_and(|p| p.is_ok())
}

fn probe() -> Result<DriverInfo, String> {
    let missing = missing_driver_symbols(SYMBOLS)?;
    if !missing.is_empty() {
        return Err(format!("the NVIDIA driver is too old: it lacks {}", missing.join(", ")));
    }
    // A panic inside cudarc (an unexpected missing symbol) becomes an error, never a crash.
    std::panic::catch_unwind(|| -> Result<DriverInfo, String> {
        result::init().map_err(|e| format!("cuInit failed: {e}"))?;
        let mut version = 0;
        // SAFETY: the out-pointer is a valid i32.
        unsafe { sys::cuDriverGetVersion(&mut version) }.result().map_err(|e| format!("cuDriverGetVersion: {e}"))?;
        let devices = result::device::get_count().map_err(|e| format!("cuDeviceGetCount: {e}"))?;
        if devices <= 0 {
            return Err("the driver reports no CUDA device".into());
        }
        Ok(DriverInfo { version, devices: devices as u32 })
    })
    .unwrap_or_else(|_| Err("the CUDA driver could not be initialised (panic while loading it)".into()))
}

/// Those of the driver symbols `names` the NVIDIA driver library lacks, or why there is no driver library. Calls
/// none of them.
pub fn missing_driver_symbols<'a>(names: &[&'a str]) -> Result<Vec<&'a str>, String> {
    static DRIVER: OnceLock<Option<libloading::Library>> = OnceLock::new();
    let lib = crate::library::cudarc_library(&DRIVER, "cuda")
        .ok_or_else(|| String::from("no NVIDIA driver library (libcuda.so) found"))?;
    Ok(crate::library::missing_symbols(lib, names))
}
