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
pub mod keep;
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
pub use engine::read::{ByteRange, Dests, ReadRequest, Sources};
pub use error::{Error, Result};
pub use layers::{LayerStreamer, LayerView, StreamerStats};
pub use packed::{Decoder, Pack, is_pack_file};
pub use path::{LoadOpts, PathKind};
pub use prepare::Prepared;
pub use probe::{CufileDriverReport, CufileMode, CufileReport, cufile_status};
pub use report::{CheckStats, NvmeStats, PackStats, PathUsed, Report, StreamStats};
pub use settings::{Backend, DeviceMemory, KeeperMode, KeeperSocket, Overrides, Setting, Settings, Source};
pub use stream::{Stream, StreamLimits};
pub use tensor::{DeviceTensor, Loaded, RawDest, RawSrc, Tensor, TensorData};
pub use weightlift_cuda as cuda;
pub use weightlift_format as format;
pub use weightlift_io as io;
pub use weightlift_pack as pack;
pub use weightlift_remote as remote;
