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

mod device;
mod engine;
mod error;
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
    serde_json::json!({"found": loc.found.is_some(), "library": loc.found, "tried": loc.tried, "error": loc.error})
}
