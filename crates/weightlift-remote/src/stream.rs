//! One ranged GET serving consecutive parts of an object, each into its own destination given when its reader has
//! one ready. A GET of a cloud bucket is slow (each gets ~90 MB/s) and starts late (20-80 ms to the first byte): a
//! load keeps many in flight. Holding a whole GET's range of staging for each would tie up memory in proportion to
//! GETs × range; here a GET holds only the parts its reader has given, and a part is handed back as soon as its bytes
//! are in, while the GET goes on into the next part. A part whose destination is not given yet holds the body back
//! (the connection's flow control then holds the server back).
//!
//! The body is copied into the destinations as it arrives; a failure resumes with a new GET from the byte where
//! the last one stopped, after the backoff of [`crate::object::Retry`].

use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Buf;
use futures_util::StreamExt;
use tokio::sync::Notify;

use crate::client::runtime;
use crate::error::RemoteError;
use crate::object::{Failure, Object, Retry, with_retry_after};

/// Asked every 20 ms while a GET waits: true stops it.
pub type Stop = Arc<dyn Fn() -> bool + Send + Sync>;

type Done = Box<dyn FnOnce(Result<usize, RemoteError>) + Send>;

/// Where a part's bytes go, in order.
#[derive(Clone)]
struct Segments(Vec<(*mut u8, usize)>);

// SAFETY: see `Dest`: the memory is written only by the stream's task while the part is unfinished.
unsafe impl Send for Segments {}

/// A part's destination: its bytes go to `segments` in order.
struct Dest {
    segments: Segments,
    stop: Option<Stop>,
    done: Done,
}

// SAFETY: the segments are written only by the stream's task, and only until `done` is called; whoever gave them
// (`GetStream::fill`) keeps them valid and untouched by anything else until then.
unsafe impl Send for Dest {}

struct State {
    dests: Vec<Option<Dest>>,
    /// Parts before this one are finished.
    next: usize,
    failed: Option<RemoteError>,
    /// The handle was dropped: no destination will come any more.
    closed: bool,
}

struct Shared {
    object: Arc<Object>,
    parts: Vec<Range<u64>>,
    stop: Stop,
    state: Mutex<State>,
    wake: Notify,
}

/// A GET of consecutive parts of an object, started when made. Dropping the handle ends it once the parts given
/// so far are finished (a part not given by then is never read).
pub struct GetStream {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for GetStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (first, last) = (self.shared.parts.first(), self.shared.parts.last());
        write!(
            f,
            "GetStream({} parts, {:?}..{:?})",
            self.shared.parts.len(),
            first.map(|r| r.start),
            last.map(|r| r.end)
        )
    }
}

