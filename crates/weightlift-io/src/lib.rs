//! weightlift's storage engine (Linux, no CUDA): reads byte ranges of files into destinations through persistent
//! I/O lanes, each with its own ring and a few staging slots.
//!
//! - [`plan`]: ranges → aligned, coalesced, chunked reads, each mapped back to the destination ranges it feeds;
//! - [`file`]: inputs opened buffered and O_DIRECT, with the block size O_DIRECT needs;
//! - [`residency`]: which pages are in the page cache, so cached ranges are read buffered and cold ones by the
//!   cache policy (large buffered reads that keep the pages, or O_DIRECT);
//! - [`IoEngine`]: persistent lanes (io_uring with a fixed buffer, or `pread` where io_uring is unavailable)
//!   serving jobs; a [`Gate`] holds a streaming load's reads back until its consumer catches up;
//! - [`sink`]: where completed reads go (host memory here; the CUDA crate adds device memory);
//! - [`write`]: writes through staging, O_DIRECT where aligned; [`durable`]: atomic file replacement;
//! - [`fault`]: injected EIO, short reads and truncation for tests.
//! - cold ranges kept in the page cache are brought in through a huge-page mapping first (`cache_pages`), so the
//!   kernel keeps them in 2 MiB folios for the next reader.
//!
//! `unsafe` appears only where memory is handed to the kernel (io_uring submissions, buffer registration, reads
//! into slots and destinations), in the host copy of the sink, in `mincore`, in the aligned host allocation, and in mapping input files to advise the kernel on them.

mod buffer;
pub mod durable;
mod error;
pub mod fault;
pub mod fdtable;
pub mod file;
mod job;
mod lane;
mod load;
pub mod params;
pub mod plan;
mod pool;
mod populate;
mod pread;
pub mod residency;
pub mod sink;
pub mod staging;
mod uring;
mod worker;
pub mod write;

pub use buffer::{HOST_ALIGN, HostBuffer, HostCache};
pub use error::IoError;
pub use file::{OpenFile, open_all};
pub use job::{Admit, Gate};
pub use lane::LaneStats;
pub use load::{IoReport, LoadOptions, LoadRequest, Running, StreamOptions};
pub use params::{CachePages, CachePolicy, DirectMode, IoParams, ReadEngine, StagingPages, parse_bytes};
pub use plan::{Extent, Piece, ReadOp};
pub use pool::{IoEngine, ReadEngineUsed, StagingPrepared};
pub use sink::{BorrowedHostSink, HostSink, InPlace, Observed, Observer, Pending, Sink, SinkError};
pub use staging::{PinGuard, Pinner, Staging, StagingPool};
pub use uring::available as uring_available;
