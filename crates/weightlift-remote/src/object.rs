//! One object: opened with a HEAD that pins its length and ETag, read by ranged GETs that resume and retry.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{GetOptions, GetRange, ObjectStore};

use crate::client::{config, runtime, store_for};
use crate::error::RemoteError;

/// What an object's requests did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// HTTP requests sent (HEAD and GETs, retries included).
    pub requests: u64,
    /// Body bytes received into their destinations.
    pub bytes: u64,
    /// Requests sent again after a transient failure.
    pub retries: u64,
    /// Time spent in requests, summed over the requests in flight (so it may exceed the wall time).
    pub waiting: Duration,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    bytes: AtomicU64,
    retries: AtomicU64,
    waiting_ns: AtomicU64,
}

/// An object of a store, pinned to the version it had when opened.
#[derive(Debug)]
pub struct Object {
    url: String,
    store: Arc<dyn ObjectStore>,
    path: StorePath,
    len: u64,
    etag: Option<String>,
    counters: Counters,
}

/// Destination memory of a read in flight on the runtime.
#[derive(Clone, Copy)]
struct Dest {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a `Dest` is only made by `Object::start_read` and `Object::read_at`, whose callers guarantee the memory
// stays valid and is written by nothing else until the read completes; the runtime thread is its only writer.
unsafe impl Send for Dest {}

/// Why one attempt failed: worth another try, or not.
enum Failure {
    Transient(String),
    Fatal(RemoteError),
}

impl Object {
    /// Opens `url` with a HEAD request: its length and ETag are pinned from now on.
    pub fn open(url: &str) -> Result<Object, RemoteError> {
        let (store, path) = store_for(url)?;
        let probe =
            Arc::new(Object { url: url.to_string(), store, path, len: 0, etag: None, counters: Counters::default() });
        let asking = probe.clone();
        let meta = block_on(async move { asking.head().await })??;
        let mut object = Arc::try_unwrap(probe).unwrap_or_else(|shared| Object {
            url: shared.url.clone(),
            store: shared.store.clone(),
            path: shared.path.clone(),
            len: 0,
            etag: None,
            counters: Counters::default(),
        });
        object.len = meta.size;
        object.etag = meta.e_tag;
        Ok(object)
    }

    async fn head(&self) -> Result<object_store::ObjectMeta, RemoteError> {
        let started = Instant::now();
        let mut retries = 0;
        loop {
            self.counters.requests.fetch_add(1, Relaxed);
            let attempt = self.store.get_opts(&self.path, GetOptions::new().with_head(true)).await;
            self.counters.waiting_ns.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
            let message = match attempt {
                Ok(r) => return Ok(r.meta),
                Err(e) => match self.classify(e) {
                    Failure::Fatal(e) => return Err(e),
                    Failure::Transient(m) => m,
                },
            };
            if retries >= config().retries {
                return Err(RemoteError::Request { url: self.url.clone(), range: 0..0, retries, message });
            }
            retries += 1;
            self.counters.retries.fetch_add(1, Relaxed);
            tokio::time::sleep(backoff(retries)).await;
        }
    }

    /// The URL the object was opened with.
    pub fn url(&self) -> &str {
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

    /// This object's requests so far (all its reads, through every handle to it).
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        Stats {
            requests: c.requests.load(Relaxed),
            bytes: c.bytes.load(Relaxed),
            retries: c.retries.load(Relaxed),
            waiting: Duration::from_nanos(c.waiting_ns.load(Relaxed)),
        }
    }

    /// Fills `buf` with the bytes at `offset`, blocking the caller.
    pub fn read_at(self: &Arc<Self>, offset: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        self.check_range(offset, buf.len() as u64)?;
        let dest = Dest { ptr: buf.as_mut_ptr(), len: buf.len() };
        let this = self.clone();
        // The caller's buffer outlives the read: this call waits for it.
        block_on(async move { this.fetch(offset, dest).await })?
    }

