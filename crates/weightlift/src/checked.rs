//! Loads checked against expected checksums while they run ([`LoadOpts::checks`](crate::LoadOpts)): each
//! destination is hashed as soon as its last byte has landed, overlapped with the reads and copies still going on,
//! instead of after the whole load. Device destinations are hashed on their GPU by the packed-load decoder's xxh3
//! kernels (on the decoder's own stream, beside the lanes' copies); host destinations on a CPU thread. Whatever did
//! not report landing (a path without lanes, such as cuFile) is hashed once the read has returned.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use weightlift_cuda::CUdeviceptr;
use weightlift_cuda::unpack::{GpuUnpacker, PendingBatch};
use weightlift_io::Piece;

use crate::error::{Error, Result};
use crate::report::CheckStats;

/// A chunk of a tensor and the xxh3-64 its bytes must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSum {
    /// Offset of the chunk in the tensor.
    pub start: u64,
    /// Bytes in the chunk.
    pub len: u64,
    /// The xxh3-64 (seed 0) the chunk must hash to.
    pub expected: u64,
}

/// Expected checksums for a load: `tensors[i]` lists the chunks of the load's `i`-th tensor (in the order the load
/// was asked for); an empty list leaves that tensor unchecked.
#[derive(Clone, Debug, Default)]
pub struct Checks {
    /// Per tensor of the load, its chunks' checksums.
    pub tensors: Vec<Vec<ChunkSum>>,
}

impl Checks {
    /// The expected checksums of the tensors of `index` at positions `which` (in that order), from the checksum
    /// manifest beside each of their files (`<file>.xxh3.json`, written by `weightlift checksum`). A missing or
    /// unreadable manifest, a tensor it does not list, or one whose size differs from the file's is a `Verify`
    /// error naming them.
    pub fn from_manifests(index: &weightlift_format::TensorIndex, which: &[usize]) -> Result<Checks> {
        use std::collections::HashMap;
        use weightlift_pack::manifest::{Manifest, SUFFIX};
        let verify = Error::Verify;
        let mut manifests: HashMap<usize, Manifest> = HashMap::new();
        let mut tensors = Vec::with_capacity(which.len());
        for &i in which {
            let t = index.tensors.get(i).ok_or_else(|| {
                Error::InvalidArgument(format!("no tensor at position {i} of {}", index.tensors.len()))
            })?;
            let file = index.files.get(t.file).ok_or_else(|| {
                Error::InvalidArgument(format!("tensor {:?} names file {} of {}", t.name, t.file, index.files.len()))
            })?;
            if let std::collections::hash_map::Entry::Vacant(v) = manifests.entry(t.file) {
                let mut path = file.path.clone().into_os_string();
                path.push(SUFFIX);
                let m = Manifest::read(std::path::Path::new(&path))
                    .map_err(|e| verify(format!("{e} (write it with `weightlift checksum`)")))?;
                v.insert(m);
            }
            let m = &manifests[&t.file];
            let sums = m
                .tensor(&t.name)
                .ok_or_else(|| verify(format!("tensor {:?} is not in the checksum manifest", t.name)))?;
            if sums.nbytes != t.nbytes {
                return Err(verify(format!(
                    "tensor {:?}: the manifest has {} bytes, the file {}",
                    t.name, sums.nbytes, t.nbytes
                )));
            }
            let chunks = sums.chunk_ranges(m.chunk_bytes).map_err(|e| verify(e.to_string()))?;
            tensors.push(chunks.into_iter().map(|(start, len, expected)| ChunkSum { start, len, expected }).collect());
        }
        Ok(Checks { tensors })
    }
}

/// Counts landed bytes per destination and announces each destination once it is whole.
pub(crate) struct Watch {
    lens: Vec<u64>,
    landed: Vec<AtomicU64>,
    tx: Mutex<Option<mpsc::Sender<usize>>>,
}

