//! weightlift: load checkpoint tensors (safetensors, GGUF, raw) from storage into host or GPU memory through
//! io_uring and a bounded staging ring.
//!
//! ```no_run
//! use weightlift::{Config, Device, Engine, LoadOpts};
//! let index = weightlift::format::open(&["model.safetensors".into()], None)?;
//! let mut engine = Engine::new(Config::from_env()?)?;
//! let loaded = engine.load(&index, Device::Cpu, &LoadOpts::default())?;
//! println!("{}", loaded.report.summary());
//! # Ok::<(), weightlift::Error>(())
//! ```

pub mod cufile_api;
mod device;
mod engine;
mod error;
mod gds;
mod nvme_sim;
mod placement;
pub mod probe;
mod report;
pub mod verify;

pub use device::Device;
pub use engine::{Config, DeviceTensor, Engine, LoadOpts, Loaded, RawDest, RawSrc, Tensor, TensorData};
pub use error::{Error, Result};
pub use report::Report;
pub use weightlift_format as format;
pub use weightlift_io as io;

/// Whether NVIDIA's cuFile library can be loaded here, where from, and what was tried.
pub fn cufile_status() -> serde_json::Value {
    let (loc, _) = weightlift_cuda::cufile::locate();
    let mut v =
        serde_json::json!({"found": loc.found.is_some(), "library": loc.found, "tried": loc.tried, "error": loc.error});
    if loc.found.is_some() {
        match weightlift_cuda::cufile::driver() {
            Ok(c) => {
                let (mode, detail) = match &c.mode {
                    weightlift_cuda::cufile::CufileMode::PeerToPeer(d) => ("peer-to-peer", d.clone()),
                    weightlift_cuda::cufile::CufileMode::Compat(d) => ("compat", d.clone()),
                };
                v["mode"] = serde_json::json!(format!("{mode}: {detail}"));
                v["version"] = serde_json::json!(c.version);
                v["nvfs_version"] = serde_json::json!(format!("{}.{}", c.props.nvfs_major, c.props.nvfs_minor));
                v["max_direct_io_size"] = serde_json::json!(c.props.max_direct_io_size);
                v["feature_flags"] = serde_json::json!(c.props.fflags);
            }
            Err(e) => v["mode"] = serde_json::json!(format!("driver not opened: {e}")),
        }
    }
    v
}
