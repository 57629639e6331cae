//! weightlift's object-storage sources: an object named by a URL (`s3://`, `gs://`, `az://`, `http(s)://`) read
//! by ranged GETs, through the `object_store` crate (its clients sign, authenticate and speak each store's API;
//! none of that is written here).
//!
//! - [`Object`]: one object, opened with a HEAD request that pins its length and ETag; every later ranged GET
//!   asks for that ETag (`If-Match`) and checks the one it gets back, so an object replaced while it is read is an
//!   error ([`RemoteError::Changed`]), never a mix of two versions. Reads retry transient failures (5xx,
//!   throttling, resets, timeouts, bodies cut short) with backoff, from where they stopped; what is left is a
//!   typed error naming the URL and the byte range.
//! - [`Object::read_at`] blocks the caller (header parsing); [`Object::start_read`] runs on the crate's runtime
//!   and calls back when the bytes have landed (the storage engine's lanes: the completion is their
//!   kernel-interface completion).
//! - [`Head`]: the first bytes of an object, fetched with one generous GET, so that a checkpoint's header is
//!   parsed without a second round trip in the usual case.
//!
//! The runtime and the clients (one per bucket or host, each with its connection pool) are process-wide: they
//! are created on first use and live as long as the process.
#![deny(missing_docs)]

mod client;
mod error;
mod object;

pub use client::{Config, DEFAULT_RETRIES, DEFAULT_TIMEOUT_SECS, config, configure, is_url, run_blocking};
pub use error::RemoteError;
pub use object::{Head, Object, Stats, upload, upload_with_progress};