impl Watch {
    pub fn new(lens: Vec<u64>) -> (Watch, mpsc::Receiver<usize>) {
        let (tx, rx) = mpsc::channel();
        let landed = lens.iter().map(|_| AtomicU64::new(0)).collect();
        (Watch { lens, landed, tx: Mutex::new(Some(tx)) }, rx)
    }

    /// The sinks' `landed` hook.
    pub fn observe(&self, pieces: &[Piece]) {
        for p in pieces {
            let d = p.dest as usize;
            let (Some(count), Some(&len)) = (self.landed.get(d), self.lens.get(d)) else { continue };
            let before = count.fetch_add(p.len, Ordering::AcqRel);
            if before < len
                && before + p.len >= len
                && let Some(tx) = self.tx.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
            {
                let _ = tx.send(d);
            }
        }
    }

    /// No more announcements: the checking thread finishes what it was told and returns.
    pub fn close(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// Where each tensor of the load lies: `parts[d]` lists `(tensor, offset in destination d)`.
pub(crate) struct Layout<'a> {
    pub checks: &'a Checks,
    pub parts: Vec<Vec<(usize, u64)>>,
    /// For error messages: each tensor's name and file.
    pub names: Vec<(String, PathBuf)>,
}

impl Layout<'_> {
    fn mismatch(&self, tensor: usize, chunk: usize, actual: u64, on: &str) -> Error {
        let (name, file) = &self.names[tensor];
        let c = self.checks.tensors[tensor][chunk];
        let e = weightlift_pack::PackError::Checksum {
            path: file.clone(),
            item: name.clone(),
            chunk: chunk as u64,
            start: c.start,
            end: c.start + c.len,
            expected: c.expected,
            actual,
        };
        Error::Verify(format!("{e} (checked on {on})"))
    }

    fn bytes_of(&self, dests: &[usize]) -> u64 {
        let chunks = |t: usize| self.checks.tensors[t].iter().map(|c| c.len).sum::<u64>();
        dests.iter().flat_map(|&d| &self.parts[d]).map(|&(t, _)| chunks(t)).sum()
    }
}

/// Destinations gathered for one hashing round: at least this many bytes, unless nothing more lands for a moment.
const ROUND_BYTES: u64 = 64 << 20;
const ROUND_WAIT: Duration = Duration::from_millis(1);

/// Waits for the next landed destinations (several, up to [`ROUND_BYTES`], when they come in quick succession).
/// `None` once the watch is closed and everything announced was returned.
fn next_round(rx: &mpsc::Receiver<usize>, layout: &Layout<'_>) -> Option<Vec<usize>> {
    let first = rx.recv().ok()?;
    let mut round = vec![first];
    let mut bytes = layout.bytes_of(&round);
    while bytes < ROUND_BYTES {
        match rx.recv_timeout(ROUND_WAIT) {
            Ok(d) => {
                bytes += layout.bytes_of(&[d]);
                round.push(d);
            }
            Err(_) => break,
        }
    }
    Some(round)
}

/// A hash batch in flight and the `(tensor, chunk)` of each of its ranges.
type InFlight = (PendingBatch, Vec<(usize, usize)>);

/// Hashes device destinations on their GPU.
pub(crate) struct GpuChecker<'a> {
    pub layout: Layout<'a>,
    pub unpacker: GpuUnpacker,
    pub ordinal: u32,
    in_flight: Vec<InFlight>,
    done: Vec<bool>,
    first_error: Option<Error>,
    stats: CheckStats,
}

