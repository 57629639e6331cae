//! The CPU submitter: I/O queue pairs driven from host threads through the shared queue logic, each command owning a
//! slot (data buffer and PRP list) until its completion is consumed, and a loader that reads byte ranges of the
//! namespace into host memory over several queue pairs at once.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::bus::DmaBuffer;
use crate::error::NvmeError;
use crate::host::{Backoff, Controller, RawQueuePair, read_cqe, write_sqe};
use crate::plan::{ByteRange, Chunk, plan};
use crate::prp;
use crate::queue::{CqRing, SlotPool, SqRing};
use crate::spec::{IoOpcode, PAGE_SIZE, Status, SubmissionEntry};

/// How a queue pair is laid out.
#[derive(Clone, Debug)]
pub struct QueueOptions {
    /// Entries per queue; up to `entries - 1` commands are in flight.
    pub entries: u32,
    /// Largest transfer per command (a slot's size); `None` takes the controller's limit (MDTS).
    pub slot_bytes: Option<u64>,
    /// Where in its first page each slot's data starts (dword aligned): non-zero values give PRP1 an offset, so
    /// transfers straddle one more page.
    pub data_offset: usize,
    /// Where in its first page each slot's PRP list starts (qword aligned): lists reaching the end of a page
    /// continue on the next through a chain entry, which values near the page end exercise.
    pub prp_list_offset: usize,
}

impl Default for QueueOptions {
    fn default() -> QueueOptions {
        QueueOptions { entries: 64, slot_bytes: None, data_offset: 0, prp_list_offset: 0 }
    }
}

#[derive(Clone, Copy, Debug)]
struct InFlight {
    opcode: u8,
    slba: u64,
    nlb: u32,
    submitted: Instant,
}

/// One completed command, valid for the duration of the callback that receives it.
#[derive(Debug)]
pub struct Completion<'a> {
    /// The queue the command ran on.
    pub qid: u16,
    /// The command's identifier there.
    pub cid: u16,
    /// The command's opcode ([`IoOpcode`] values for the commands this crate builds).
    pub opcode: u8,
    /// The first logical block the command covers (0 for a flush).
    pub slba: u64,
    /// Blocks it covers (0 for a flush).
    pub nlb: u32,
    /// How it ended; [`Completion::result`] turns a failure into an error.
    pub status: Status,
    /// From submission to the completion being seen.
    pub latency: Duration,
    data: &'a [u8],
}

impl Completion<'_> {
    /// What a successful read brought (empty for other commands and for failures).
    pub fn data(&self) -> &[u8] {
        self.data
    }

    /// The status as a typed error naming the queue, command and LBA range.
    pub fn result(&self) -> Result<(), NvmeError> {
        if self.status.is_success() {
            return Ok(());
        }
        Err(NvmeError::Command {
            qid: self.qid,
            cid: self.cid,
            opcode: self.opcode,
            slba: self.slba,
            nlb: self.nlb,
            status: self.status,
        })
    }
}

/// An I/O queue pair driven from one host thread at a time.
#[derive(Debug)]
pub struct IoQueuePair {
    raw: RawQueuePair,
    sq_ring: SqRing,
    cq_ring: CqRing,
    slots: SlotPool,
    data: DmaBuffer,
    data_stride: usize,
    data_offset: usize,
    lists: DmaBuffer,
    list_stride: usize,
    list_offset: usize,
    inflight: Vec<Option<InFlight>>,
    slot_bytes: u64,
    lba_size: u32,
    nsid: u32,
    mdts: u64,
    broken: Option<String>,
}

/// List bytes a slot of `bytes` needs wherever its data and list start: one entry per page, a chain entry per
/// page of list, and slack for the partial pages at either end.
fn list_bound(bytes: u64, data_offset: usize) -> usize {
    let pages = (bytes + data_offset as u64).div_ceil(PAGE_SIZE as u64) as usize + 1;
    (pages + pages / (PAGE_SIZE / 8 - 1) + 2) * 8
}

