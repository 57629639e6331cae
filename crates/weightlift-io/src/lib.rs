//! weightlift's storage engine (Linux, no CUDA): reads byte ranges of files into destinations through persistent
//! I/O lanes, each with its own ring and a few staging slots. The data path, top to bottom, one file each:
//!
//! - `load`: one load — probe residency, decide what the page cache keeps, [`plan`], size the staging, submit a
//!   job, report;
//! - [`plan`]: ranges → aligned, coalesced, chunked reads, each mapped back to the destination ranges it feeds;
//! - `engine`: [`IoEngine`], the persistent lanes and the jobs queued for them (`queue`: what the lanes share
//!   with it); `job`: one load being served; a [`Gate`] holds a streaming load's reads back until its consumer
//!   catches up;
//! - `lane`: one lane's loop (slots, reads in flight, deliveries); `reading`: the one place a read's result is
//!   interpreted (retry, short read, end of file); `submit`: what a lane hands its kernel interface, implemented by
//!   `uring` (io_uring with a fixed buffer) and `pread` (blocking reads where io_uring is unavailable) — the two
//!   backends are leaves;
//! - [`pacer`]: how many GETs a load of objects keeps in flight (found at run time, within the staging bound);
//! - [`staging`]: the lanes' pinned slots; [`sink`]: where completed reads go (host memory here; the CUDA crate
//!   adds device memory); [`file`](mod@file): inputs opened buffered and O_DIRECT; [`residency`]: which pages are in the page
//!   cache; `populate`: cold ranges kept in the page cache brought in through a huge-page mapping first
//!   (`cache_pages`), so the kernel keeps them in 2 MiB folios for the next reader;
//! - [`write`](mod@write): writes through staging, O_DIRECT where aligned; [`durable`]: atomic file replacement;
//! - [`fault`]: injected EIO, short reads and truncation for tests.
//!
//! `unsafe` appears only where memory is handed to the kernel (io_uring submissions, buffer registration, reads
//! into slots and destinations), in the host copy of the sink, in `mincore`, in the aligned host allocation, and in
//! mapping input files to advise the kernel on them.
#![deny(missing_docs)]

mod buffer;
pub mod durable;
mod engine;
mod error;
pub mod fault;
pub mod fdtable;
pub mod file;
mod job;
mod lane;
mod load;
pub mod object_cache;
mod objects;
pub mod pacer;
pub mod params;
pub mod plan;
mod populate;
mod pread;
mod queue;
mod reading;
pub mod residency;
pub mod sink;
pub mod staging;
mod submit;
mod uring;
pub mod write;

pub use buffer::{HOST_ALIGN, HostBuffer, HostCache};
pub use engine::{IoEngine, ReadEngineUsed, StagingPrepared};
pub use error::IoError;
pub use file::{LocalCopy, OpenFile, open_all};
pub use job::{Admit, Gate};
pub use load::{IoReport, LoadOptions, LoadRequest, Running, StreamOptions};
pub use pacer::{GetsReport, Pacer, Phase, Round};
pub use params::{CachePages, CachePolicy, DirectMode, HostPages, IoParams, ReadEngine, StagingPages, parse_bytes};
pub use plan::{Extent, Piece, ReadOp};
pub use reading::LaneStats;
pub use sink::{BorrowedHostSink, HostSink, InPlace, Observed, Observer, Pending, Sink, SinkError};
pub use staging::{PinGuard, Pinner, Staging, StagingPool};
pub use uring::available as uring_available;
