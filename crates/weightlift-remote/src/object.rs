//! One object: opened by a ranged GET of its first bytes, which pins its length and ETag; what every request of it
//! shares (the client, the counters, how a failure is classified, when a failed request is sent again).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use object_store::{GetOptions, GetRange, GetResult};

use crate::client::{Client, Throttle, config, runtime, store_for};
use crate::error::RemoteError;
use crate::location::ObjectUrl;

/// What an object's requests did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// HTTP requests sent (GETs and HEADs, retries included).
    pub requests: u64,
    /// HEAD requests among them.
    pub heads: u64,
    /// Body bytes received into their destinations.
    pub bytes: u64,
    /// Requests sent again after a transient failure.
    pub retries: u64,
    /// Answers that asked the client to slow down (503, 429).
    pub throttled: u64,
    /// Time spent in requests, summed over the requests in flight (so it may exceed the wall time).
    pub waiting: Duration,
    /// Time from sending a request to its answer's headers, summed over the answers counted in `answers`.
    pub first_byte: Duration,
    /// Answers whose time to first byte is in `first_byte`.
    pub answers: u64,
}

impl Stats {
    /// What happened between `earlier` and `self` (two readings of the same object).
    pub fn since(&self, earlier: &Stats) -> Stats {
        Stats {
            requests: self.requests.saturating_sub(earlier.requests),
            heads: self.heads.saturating_sub(earlier.heads),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            retries: self.retries.saturating_sub(earlier.retries),
            throttled: self.throttled.saturating_sub(earlier.throttled),
            waiting: self.waiting.saturating_sub(earlier.waiting),
            first_byte: self.first_byte.saturating_sub(earlier.first_byte),
            answers: self.answers.saturating_sub(earlier.answers),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub requests: AtomicU64,
    pub heads: AtomicU64,
    pub bytes: AtomicU64,
    pub retries: AtomicU64,
    pub throttled: AtomicU64,
    pub waiting_ns: AtomicU64,
    pub first_byte_ns: AtomicU64,
    pub answers: AtomicU64,
}

/// An object of a store, pinned to the version it had when opened.
#[derive(Debug)]
pub struct Object {
    pub(crate) url: ObjectUrl,
    pub(crate) client: Client,
    len: u64,
    etag: Option<String>,
    pub(crate) counters: Counters,
}

/// Why one attempt failed: worth another try, or not.
pub(crate) enum Failure {
    Transient(String),
    Fatal(RemoteError),
}

/// When a failed request is sent again: after a backoff doubling from 50 ms up to 2 s, with full jitter (many
/// GETs failing together, as a throttled bucket makes them, do not come back together), and not before the answer's
/// `Retry-After` (at most 30 s) has passed; given up after `remote_retries`.
pub(crate) struct Retry {
    retries: u32,
}

impl Retry {
    pub fn new() -> Retry {
        Retry { retries: 0 }
    }

    /// How long to wait before sending again, or the error to give up with (`range`: what was asked for;
    /// `asked`: the failed answer's `Retry-After`).
    pub fn after(
        &mut self,
        object: &Object,
        range: std::ops::Range<u64>,
        message: String,
        asked: Option<Duration>,
    ) -> Result<Duration, RemoteError> {
        if self.retries >= config().retries {
            let retries = self.retries;
            return Err(RemoteError::Request { url: object.url.to_string(), range, retries, message });
        }
        self.retries += 1;
        object.counters.retries.fetch_add(1, Relaxed);
        tracing::debug!(url = %object.url, retries = self.retries, %message, "retrying a request");
        let cap = Duration::from_millis(50u64 << (self.retries - 1).min(5)).min(Duration::from_secs(2));
        Ok(cap.mul_f64(jitter()).max(asked.unwrap_or_default().min(Duration::from_secs(30))))
    }
}

/// A number in [0, 1), different at each call (for backoff jitter; no cryptographic need).
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(CALLS.fetch_add(1, Relaxed));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

impl Object {
    /// Opens `url` with one ranged GET of its first `first` bytes (at least 1), which pins its length and ETag;
    /// returns the object and those bytes (all of a shorter object). Not a HEAD: a presigned URL is signed for GET
    /// only, and the bytes are the header a parser wants next. An empty object, which has no byte to ask for, is
    /// opened with a HEAD.
    pub fn open_with(url: &ObjectUrl, first: u64) -> Result<(Object, Vec<u8>), RemoteError> {
        let client = store_for(url)?;
        let object = Object { url: url.clone(), client, len: 0, etag: None, counters: Counters::default() };
        // The future owns the object while it asks (its counters count the request) and hands it back.
        let (mut object, got) = block_on(async move {
            let got = object.open_get(first.max(1)).await;
            (object, got)
        })?;
        let (len, etag, bytes) = got?;
        object.len = len;
        object.etag = etag;
        Ok((object, bytes))
    }

    /// Opens `url`: [`Object::open_with`] asking for one byte.
    pub fn open(url: &ObjectUrl) -> Result<Object, RemoteError> {
        Object::open_with(url, 1).map(|(o, _)| o)
    }

    /// The first GET: length, ETag and the first `first` bytes (retried as any request).
    async fn open_get(&self, first: u64) -> Result<(u64, Option<String>, Vec<u8>), RemoteError> {
        let started = Instant::now();
        let mut retry = Retry::new();
        let result = loop {
            let (attempt, asked) = with_retry_after(self.first_bytes(first)).await;
            let message = match attempt {
                Ok(r) => break Ok(r),
                Err(Failure::Fatal(e)) => break Err(e),
                Err(Failure::Transient(m)) => m,
            };
            match retry.after(self, 0..first, message, asked) {
                Ok(wait) => tokio::time::sleep(wait).await,
                Err(e) => break Err(e),
            }
        };
        self.counters.waiting_ns.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
        result
    }

    async fn first_bytes(&self, first: u64) -> Result<(u64, Option<String>, Vec<u8>), Failure> {
        let options = GetOptions { range: Some(GetRange::Bounded(0..first)), ..Default::default() };
        let got = match self.get(options).await {
            Ok(got) => got,
            // No byte 0 to give: an empty object (S3 and nginx answer 416).
            Err(Failure::Fatal(RemoteError::Other { message, .. })) if is_unsatisfiable(&message) => {
                return self.head().await.map(|(len, etag)| (len, etag, Vec::new()));
            }
            Err(e) => return Err(e),
        };
        let (len, etag) = (got.meta.size, got.meta.e_tag.clone());
        if got.range.start != 0 {
            return Err(Failure::Fatal(RemoteError::NoRange { url: self.url.to_string() }));
        }
        let want = (got.range.end - got.range.start) as usize;
        let mut bytes = Vec::with_capacity(want);
        let mut body = got.into_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| self.classify(e))?;
            if bytes.len() + chunk.len() > want {
                return Err(Failure::Fatal(self.oversent(want as u64)));
            }
            bytes.extend_from_slice(&chunk);
        }
        self.counters.bytes.fetch_add(bytes.len() as u64, Relaxed);
        if bytes.len() != want {
            return Err(Failure::Transient(format!("the body ended after {} of {want} bytes", bytes.len())));
        }
        Ok((len, etag, bytes))
    }