impl Controller {
    /// Creates an I/O queue pair with its slots.
    pub fn create_queue_pair(&self, opts: &QueueOptions) -> Result<IoQueuePair, NvmeError> {
        let ns = self.namespace();
        let mdts = self.info().max_transfer;
        let slot_bytes = opts.slot_bytes.unwrap_or(mdts);
        if slot_bytes < u64::from(ns.lba_size) || !slot_bytes.is_multiple_of(u64::from(ns.lba_size)) {
            return Err(NvmeError::invalid(
                "slot size",
                format!("{slot_bytes} bytes is not a multiple of the {}-byte block", ns.lba_size),
            ));
        }
        if !opts.data_offset.is_multiple_of(4) || opts.data_offset >= PAGE_SIZE {
            return Err(NvmeError::invalid("data offset", format!("{} (dword aligned, below 4096)", opts.data_offset)));
        }
        if !opts.prp_list_offset.is_multiple_of(8) || opts.prp_list_offset >= PAGE_SIZE {
            return Err(NvmeError::invalid(
                "PRP list offset",
                format!("{} (qword aligned, below 4096)", opts.prp_list_offset),
            ));
        }
        let raw = self.create_raw_queue_pair(opts.entries)?;
        let capacity = (opts.entries - 1).min(u32::from(u16::MAX)) as u16;
        let data_stride = (opts.data_offset as u64 + slot_bytes).next_multiple_of(PAGE_SIZE as u64) as usize;
        let list_stride = (opts.prp_list_offset + list_bound(slot_bytes, opts.data_offset)).next_multiple_of(PAGE_SIZE);
        let total = |stride: usize| {
            stride.checked_mul(usize::from(capacity)).ok_or_else(|| NvmeError::Dma {
                bytes: u64::MAX,
                reason: format!("{capacity} slots of {stride} bytes overflow"),
            })
        };
        let data = self.bus().alloc_dma(total(data_stride)?)?;
        let lists = self.bus().alloc_dma(total(list_stride)?)?;
        Ok(IoQueuePair {
            sq_ring: SqRing::new(opts.entries).ok_or_else(|| NvmeError::invalid("queue size", "entries"))?,
            cq_ring: CqRing::new(opts.entries).ok_or_else(|| NvmeError::invalid("queue size", "entries"))?,
            raw,
            slots: SlotPool::new(capacity),
            data,
            data_stride,
            data_offset: opts.data_offset,
            lists,
            list_stride,
            list_offset: opts.prp_list_offset,
            inflight: vec![None; usize::from(capacity)],
            slot_bytes,
            lba_size: ns.lba_size,
            nsid: ns.nsid,
            mdts,
            broken: None,
        })
    }
}

impl IoQueuePair {
    /// The pair's queue id.
    pub fn qid(&self) -> u16 {
        self.raw.qid()
    }

    /// Entries per queue.
    pub fn entries(&self) -> u32 {
        self.raw.entries()
    }