    /// Starts reading `len` bytes at `offset` into `dest` on the runtime; `done` gets the bytes read (all of them)
    /// or the error, on a runtime thread. `stop`, asked every 20 ms, ends the read early (a cancelled load: an
    /// interrupted user must not wait for a slow server): its request is dropped, nothing more is written into
    /// `dest`, and `done` gets [`RemoteError::Stopped`].
    ///
    /// # Safety
    /// `dest..dest + len` must be valid for writes, and neither read nor written by anything else, until `done`
    /// has been called.
    pub unsafe fn start_read(
        self: &Arc<Self>,
        offset: u64,
        dest: *mut u8,
        len: usize,
        stop: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
        done: impl FnOnce(Result<usize, RemoteError>) + Send + 'static,
    ) {
        if let Err(e) = self.check_range(offset, len as u64) {
            return done(Err(e));
        }
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(e) => return done(Err(e)),
        };
        let this = self.clone();
        let dest = Dest { ptr: dest, len };
        rt.spawn(async move {
            let Some(stop) = stop else { return done(this.fetch(offset, dest).await.map(|()| len)) };
            let mut fetch = Box::pin(this.fetch(offset, dest));
            let mut poll = tokio::time::interval(Duration::from_millis(20));
            let result = loop {
                tokio::select! {
                    r = &mut fetch => break r.map(|()| len),
                    _ = poll.tick() => if stop() {
                        break Err(RemoteError::Stopped { url: this.url.clone() });
                    }
                }
            };
            // The request is dropped before `done` (a future writes into `dest` only while polled, and is no longer).
            drop(fetch);
            done(result)
        });
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), RemoteError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(RemoteError::Other {
                url: self.url.clone(),
                message: format!("bytes {offset}..+{len} lie past the end of the {}-byte object", self.len),
            }),
        }
    }

    /// Reads `dest.len` bytes at `offset`, resuming a body cut short where it stopped and retrying transient
    /// failures with backoff.
    async fn fetch(&self, offset: u64, dest: Dest) -> Result<(), RemoteError> {
        let started = Instant::now();
        let want = dest.len as u64;
        let (mut done, mut retries) = (0u64, 0u32);
        let result = loop {
            if done == want {
                break Ok(());
            }
            let range = offset + done..offset + want;
            let message = match self.get_into(range.clone(), dest, &mut done).await {
                Ok(()) if done == want => continue,
                Ok(()) => format!("the body ended after {} of {} bytes", done, want),
                Err(Failure::Fatal(e)) => break Err(e),
                Err(Failure::Transient(m)) => m,
            };
            if retries >= config().retries {
                break Err(RemoteError::Request { url: self.url.clone(), range, retries, message });
            }
            retries += 1;
            self.counters.retries.fetch_add(1, Relaxed);
            tracing::debug!(url = %self.url, retries, %message, "retrying a ranged GET");
            tokio::time::sleep(backoff(retries)).await;
        };
        self.counters.waiting_ns.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
        result
    }

    /// One ranged GET of `range`, its body copied into `dest` from `*done` on (advanced as bytes land).
    async fn get_into(&self, range: Range<u64>, dest: Dest, done: &mut u64) -> Result<(), Failure> {
        self.counters.requests.fetch_add(1, Relaxed);
        let options = GetOptions {
            range: Some(GetRange::Bounded(range.clone())),
            if_match: self.etag.clone(),
            ..Default::default()
        };
        let got = self.store.get_opts(&self.path, options).await.map_err(|e| self.classify(e))?;
        let changed = |now: String| Failure::Fatal(self.changed(now));
        if let (Some(was), Some(now)) = (&self.etag, &got.meta.e_tag)
            && was != now
        {
            return Err(changed(now.clone()));
        }
        if got.meta.size != self.len {
            return Err(changed(format!("a {}-byte object", got.meta.size)));
        }
        if got.range.start != range.start {
            return Err(Failure::Fatal(RemoteError::NoRange { url: self.url.clone() }));
        }
        let mut body = got.into_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| self.classify(e))?;
            let room = dest.len as u64 - *done;
            if chunk.len() as u64 > room {
                return Err(Failure::Fatal(RemoteError::Other {
                    url: self.url.clone(),
                    message: format!("the server sent more than the {} bytes asked for", range.end - range.start),
                }));
            }
            // SAFETY: `done + chunk.len() <= dest.len` (checked above), and the caller of `start_read`/`read_at`
            // keeps `dest` valid and unaliased until this read completes.
            unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), dest.ptr.add(*done as usize), chunk.len()) };
            *done += chunk.len() as u64;
            self.counters.bytes.fetch_add(chunk.len() as u64, Relaxed);
        }
        Ok(())
    }

    fn changed(&self, now: String) -> RemoteError {
        let was = self.etag.clone().unwrap_or_else(|| format!("a {}-byte object", self.len));
        RemoteError::Changed { url: self.url.clone(), was, now }
    }

    /// Sorts a store error into one worth retrying or not. `object_store` 0.14 keeps its status-carrying error
    /// type private, so the status of a failed request is read from its message.
    fn classify(&self, e: object_store::Error) -> Failure {
        let url = self.url.clone();
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
                    Some(s) if s >= 500 || s == 429 || s == 408 => Failure::Transient(message),
                    Some(_) => Failure::Fatal(RemoteError::Other { url, message }),
                    // Connection refused or reset, timeouts, bodies cut off: the request may succeed again.
                    None => Failure::Transient(message),
                }
            }
        }
    }
}

/// The HTTP status a store error reports, if any.
fn status_in(message: &str) -> Option<u16> {
    let (_, rest) = message.split_once("status code: ").or_else(|| message.split_once("status: "))?;
    rest.get(..3)?.parse().ok()
}

/// An error and its sources in one line.
fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
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

fn backoff(retry: u32) -> Duration {
    Duration::from_millis(50u64.saturating_mul(1 << retry.min(6).saturating_sub(1))).min(Duration::from_secs(2))
}

/// Runs `f` on the runtime and waits for it on the calling thread (which may be any thread but a runtime's own).
fn block_on<F>(f: F) -> Result<F::Output, RemoteError>
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