    async fn head(&self) -> Result<(u64, Option<String>), Failure> {
        self.counters.heads.fetch_add(1, Relaxed);
        let got = self.get(GetOptions::new().with_head(true)).await?;
        Ok((got.meta.size, got.meta.e_tag))
    }

    /// Sends one request (counted, its time to the answer's headers too).
    pub(crate) async fn get(&self, options: GetOptions) -> Result<GetResult, Failure> {
        self.counters.requests.fetch_add(1, Relaxed);
        let sent = Instant::now();
        let got = self.client.store.get_opts(&self.client.path, options).await;
        self.counters.first_byte_ns.fetch_add(sent.elapsed().as_nanos() as u64, Relaxed);
        self.counters.answers.fetch_add(1, Relaxed);
        got.map_err(|e| self.classify(e))
    }

    /// The URL the object was opened with.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// The parsed URL the object was opened with.
    pub fn object_url(&self) -> &ObjectUrl {
        &self.url
    }

    /// The object's length when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the object had no bytes when it was opened.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ETag pinned at open (`None` where the store gives none: then only the length is checked).
    pub fn etag(&self) -> Option<&str> {
        self.etag.as_deref()
    }

    /// What the origin of this object (its bucket's endpoint, or its host) said about throttling, for every
    /// object read from it.
    pub fn throttle(&self) -> &Arc<Throttle> {
        &self.client.throttle
    }