    /// Commands that can be in flight at once.
    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// Commands submitted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.slots.in_use()
    }

    /// Largest transfer per command.
    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// Where the submission tail and completion head stand, and the phase expected next.
    pub fn ring_state(&self) -> (u32, u32, bool) {
        (self.sq_ring.tail(), self.cq_ring.head(), self.cq_ring.phase())
    }

    fn check(&self) -> Result<(), NvmeError> {
        match &self.broken {
            Some(why) => Err(NvmeError::ControllerFailed(format!("queue {}: {why}", self.qid()))),
            None => Ok(()),
        }
    }

    fn check_size(&self, nlb: u32) -> Result<u64, NvmeError> {
        let bytes = u64::from(nlb) * u64::from(self.lba_size);
        if nlb == 0 {
            return Err(NvmeError::invalid("block count", "0 blocks"));
        }
        if bytes > self.mdts {
            return Err(NvmeError::TooLarge { bytes, limit: self.mdts, why: "the controller's MDTS" });
        }
        if bytes > self.slot_bytes {
            return Err(NvmeError::TooLarge { bytes, limit: self.slot_bytes, why: "the queue's slot size" });
        }
        Ok(bytes)
    }

    fn take_slot(&mut self) -> Result<u16, NvmeError> {
        if self.sq_ring.is_full() {
            return Err(NvmeError::QueueFull { qid: self.qid(), in_flight: self.in_flight() });
        }
        self.slots.take().ok_or(NvmeError::QueueFull { qid: self.qid(), in_flight: self.in_flight() })
    }

    fn slot_data_bus(&self, cid: u16) -> u64 {
        self.data.bus_addr() + (usize::from(cid) * self.data_stride + self.data_offset) as u64
    }

    /// Builds the PRPs for `bytes` of slot `cid` and stores its list.
    fn slot_prps(&self, cid: u16, bytes: u64) -> Result<(u64, u64), NvmeError> {
        let list_at = usize::from(cid) * self.list_stride + self.list_offset;
        let set = prp::build(
            self.slot_data_bus(cid),
            bytes,
            self.lists.bus_addr() + list_at as u64,
            self.list_stride - self.list_offset,
        )?;
        for (i, e) in set.list.iter().enumerate() {
            self.lists.store_u64(list_at + 8 * i, *e)?;
        }
        Ok((set.prp1, set.prp2))
    }

    fn push(&mut self, cid: u16, mut sqe: SubmissionEntry, slba: u64, nlb: u32) -> Result<u16, NvmeError> {
        sqe.cid = cid;
        let Some(at) = self.sq_ring.push() else {
            self.slots.give(cid);
            return Err(NvmeError::QueueFull { qid: self.qid(), in_flight: self.in_flight() });
        };
        if let Err(e) = write_sqe(self.raw.sq(), at, &sqe) {
            self.broken = Some(format!("writing a submission entry: {e}"));
            return Err(e);
        }
        self.inflight[usize::from(cid)] = Some(InFlight { opcode: sqe.opcode, slba, nlb, submitted: Instant::now() });
        let regs = self.raw.controller().bus().registers();
        regs.write32(self.raw.sq_doorbell(), self.sq_ring.tail())?;
        Ok(cid)
    }

    /// Submits a Read of `nlb` blocks from `slba` into a slot; returns the command id.
    pub fn submit_read(&mut self, slba: u64, nlb: u32) -> Result<u16, NvmeError> {
        self.check()?;
        let bytes = self.check_size(nlb)?;
        let cid = self.take_slot()?;
        let built = self.slot_prps(cid, bytes).and_then(|(prp1, prp2)| {
            SubmissionEntry::rw(IoOpcode::Read, cid, self.nsid, slba, nlb, prp1, prp2)
                .ok_or_else(|| NvmeError::invalid("block count", nlb.to_string()))
        });
        match built {
            Ok(sqe) => self.push(cid, sqe, slba, nlb),
            Err(e) => {
                self.slots.give(cid);
                Err(e)
            }
        }
    }

    /// Submits a Write of `data` (whole blocks) at `slba`; the bytes are copied into a slot first.
    pub fn submit_write(&mut self, slba: u64, data: &[u8]) -> Result<u16, NvmeError> {
        self.check()?;
        let lba = u64::from(self.lba_size);
        if data.is_empty() || !(data.len() as u64).is_multiple_of(lba) {
            return Err(NvmeError::invalid("write", format!("{} bytes is not a whole number of blocks", data.len())));
        }
        let nlb = u32::try_from(data.len() as u64 / lba).unwrap_or(u32::MAX);
        let bytes = self.check_size(nlb)?;
        let cid = self.take_slot()?;
        let at = usize::from(cid) * self.data_stride + self.data_offset;
        // SAFETY: the slot was free: no command that names its buffer is in flight, so the controller does not
        // touch it until the command submitted below.
        let built =
            unsafe { self.data.write(at, data) }.and_then(|()| self.slot_prps(cid, bytes)).and_then(|(prp1, prp2)| {
                SubmissionEntry::rw(IoOpcode::Write, cid, self.nsid, slba, nlb, prp1, prp2)
                    .ok_or_else(|| NvmeError::invalid("block count", nlb.to_string()))
            });
        match built {
            Ok(sqe) => self.push(cid, sqe, slba, nlb),
            Err(e) => {
                self.slots.give(cid);
                Err(e)
            }
        }
    }

    /// Submits a Flush.
    pub fn submit_flush(&mut self) -> Result<u16, NvmeError> {
        self.check()?;
        let cid = self.take_slot()?;
        self.push(cid, SubmissionEntry::flush(cid, self.nsid), 0, 0)
    }

    /// Submits `sqe` as it is, but for its command id, which is a slot's; the completion reports `slba`/`nlb`
    /// from CDW10-12.
    ///
    /// # Safety
    /// Memory the command points the controller at must be DMA memory that nothing else reads or writes until the
    /// command completes (not another slot's buffer or list: the controller would write under a live reference).
    pub unsafe fn submit_raw(&mut self, sqe: SubmissionEntry) -> Result<u16, NvmeError> {
        self.check()?;
        let cid = self.take_slot()?;
        let slba = u64::from(sqe.cdw10) | (u64::from(sqe.cdw11) << 32);
        self.push(cid, sqe, slba, (sqe.cdw12 & 0xFFFF) + 1)
    }

    /// Hands every completion posted so far to `f` (oldest first), frees their slots and rings the completion
    /// doorbell; returns how many there were.
    pub fn reap(&mut self, mut f: impl FnMut(Completion<'_>)) -> Result<usize, NvmeError> {
        self.check()?;
        let mut n = 0;
        while let Some(c) = read_cqe(self.raw.cq(), &self.cq_ring)? {
            self.cq_ring.advance();
            n += 1;
            let slot = usize::from(c.cid);
            let Some(cmd) = self.inflight.get_mut(slot).and_then(Option::take) else {
                let why = format!("completion for command id {} that is not in flight", c.cid);
                self.broken = Some(why.clone());
                return Err(NvmeError::ControllerFailed(why));
            };
            if !self.sq_ring.update_head(u32::from(c.sq_head)) {
                let why = format!("completion reports SQ head {} outside the queue's entries in use", c.sq_head);
                self.broken = Some(why.clone());
                return Err(NvmeError::ControllerFailed(why));
            }
            let is_read = cmd.opcode == IoOpcode::Read as u8;
            let len = if is_read && c.status.is_success() { u64::from(cmd.nlb) * u64::from(self.lba_size) } else { 0 };
            let at = slot * self.data_stride + self.data_offset;
            // SAFETY: the command completed, so the controller is done with this slot, and the slot is not given
            // out again before `f` returns.
            let data = unsafe { self.data.slice(at, len.min(self.slot_bytes) as usize) }?;
            f(Completion {
                qid: self.qid(),
                cid: c.cid,
                opcode: cmd.opcode,
                slba: cmd.slba,
                nlb: cmd.nlb,
                status: c.status,
                latency: cmd.submitted.elapsed(),
                data,
            });
            self.slots.give(c.cid);
        }
        if n > 0 {
            let regs = self.raw.controller().bus().registers();
            regs.write32(self.raw.cq_doorbell(), self.cq_ring.head())?;
        }
        Ok(n)
    }

    /// Like [`IoQueuePair::reap`], waiting up to `timeout` for at least one completion. A timeout leaves the
    /// queue unusable (its commands may still complete later).
    pub fn wait(&mut self, timeout: Duration, mut f: impl FnMut(Completion<'_>)) -> Result<usize, NvmeError> {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        let mut polls = 0u32;
        loop {
            let n = self.reap(&mut f)?;
            if n > 0 || self.in_flight() == 0 {
                return Ok(n);
            }
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(256)
                && let Some(why) = self.raw.controller().failure()
            {
                self.broken = Some(why.clone());
                return Err(NvmeError::ControllerFailed(why));
            }
            if start.elapsed() > timeout {
                self.broken = Some("a command timed out".into());
                return Err(NvmeError::Timeout {
                    what: format!("{} commands on queue {}", self.in_flight(), self.qid()),
                    waited_ms: start.elapsed().as_millis() as u64,
                });
            }
            backoff.idle();
        }
    }
}

/// What a load did.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// Which path moved the data.
    pub path: &'static str,
    /// Read commands completed.
    pub commands: u64,
    /// Bytes delivered to the destination.
    pub bytes: u64,
    /// Bytes the commands transferred (whole blocks).
    pub transferred: u64,
    /// Queue pairs used.
    pub queue_pairs: usize,
    /// Entries per queue.
    pub entries: u32,
    /// Wall time of the load.
    pub elapsed: Duration,
}