/// The first bytes of an object, fetched with one GET, and a window of read-ahead behind them: header parsers ask
/// for a few bytes at a time, and each must not be a round trip.
#[derive(Debug)]
pub struct Head {
    object: Arc<Object>,
    window: Mutex<(u64, Vec<u8>)>,
}

impl Head {
    /// The first bytes fetched at once (a safetensors header of a large model is well under this; a GGUF with a
    /// large vocabulary is about this).
    pub const FIRST: u64 = 4 << 20;

    /// Opens `object` for header reads: fetches its first [`Head::FIRST`] bytes.
    pub fn new(object: Arc<Object>) -> Result<Head, RemoteError> {
        let first = object.len().min(Self::FIRST);
        let mut bytes = vec![0u8; first as usize];
        object.read_at(0, &mut bytes)?;
        Ok(Head { object, window: Mutex::new((0, bytes)) })
    }

    /// The object the header is read from.
    pub fn object(&self) -> &Arc<Object> {
        &self.object
    }

    /// The object's bytes `0..len` when the window still holds them (as the first GET left it), without a request.
    pub fn prefix(&self, len: u64) -> Option<Vec<u8>> {
        let window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let (start, bytes) = &*window;
        if *start != 0 {
            return None;
        }
        bytes.get(..usize::try_from(len).ok()?).map(<[u8]>::to_vec)
    }

    /// Fills `buf` from `offset`: from the window when it holds the bytes, else with a GET of at least
    /// [`Head::FIRST`] bytes that becomes the window.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let (start, bytes) = &*window;
        let end = offset.saturating_add(buf.len() as u64);
        if offset >= *start && end <= start + bytes.len() as u64 {
            let from = (offset - start) as usize;
            buf.copy_from_slice(&bytes[from..from + buf.len()]);
            return Ok(());
        }
        let len = (buf.len() as u64).max(Self::FIRST).min(self.object.len().saturating_sub(offset));
        if len < buf.len() as u64 {
            return self.object.read_at(offset, buf);
        }
        let mut fresh = vec![0u8; len as usize];
        self.object.read_at(offset, &mut fresh)?;
        buf.copy_from_slice(&fresh[..buf.len()]);
        *window = (offset, fresh);
        Ok(())
    }
}

/// Writes the local file `path` as the object `url` (in parts of 16 MiB, several in flight), and returns its
/// length: `weightlift upload`, and what fills a bucket for tests and benchmarks, through the same clients that read
/// it.
pub fn upload(path: &std::path::Path, url: &str) -> Result<u64, RemoteError> {
    upload_with_progress(path, url, &|_| {})
}

/// [`upload`], calling `progress` with the bytes read from the file so far after each part is handed over.
pub fn upload_with_progress(
    path: &std::path::Path,
    url: &str,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<u64, RemoteError> {
    use std::io::Read;
    use tokio::io::AsyncWriteExt;
    let (store, location) = store_for(url)?;
    let fail = |message: String| RemoteError::Other { url: url.to_string(), message };
    let mut file = std::fs::File::open(path).map_err(|e| fail(format!("{}: {e}", path.display())))?;
    // The runtime's block_on (not this module's block_on, which needs a 'static future) so that `progress` may
    // borrow; upload runs on a caller's thread, never on a runtime thread.
    runtime()?.block_on(async move {
        let mut writer = object_store::buffered::BufWriter::with_capacity(store, location, 16 << 20);
        let mut total = 0u64;
        loop {
            let mut chunk = vec![0u8; 16 << 20];
            // A blocking read, on the caller's thread (block_on polls this future there): the file is read one part
            // ahead of the parts in flight.
            let n = file.read(&mut chunk).map_err(|e| fail(e.to_string()))?;
            if n == 0 {
                break;
            }
            chunk.truncate(n);
            total += n as u64;
            if let Err(e) = writer.put(chunk.into()).await {
                let _ = writer.abort().await;
                return Err(write_failed(url, e));
            }
            progress(total);
        }
        if let Err(e) = writer.shutdown().await {
            // The last part (or the only PUT, for a small file) is sent here; its store error comes wrapped.
            return Err(match e.into_inner().map(|inner| inner.downcast::<object_store::Error>()) {
                Some(Ok(store)) => write_failed(url, *store),
                Some(Err(other)) => fail(one_line(&*other)),
                None => fail("the upload stopped".into()),
            });
        }
        Ok(total)
    })
}

/// A failed PUT in the words of a failed GET: access denied with its status, else the store's message.
fn write_failed(url: &str, e: object_store::Error) -> RemoteError {
    let url = url.to_string();
    match e {
        object_store::Error::PermissionDenied { source, .. } | object_store::Error::Unauthenticated { source, .. } => {
            let message = one_line(&*source);
            let message = status_in(&message).map_or(message, |s| format!("HTTP {s}"));
            RemoteError::Denied { url, message }
        }
        e => RemoteError::Other { url, message: one_line(&e) },
    }
}