impl<'a> GpuChecker<'a> {
    pub fn new(layout: Layout<'a>, unpacker: GpuUnpacker, ordinal: u32) -> GpuChecker<'a> {
        let done = vec![false; layout.parts.len()];
        let stats = CheckStats { on: format!("cuda:{ordinal}"), ..CheckStats::default() };
        GpuChecker { layout, unpacker, ordinal, in_flight: Vec::new(), done, first_error: None, stats }
    }

    /// Runs on a thread of its own during the load: hashes destinations as `rx` announces them. `address(d)` is
    /// destination `d`'s device address (published before any of its bytes could land).
    pub fn run(&mut self, rx: &mpsc::Receiver<usize>, address: &dyn Fn(usize) -> Option<CUdeviceptr>) {
        while let Some(round) = next_round(rx, &self.layout) {
            if self.first_error.is_some() {
                continue; // drain: the load fails anyway
            }
            let bytes = self.layout.bytes_of(&round);
            self.stats.overlapped_bytes += bytes;
            tracing::debug!(dests = round.len(), bytes, "hashing round");
            if let Err(e) = self.launch(&round, address) {
                self.first_error = Some(e);
            }
        }
    }

    /// Hashes every destination not hashed yet (nothing announced them), waits for every batch, and checks the
    /// results. `read_end`: when the reads ended (the tail is counted from there).
    pub fn finish(
        mut self,
        read_end: Instant,
        address: &dyn Fn(usize) -> Option<CUdeviceptr>,
    ) -> Result<(CheckStats, GpuUnpacker)> {
        // In rounds of about `ROUND_BYTES`, as during the load: a batch's scratch grows with the bytes it hashes,
        // and a whole model hashed at once (a path without lanes) would ask for gigabytes of it.
        let mut round = Vec::new();
        let mut bytes = 0;
        let rest: Vec<usize> = (0..self.done.len()).filter(|&d| !self.done[d]).collect();
        for d in rest {
            if self.first_error.is_some() {
                break;
            }
            round.push(d);
            bytes += self.layout.bytes_of(&[d]);
            if bytes >= ROUND_BYTES {
                if let Err(e) = self.launch(&std::mem::take(&mut round), address) {
                    self.first_error = Some(e);
                }
                bytes = 0;
            }
        }
        if self.first_error.is_none()
            && !round.is_empty()
            && let Err(e) = self.launch(&round, address)
        {
            self.first_error = Some(e);
        }
        while !self.in_flight.is_empty() {
            self.harvest(true);
        }
        self.stats.tail_secs = read_end.elapsed().as_secs_f64();
        match self.first_error.take() {
            Some(e) => Err(e),
            None => Ok((std::mem::take(&mut self.stats), self.unpacker)),
        }
    }

    fn launch(&mut self, dests: &[usize], address: &dyn Fn(usize) -> Option<CUdeviceptr>) -> Result<()> {
        self.harvest(false);
        let mut ranges = Vec::new();
        let mut ids = Vec::new();
        for &d in dests {
            self.done[d] = true;
            let Some(base) = address(d) else {
                return Err(Error::Verify(format!("destination {d} of the load has no device address")));
            };
            for &(t, off) in &self.layout.parts[d] {
                for (k, c) in self.layout.checks.tensors[t].iter().enumerate() {
                    ranges.push((base + off + c.start, c.len));
                    ids.push((t, k));
                    self.stats.chunks += 1;
                    self.stats.bytes += c.len;
                }
            }
        }
        if ranges.is_empty() {
            return Ok(());
        }
        // SAFETY: every range lies inside a destination whose bytes have all landed (or, in `finish`, after the
        // whole read returned); destinations stay allocated and unwritten until the load returns, which waits for
        // every batch first.
        let batch = unsafe { self.unpacker.hash_batch(&ranges) }.map_err(crate::error::gpu_decoder)?;
        self.in_flight.push((batch, ids));
        Ok(())
    }

    /// Checks the batches that have completed (all of them, waiting, when `block`), oldest first.
    fn harvest(&mut self, block: bool) {
        while let Some((batch, _)) = self.in_flight.first() {
            if !block && !batch.is_complete() {
                return;
            }
            let (batch, ids) = self.in_flight.remove(0);
            let checked = batch.wait().map_err(crate::error::gpu_decoder).map(|()| batch.hashes());
            match checked {
                Ok(hashes) => {
                    for (&(t, k), actual) in ids.iter().zip(hashes) {
                        if actual != self.layout.checks.tensors[t][k].expected && self.first_error.is_none() {
                            let on = format!("cuda:{}", self.ordinal);
                            self.first_error = Some(self.layout.mismatch(t, k, actual, &on));
                        }
                    }
                }
                Err(e) => {
                    self.first_error.get_or_insert(e);
                }
            }
            self.unpacker.recycle(batch);
        }
    }
}

/// Host memory of the load's destinations, for the CPU checker.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostDest {
    pub ptr: *const u8,
    pub len: usize,
}