impl LoadReport {
    /// Commands completed per second.
    pub fn iops(&self) -> f64 {
        self.commands as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Delivered bytes per second, in GB/s.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }
}

/// The destination as an address that several threads write disjoint parts of.
struct Dest {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: threads only write disjoint ranges (the plan refuses overlapping destinations), and the buffer outlives
// the scope in which they run.
unsafe impl Sync for Dest {}

/// Reads `ranges` of the namespace into `dest`, one host thread per queue pair, commands handed out in plan order.
/// Every command's status is checked; the first failure stops the load and is returned (naming its LBAs) once the
/// commands in flight have completed.
pub fn load_host(queues: &mut [IoQueuePair], ranges: &[ByteRange], dest: &mut [u8]) -> Result<LoadReport, NvmeError> {
    let Some(first) = queues.first() else {
        return Err(NvmeError::invalid("queue pairs", "none given"));
    };
    let ctrl = first.raw.controller().clone();
    let ns = ctrl.namespace();
    let timeout = ctrl.timeout().max(Duration::from_secs(10));
    let max = queues.iter().map(|q| q.slot_bytes).min().unwrap_or(0);
    let chunks = plan(ranges, ns.lba_size, ns.lbas, max, dest.len() as u64)?;
    let lba = ns.lba_size;
    let dest = Dest { ptr: dest.as_mut_ptr(), len: dest.len() };
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let error: Mutex<Option<NvmeError>> = Mutex::new(None);
    let fail = |e: NvmeError| {
        stop.store(true, Ordering::Relaxed);
        error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
    };
    let start = Instant::now();
    let commands = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for q in queues.iter_mut() {
            let (chunks, dest, next, stop, fail, commands) = (&chunks, &dest, &next, &stop, &fail, &commands);
            s.spawn(move || {
                let mut of_cid: Vec<Option<Chunk>> = vec![None; q.capacity()];
                let mut exhausted = false;
                loop {
                    while !exhausted && !stop.load(Ordering::Relaxed) && q.in_flight() < q.capacity() {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(c) = chunks.get(i) else {
                            exhausted = true;
                            break;
                        };
                        match q.submit_read(c.slba, c.nlb) {
                            Ok(cid) => of_cid[usize::from(cid)] = Some(*c),
                            Err(e) => {
                                fail(e);
                                break;
                            }
                        }
                    }
                    if q.in_flight() == 0 && (exhausted || stop.load(Ordering::Relaxed)) {
                        return;
                    }
                    let r = q.wait(timeout, |done| {
                        let chunk = of_cid.get_mut(usize::from(done.cid)).and_then(Option::take);
                        if let Err(e) = done.result() {
                            fail(e);
                            return;
                        }
                        let Some(c) = chunk else { return };
                        let src = done.data().get(c.skip as usize..(c.skip + c.len) as usize);
                        let fits = (c.dest_offset as usize).checked_add(c.len as usize).is_some_and(|e| e <= dest.len);
                        match src {
                            Some(src) if fits => {
                                // SAFETY: the destination range is in bounds (checked above and by the plan) and
                                // no other chunk writes it (the plan refuses overlapping destinations).
                                unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        src.as_ptr(),
                                        dest.ptr.add(c.dest_offset as usize),
                                        src.len(),
                                    )
                                };
                                commands.fetch_add(1, Ordering::Relaxed);
                            }
                            _ => fail(NvmeError::invalid("completion", "read returned fewer bytes than planned")),
                        }
                    });
                    if let Err(e) = r {
                        fail(e);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(LoadReport {
        path: "cpu submitter",
        commands: commands.into_inner() as u64,
        bytes: chunks.iter().map(|c| u64::from(c.len)).sum(),
        transferred: chunks.iter().map(|c| c.bytes(lba)).sum(),
        queue_pairs: queues.len(),
        entries: queues.iter().map(IoQueuePair::entries).max().unwrap_or(0),
        elapsed: start.elapsed(),
    })
}
