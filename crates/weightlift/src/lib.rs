//! weightlift: load checkpoint tensors (safetensors, GGUF, raw) from storage into host or GPU memory through
//! persistent io_uring lanes, a bounded ring of pinned staging slots and asynchronous copies.
//!
//! ```no_run
//! use weightlift::{Device, Engine, LoadOpts, Settings};
//! let index = weightlift::format::open(&["model.safetensors".into()], None)?;
//! let engine = Engine::new(Settings::from_env()?)?;
//! let loaded = engine.load(&index, Device::Cpu, &LoadOpts::default())?;
//! println!("{}", loaded.report.summary());
//! # Ok::<(), weightlift::Error>(())
//! ```
//!
//! The layers, from the bottom: [`format`](mod@format) (what the bytes mean), [`io`] (plans, lanes, sinks; no CUDA),
//! [`cuda`] (devices, pinned memory, the device sink, cuFile), then this crate: settings, the GPU data paths
//! ([`path`]), the engine, streaming loads and reports. `docs/architecture.md` draws it.

#![deny(missing_docs)]

pub mod block;
#[cfg(feature = "candle")]
pub mod candle;
pub mod checked;
pub mod cufile_api;
mod device;
#[cfg(feature = "dlpack")]
pub mod dlpack;
mod engine;
mod error;
mod files;
pub mod layers;
mod opts;
pub mod packed;
pub mod path;
mod placement;
pub mod prepare;
pub mod probe;
mod report;
pub mod settings;
mod stream;
mod tensor;
pub mod verify;

pub use block::{BlockDevice, LbaRange, RegionTable};
#[cfg(feature = "candle")]
pub use candle_core;
pub use checked::{Checks, ChunkSum};
pub use device::Device;
#[cfg(feature = "dlpack")]
pub use dlpark;
pub use engine::Engine;
pub use error::{Error, Result};
pub use layers::{LayerStreamer, LayerView, StreamerStats};
pub use packed::{Decoder, Pack, is_pack_file};
pub use path::{LoadOpts, PathKind};
pub use prepare::Prepared;
pub use report::{CheckStats, NvmeStats, PackStats, PathUsed, Report, StreamStats};
pub use settings::{Backend, DeviceMemory, Overrides, Setting, Settings, Source};
pub use stream::{Stream, StreamLimits};
pub use tensor::{DeviceTensor, Loaded, RawDest, RawSrc, Tensor, TensorData};
pub use weightlift_cuda as cuda;
pub use weightlift_format as format;
pub use weightlift_io as io;
pub use weightlift_remote as remote;

/// Whether NVIDIA's cuFile library can be loaded here, where from, and what was tried (this loads it).
pub fn cufile_status(settings: &Settings) -> serde_json::Value {
    let (loc, _) = weightlift_cuda::cufile::locate(settings.cufile_lib.value.as_deref());
    let mut v =
        serde_json::json!({"found": loc.found.is_some(), "library": loc.found, "tried": loc.tried, "error": loc.error});
    if loc.found.is_some() {
        match weightlift_cuda::cufile::driver(settings.cufile_lib.value.as_deref()) {
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