impl GetStream {
    /// Starts one GET covering `parts` (non-empty byte ranges, ascending, not overlapping, inside the object; the
    /// bytes between parts are read and dropped). `stop`, asked every 20 ms, ends the GET early (its load failed or
    /// was cancelled): parts not yet finished then fail with [`RemoteError::Stopped`]. It must stay callable for as
    /// long as the stream runs.
    pub fn new(object: &Arc<Object>, parts: Vec<Range<u64>>, stop: Stop) -> Result<GetStream, RemoteError> {
        let bad = |message: String| RemoteError::Other { url: object.url().to_string(), message };
        let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
            return Err(bad("a GET of no parts".into()));
        };
        object.check_range(first.start, last.end.saturating_sub(first.start))?;
        if parts.iter().any(|p| p.start >= p.end) || parts.windows(2).any(|w| w[0].end > w[1].start) {
            return Err(bad("a GET's parts must be non-empty, ascending and apart".into()));
        }
        let rt = runtime()?;
        let shared = Arc::new(Shared {
            object: object.clone(),
            state: Mutex::new(State {
                dests: (0..parts.len()).map(|_| None).collect(),
                next: 0,
                failed: None,
                closed: false,
            }),
            parts,
            stop,
            wake: Notify::new(),
        });
        rt.spawn(shared.clone().run());
        Ok(GetStream { shared })
    }

    /// How many parts the GET serves.
    pub fn parts(&self) -> usize {
        self.shared.parts.len()
    }

    /// Gives part `part` its destination: `segments`, whose lengths add up to the part's. `done` gets the part's
    /// length once its bytes are all there, or the error that ended the GET, on a thread of the network runtime
    /// (at once where the GET failed already). `stop` is asked while this part is awaited, as the stream's own.
    ///
    /// # Safety
    /// Each segment must be valid for writes, and neither read nor written by anything else, until `done` has
    /// been called.
    pub unsafe fn fill(
        &self,
        part: usize,
        segments: Vec<(*mut u8, usize)>,
        stop: Option<Stop>,
        done: impl FnOnce(Result<usize, RemoteError>) + Send + 'static,
    ) {
        let s = &self.shared;
        let url = || s.object.url().to_string();
        let Some(range) = s.parts.get(part) else {
            return done(Err(RemoteError::Other { url: url(), message: format!("no part {part} in this GET") }));
        };
        let total: usize = segments.iter().map(|(_, n)| n).sum();
        if total as u64 != range.end - range.start {
            let message = format!("a {total}-byte destination for a {}-byte part", range.end - range.start);
            return done(Err(RemoteError::Other { url: url(), message }));
        }
        let mut state = s.lock();
        if let Some(e) = &state.failed {
            let e = e.clone();
            drop(state);
            return done(Err(e));
        }
        if part < state.next || state.dests[part].is_some() {
            drop(state);
            return done(Err(RemoteError::Other { url: url(), message: format!("part {part} given twice") }));
        }
        state.dests[part] = Some(Dest { segments: Segments(segments), stop, done: Box::new(done) });
        drop(state);
        s.wake.notify_one();
    }
}

impl Drop for GetStream {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
    }
}

