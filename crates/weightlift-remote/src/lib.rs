//! weightlift's object-storage sources: an object named by a URL (`s3://`, `gs://`, `az://`, `http(s)://`) read
//! by ranged GETs, through the `object_store` crate (its clients sign, authenticate and speak each store's API;
//! none of that is written here).
//!
//! - [`Location`]: a local path or an object's URL, told apart once where a path enters.
//! - [`Object`]: one object, opened by a ranged GET of its first bytes that pins its length and ETag; every later
//!   GET asks for that ETag (`If-Match`) and checks the one it gets back, so an object replaced while it is read is
//!   an error ([`RemoteError::Changed`]), never a mix of two versions. Requests retry transient failures (5xx,
//!   throttling, resets, timeouts, bodies cut short) with jittered backoff and the server's `Retry-After`, from
//!   where they stopped; what is left is a typed error naming the URL and the byte range.
//! - [`GetStream`]: one GET serving consecutive parts, each into a destination given when its reader has one (the
//!   storage engine's lanes: a part's completion is their kernel-interface completion); [`Object::read_at`] blocks
//!   the caller (header parsing).
//! - [`Head`]: the first bytes of an object, fetched by the GET that opens it, so that a checkpoint's header is
//!   parsed without a second round trip in the usual case.
//! - [`Throttle`]: what an origin (a bucket's endpoint, a host) said about its load, shared by every object read
//!   from it; the engine sizes its GETs in flight by it.
//!
//! The runtime and the clients (one connection pool per origin) are process-wide: they are created on first use and
//! live as long as the process.
#![deny(missing_docs)]

mod client;
mod error;
mod head;
mod location;
mod object;
mod stream;
mod upload;

pub use client::{Config, DEFAULT_RETRIES, DEFAULT_TIMEOUT_SECS, Throttle, config, configure, run_blocking};
pub use error::RemoteError;
pub use head::Head;
pub use location::{Location, ObjectUrl, is_url};
pub use object::{Object, Stats};
pub use stream::{GetStream, Stop};
pub use upload::{upload, upload_with_progress};