    /// This object's requests so far (all its reads, through every handle to it).
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        Stats {
            requests: c.requests.load(Relaxed),
            heads: c.heads.load(Relaxed),
            bytes: c.bytes.load(Relaxed),
            retries: c.retries.load(Relaxed),
            throttled: c.throttled.load(Relaxed),
            waiting: Duration::from_nanos(c.waiting_ns.load(Relaxed)),
            first_byte: Duration::from_nanos(c.first_byte_ns.load(Relaxed)),
            answers: c.answers.load(Relaxed),
        }
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<(), RemoteError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(RemoteError::Other {
                url: self.url.to_string(),
                message: format!("bytes {offset}..+{len} lie past the end of the {}-byte object", self.len),
            }),
        }
    }

    /// Checks an answer against the pinned version: its ETag, its object's length, and that it starts at `start`.
    pub(crate) fn check_answer(&self, got: &GetResult, start: u64) -> Result<(), Failure> {
        if let (Some(was), Some(now)) = (&self.etag, &got.meta.e_tag)
            && was != now
        {
            return Err(Failure::Fatal(self.changed(now.clone())));
        }
        if got.meta.size != self.len {
            return Err(Failure::Fatal(self.changed(format!("a {}-byte object", got.meta.size))));
        }
        if got.range.start != start {
            return Err(Failure::Fatal(RemoteError::NoRange { url: self.url.to_string() }));
        }
        Ok(())
    }

    /// A GET of `range` pinned to the version opened (`If-Match` with its ETag).
    pub(crate) fn ranged(&self, range: std::ops::Range<u64>) -> GetOptions {
        GetOptions { range: Some(GetRange::Bounded(range)), if_match: self.etag.clone(), ..Default::default() }
    }

    pub(crate) fn oversent(&self, asked: u64) -> RemoteError {
        RemoteError::Other {
            url: self.url.to_string(),
            message: format!("the server sent more than the {asked} bytes asked for"),
        }
    }

    pub(crate) fn changed(&self, now: String) -> RemoteError {
        let was = self.etag.clone().unwrap_or_else(|| format!("a {}-byte object", self.len));
        RemoteError::Changed { url: self.url.to_string(), was, now }
    }

    /// Sorts a store error into one worth retrying or not. `object_store` 0.14 keeps its status-carrying error
    /// type private, so the status of a failed request is read from its message.
    pub(crate) fn classify(&self, e: object_store::Error) -> Failure {
        let url = self.url.to_string();
        match e {
            object_store::Error::NotFound { .. } => Failure::Fatal(RemoteError::NotFound { url }),
            object_store::Error::Precondition { .. } => Failure::Fatal(self.changed("a newer version".into())),
            object_store::Error::PermissionDenied { source, .. }
            | object_store::Error::Unauthenticated { source, .. } => {
                let message = one_line(&*source);
                let message = status_in(&message).map_or(message, |s| format!("HTTP {s}"));
                Failure::Fatal(RemoteError::Denied { url, message })
            }
            // The HTTP client's word for a 200 answer to a ranged GET.
            object_store::Error::NotSupported { source }
                if source.to_string().contains("Range request not supported") =>
            {
                Failure::Fatal(RemoteError::NoRange { url })
            }
            e @ (object_store::Error::InvalidPath { .. } | object_store::Error::NotSupported { .. }) => {
                Failure::Fatal(RemoteError::Other { url, message: one_line(&e) })
            }
            e => {
                let message = one_line(&e);
                if message.contains("non-partial response") {
                    return Failure::Fatal(RemoteError::NoRange { url });
                }
                match status_in(&message) {
                    Some(s) if s == 503 || s == 429 => {
                        self.counters.throttled.fetch_add(1, Relaxed);
                        Failure::Transient(message)
                    }
                    Some(s) if s >= 500 || s == 408 => Failure::Transient(message),
                    Some(_) => Failure::Fatal(RemoteError::Other { url, message }),
                    // Connection refused or reset, timeouts, bodies cut off: the request may succeed again.
                    None => Failure::Transient(message),
                }
            }
        }
    }
}

/// Runs `f` (requests of one attempt) noting the `Retry-After` of an answer to slow down among them.
pub(crate) async fn with_retry_after<F: std::future::Future>(f: F) -> (F::Output, Option<Duration>) {
    crate::client::RETRY_AFTER
        .scope(std::cell::Cell::new(None), async {
            let out = f.await;
            (out, crate::client::RETRY_AFTER.with(std::cell::Cell::get))
        })
        .await
}

/// Whether a store's message is a 416 (the range asked for starts at or past the end).
fn is_unsatisfiable(message: &str) -> bool {
    status_in(message) == Some(416) || message.contains("Range Not Satisfiable") || message.contains("InvalidRange")
}

/// The HTTP status a store error reports, if any.
pub(crate) fn status_in(message: &str) -> Option<u16> {
    let (_, rest) = message.split_once("status code: ").or_else(|| message.split_once("status: "))?;
    rest.get(..3)?.parse().ok()
}

/// An error and its sources in one line.
pub(crate) fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text.replace('\n', " ")
}

/// Runs `f` on the runtime and waits for it on the calling thread (which may be any thread but a runtime's own).
pub(crate) fn block_on<F>(f: F) -> Result<F::Output, RemoteError>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let rt = runtime()?;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv().map_err(|_| RemoteError::Other { url: String::new(), message: "the network runtime stopped".into() })
}