impl Object {
    /// Fills `buf` with the bytes at `offset`, blocking the caller (a GET that resumes and retries as every read).
    pub fn read_at(self: &Arc<Self>, offset: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        let len = buf.len() as u64;
        if len == 0 {
            return self.check_range(offset, 0);
        }
        let parts = std::iter::once(offset..offset + len).collect();
        let stream = GetStream::new(self, parts, Arc::new(|| false))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        // SAFETY: `buf` is borrowed mutably for this call, which waits for `done` before returning, so the memory
        // stays valid and untouched by anything else until the stream has finished with it.
        unsafe { stream.fill(0, vec![(buf.as_mut_ptr(), buf.len())], None, move |r| drop(tx.send(r))) };
        let stopped =
            || RemoteError::Other { url: self.url.to_string(), message: "the network runtime stopped".into() };
        rx.recv().map_err(|_| stopped())?.map(|_| ())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn run(self: Arc<Self>) {
        let result = self.pump().await;
        // What is left fails: the parts given, and those given later (`fill` sees `failed`).
        let error = result.err().unwrap_or_else(|| self.stopped());
        let left: Vec<Dest> = {
            let mut state = self.lock();
            state.failed = Some(error.clone());
            state.dests.iter_mut().filter_map(Option::take).collect()
        };
        for d in left {
            (d.done)(Err(error.clone()));
        }
    }

    fn stopped(&self) -> RemoteError {
        RemoteError::Stopped { url: self.object.url().to_string() }
    }

    /// Whether the GET should stop: its own `stop`, or the awaited part's.
    fn stopping(&self) -> bool {
        if (self.stop)() {
            return true;
        }
        let state = self.lock();
        state.dests.get(state.next).and_then(Option::as_ref).and_then(|d| d.stop.as_ref()).is_some_and(|s| s())
    }

    /// GETs (the first, then resumptions) until every part is finished.
    async fn pump(&self) -> Result<(), RemoteError> {
        let end = self.parts.last().map_or(0, |p| p.end);
        let mut pos = self.parts.first().map_or(0, |p| p.start);
        let mut retry = Retry::new();
        loop {
            let started = Instant::now();
            let (attempt, asked) = {
                let get = with_retry_after(self.one_get(&mut pos));
                tokio::pin!(get);
                let mut tick = tokio::time::interval(Duration::from_millis(20));
                loop {
                    tokio::select! {
                        r = &mut get => break r,
                        _ = tick.tick() => if self.stopping() {
                            break (Err(Failure::Fatal(self.stopped())), None);
                        }
                    }
                }
            };
            self.object.counters.waiting_ns.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
            let message = match attempt {
                Ok(()) if pos >= end => return Ok(()),
                Ok(()) => format!("the body ended {} bytes short", end - pos),
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Transient(m)) => m,
            };
            let wait = retry.after(&self.object, pos..end, message, asked)?;
            let deadline = tokio::time::Instant::now() + wait;
            while tokio::time::Instant::now() < deadline {
                tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + Duration::from_millis(20))).await;
                if self.stopping() {
                    return Err(self.stopped());
                }
            }
        }
    }

    /// One GET from `*pos` to the end of the last part, its body copied into the parts' destinations as it comes;
    /// `*pos` is where it stopped.
    async fn one_get(&self, pos: &mut u64) -> Result<(), Failure> {
        let end = self.parts.last().map_or(0, |p| p.end);
        let got = self.object.get(self.object.ranged(*pos..end)).await?;
        self.object.check_answer(&got, *pos)?;
        let mut body = got.into_stream();
        let mut part = self.parts.partition_point(|p| p.end <= *pos);
        let mut current: Option<(usize, Segments)> = None;
        while let Some(chunk) = body.next().await {
            let mut chunk = chunk.map_err(|e| self.object.classify(e))?;
            while !chunk.is_empty() {
                let Some(range) = self.parts.get(part) else {
                    return Err(Failure::Fatal(self.object.oversent(end - self.parts[0].start)));
                };
                if *pos < range.start {
                    let skip = (range.start - *pos).min(chunk.len() as u64);
                    chunk.advance(skip as usize);
                    *pos += skip;
                    continue;
                }
                if current.as_ref().is_none_or(|(p, _)| *p != part) {
                    current = Some((part, self.destination(part).await?));
                }
                let Some((_, segments)) = &current else { continue };
                let n = (range.end - *pos).min(chunk.len() as u64) as usize;
                // SAFETY: the segments are this part's destination, given by `fill` (whose caller keeps them valid
                // and unshared until `done`), and `done` has not been called: the part is not finished.
                unsafe { scatter(&segments.0, (*pos - range.start) as usize, &chunk[..n]) };
                chunk.advance(n);
                *pos += n as u64;
                self.object.counters.bytes.fetch_add(n as u64, Relaxed);
                if *pos == range.end {
                    self.finish(part);
                    part += 1;
                }
            }
        }
        Ok(())
    }

    /// Part `part`'s segments, waiting until they are given.
    async fn destination(&self, part: usize) -> Result<Segments, Failure> {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = self.lock();
                if let Some(Some(d)) = state.dests.get(part) {
                    return Ok(d.segments.clone());
                }
                if state.closed {
                    return Err(Failure::Fatal(self.stopped()));
                }
            }
            notified.await;
        }
    }

    fn finish(&self, part: usize) {
        let dest = {
            let mut state = self.lock();
            state.next = part + 1;
            state.dests.get_mut(part).and_then(Option::take)
        };
        if let Some(d) = dest {
            (d.done)(Ok(d.segments.0.iter().map(|(_, n)| n).sum()));
        }
    }
}

/// Copies `data` into the bytes of `segments` (taken as one run) from `at` on.
///
/// # Safety
/// Every segment must be valid for writes, and `at + data.len()` at most their total length.
unsafe fn scatter(segments: &[(*mut u8, usize)], mut at: usize, mut data: &[u8]) {
    for &(ptr, len) in segments {
        if data.is_empty() {
            return;
        }
        if at >= len {
            at -= len;
            continue;
        }
        let n = (len - at).min(data.len());
        // SAFETY: `at + n <= len`, inside this segment, valid for writes per this function's contract.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.add(at), n) };
        data = &data[n..];
        at = 0;
    }
}