// SAFETY: the addresses are read only after their destination has landed, while the load keeps the buffers alive
// and nothing writes them any more.
unsafe impl Send for HostDest {}
// SAFETY: as above.
unsafe impl Sync for HostDest {}

/// Hashes host destinations on a CPU thread.
pub(crate) struct CpuChecker<'a> {
    pub layout: Layout<'a>,
    pub dests: Vec<HostDest>,
    done: Vec<bool>,
    first_error: Option<Error>,
    stats: CheckStats,
}

impl<'a> CpuChecker<'a> {
    pub fn new(layout: Layout<'a>, dests: Vec<HostDest>, on: String) -> CpuChecker<'a> {
        let done = vec![false; layout.parts.len()];
        CpuChecker { layout, dests, done, first_error: None, stats: CheckStats { on, ..CheckStats::default() } }
    }

    pub fn run(&mut self, rx: &mpsc::Receiver<usize>) {
        while let Some(round) = next_round(rx, &self.layout) {
            if self.first_error.is_none() {
                self.stats.overlapped_bytes += self.layout.bytes_of(&round);
                self.check(&round);
            }
        }
    }

    /// Destination `d`, at `at` (memory read back from a device), checked now.
    pub fn check_one(&mut self, d: usize, at: HostDest) -> Result<()> {
        self.dests[d] = at;
        self.check(&[d]);
        self.dests[d] = HostDest { ptr: std::ptr::null(), len: 0 };
        match self.first_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Checks what was not announced, and returns the first mismatch or what was checked. `read_end`: when the
    /// reads ended (the tail is counted from there).
    pub fn finish(mut self, read_end: Instant) -> Result<CheckStats> {
        let rest: Vec<usize> = (0..self.done.len()).filter(|&d| !self.done[d]).collect();
        if self.first_error.is_none() {
            self.check(&rest);
        }
        self.stats.tail_secs = read_end.elapsed().as_secs_f64();
        match self.first_error.take() {
            Some(e) => Err(e),
            None => Ok(self.stats),
        }
    }

    fn check(&mut self, dests: &[usize]) {
        for &d in dests {
            self.done[d] = true;
            let HostDest { ptr, len } = self.dests[d];
            // SAFETY: `HostDest`'s contract: the destination has landed and stays alive and unwritten.
            let bytes: &[u8] = if len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(ptr, len) } };
            for &(t, off) in &self.layout.parts[d] {
                for (k, c) in self.layout.checks.tensors[t].iter().enumerate() {
                    let at = (off + c.start) as usize;
                    let Some(chunk) = bytes.get(at..at + c.len as usize) else {
                        self.first_error = Some(Error::Verify(format!(
                            "chunk {k} of {:?} ({} bytes at {}) lies outside the loaded {len} bytes",
                            self.layout.names[t].0, c.len, c.start
                        )));
                        return;
                    };
                    self.stats.chunks += 1;
                    self.stats.bytes += c.len;
                    let actual = weightlift_pack::checksum(chunk);
                    if actual != c.expected {
                        self.first_error = Some(self.layout.mismatch(t, k, actual, &self.stats.on.clone()));
                        return;
                    }
                }
            }
        }
    }
}
