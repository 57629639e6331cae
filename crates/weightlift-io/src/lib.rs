//! weightlift's storage engine (Linux, no CUDA): reads byte ranges of files into destinations through a bounded
//! ring of staging slots.
//!
//! - [`plan`]: ranges → aligned, coalesced, chunked reads, each mapped back to the destination ranges it feeds;
//! - [`file`]: inputs opened buffered and O_DIRECT, with the block size O_DIRECT needs;
//! - [`residency`]: which pages are in the page cache, so cached ranges are read buffered and cold ones direct;
//! - io_uring lanes with fixed files and fixed buffers, or `pread` lanes where io_uring is unavailable;
//! - [`sink`]: where completed reads go (host memory here; the CUDA crate adds device memory);
//! - [`fault`]: injected EIO, short reads and truncation for tests.
//!
//! `unsafe` appears only where memory is handed to the kernel (io_uring submissions, buffer registration), in the
//! host copy of the sink, in `mincore`, and in the aligned host allocation.

mod buffer;
pub mod config;
pub mod durable;
mod engine;
mod error;
pub mod fault;
pub mod file;
mod lane;
pub mod plan;
mod pread;
pub mod residency;
pub mod sink;
pub mod staging;
mod uring;
pub mod write;

pub use buffer::{HOST_ALIGN, HostBuffer, host_cache_bytes, host_cache_limit};
pub use config::{Backend, DirectMode, IoConfig, Setting, Source};
pub use engine::{IoReport, LoadOptions, LoadRequest, load};
pub use error::IoError;
pub use file::{OpenFile, open_all};
pub use lane::LaneStats;
pub use plan::{Extent, Piece};
pub use sink::{HostSink, Sink, SinkError};
pub use staging::{PinGuard, Pinner, Staging, StagingPool};
pub use uring::available as uring_available;
