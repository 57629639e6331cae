//! Host bring-up, written once against [`Bus`]: reset, admin queues, enable, Identify, queue counts, and I/O queue
//! pairs created and deleted by admin commands. The software controller and real drives under VFIO both go
//! through here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::bus::{Bus, DmaBuffer};
use crate::error::NvmeError;
use crate::queue::{CqRing, SqRing};
use crate::spec::{
    AdminOpcode, Aqa, CQE_BYTES, Cap, Cc, CompletionEntry, Csts, FEATURE_NUMBER_OF_QUEUES, IDENTIFY_BYTES,
    IdentifyController, IdentifyNamespace, PAGE_SIZE, SQE_BYTES, SubmissionEntry, Version, cns, cq_head_doorbell, reg,
    sq_tail_doorbell,
};

/// Largest transfer weightlift issues when a controller reports no limit (MDTS = 0).
const NO_MDTS_CAP: u64 = 1 << 20;

/// Choices made at bring-up.
#[derive(Clone, Debug)]
pub struct BringUp {
    /// Admin queue entries (2..=4096).
    pub admin_entries: u16,
    /// Namespace to use.
    pub nsid: u32,
    /// I/O queue pairs to ask for (Set Features, Number of Queues); the controller may grant fewer.
    pub io_queues: u16,
    /// How long to wait for the controller; `None` uses CAP.TO.
    pub timeout: Option<Duration>,
}

impl Default for BringUp {
    fn default() -> BringUp {
        BringUp { admin_entries: 32, nsid: 1, io_queues: 64, timeout: None }
    }
}

/// What bring-up learnt about the controller.
#[derive(Clone, Debug)]
pub struct ControllerInfo {
    /// Controller Capabilities (CAP) as read at bring-up.
    pub cap: Cap,
    /// The NVMe version the controller implements (VS).
    pub version: Version,
    /// Its Identify Controller data.
    pub identify: IdentifyController,
    /// Largest transfer per command in bytes (MDTS, or 1 MiB where the controller sets no limit).
    pub max_transfer: u64,
    /// I/O submission queues granted (Set Features, Number of Queues).
    pub io_sqs: u16,
    /// I/O completion queues granted.
    pub io_cqs: u16,
}

/// The namespace in use.
#[derive(Clone, Debug)]
pub struct NamespaceInfo {
    /// The namespace's identifier.
    pub nsid: u32,
    /// Its Identify Namespace data.
    pub identify: IdentifyNamespace,
    /// Bytes per logical block, in the format in use.
    pub lba_size: u32,
    /// Namespace size in blocks.
    pub lbas: u64,
}

impl NamespaceInfo {
    /// The namespace's size in bytes.
    pub fn bytes(&self) -> u64 {
        self.lbas.saturating_mul(u64::from(self.lba_size))
    }
}

/// Writes a submission entry into entry `index` of queue memory, dword by dword.
pub(crate) fn write_sqe(buf: &DmaBuffer, index: u32, sqe: &SubmissionEntry) -> Result<(), NvmeError> {
    let base = index as usize * SQE_BYTES;
    for (i, d) in sqe.to_dwords().iter().enumerate() {
        buf.store_u32(base + 4 * i, *d)?;
    }
    Ok(())
}

/// The completion at the ring's head if the controller posted it on this pass (DW3 read first, with acquire
/// ordering, so the other dwords are the controller's).
pub(crate) fn read_cqe(buf: &DmaBuffer, ring: &CqRing) -> Result<Option<CompletionEntry>, NvmeError> {
    let base = ring.head() as usize * CQE_BYTES;
    let dw3 = buf.load_u32(base + 12)?;
    if !ring.is_new(dw3) {
        return Ok(None);
    }
    let d = [buf.load_u32(base)?, buf.load_u32(base + 4)?, buf.load_u32(base + 8)?, dw3];
    Ok(Some(CompletionEntry::from_dwords(d)))
}

/// Sleeps a little longer each time nothing happened: spins first (a completion is often microseconds away), then
/// yields, then sleeps up to 1 ms.
#[derive(Debug, Default)]
pub(crate) struct Backoff(u32);

impl Backoff {
    pub fn reset(&mut self) {
        self.0 = 0;
    }
    pub fn idle(&mut self) {
        self.0 = self.0.saturating_add(1);
        match self.0 {
            0..=64 => std::hint::spin_loop(),
            65..=128 => std::thread::yield_now(),
            n => std::thread::sleep(Duration::from_micros(u64::from((n - 128).min(1000)))),
        }
    }
}

struct AdminQueue {
    sq: DmaBuffer,
    cq: DmaBuffer,
    sq_ring: SqRing,
    cq_ring: CqRing,
    next_cid: u16,
    /// A page for Identify data.
    page: DmaBuffer,
}

pub(crate) struct Shared {
    pub bus: Arc<dyn Bus>,
    pub info: ControllerInfo,
    pub ns: NamespaceInfo,
    pub timeout: Duration,
    admin: Mutex<AdminQueue>,
    /// Queue ids in use (index = qid).
    qids: Mutex<Vec<bool>>,
    /// Set once the controller stopped answering: later teardown does not wait for it again.
    dead: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Controller({}, nsid {})", self.bus.describe(), self.ns.nsid)
    }
}

impl Shared {
    fn dstrd(&self) -> u8 {
        self.info.cap.dstrd()
    }

    pub fn mark_dead(&self) {
        self.dead.store(true, Ordering::Relaxed);
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    fn admin_raw(&self, sqe: SubmissionEntry) -> Result<CompletionEntry, NvmeError> {
        let mut q = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        run_admin(&mut q, self.bus.as_ref(), self.dstrd(), sqe, self.timeout).inspect_err(|e| {
            if matches!(e, NvmeError::Timeout { .. }) {
                self.mark_dead();
            }
        })
    }

    fn admin_ok(&self, sqe: SubmissionEntry) -> Result<CompletionEntry, NvmeError> {
        let c = self.admin_raw(sqe)?;
        admin_status(&sqe, &c)?;
        Ok(c)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Disable the controller before the admin queues' memory goes: a disabled controller touches no memory.
        let regs = self.bus.registers();
        if let Ok(cc) = regs.read32(reg::CC) {
            let _ = regs.write32(reg::CC, Cc(cc).with_en(false).0);
            let wait = if self.is_dead() { Duration::from_millis(50) } else { self.timeout };
            if let Err(e) = wait_ready(self.bus.as_ref(), false, wait) {
                tracing::warn!("disabling the NVMe controller: {e}");
            }
        }
    }
}

fn admin_status(sqe: &SubmissionEntry, c: &CompletionEntry) -> Result<(), NvmeError> {
    if c.status.is_success() {
        return Ok(());
    }
    let name = AdminOpcode::from_u8(sqe.opcode).map_or("unknown", AdminOpcode::name);
    Err(NvmeError::Admin { name, opcode: sqe.opcode, status: c.status })
}

fn run_admin(
    q: &mut AdminQueue,
    bus: &dyn Bus,
    dstrd: u8,
    mut sqe: SubmissionEntry,
    timeout: Duration,
) -> Result<CompletionEntry, NvmeError> {
    let regs = bus.registers();
    sqe.cid = q.next_cid;
    q.next_cid = q.next_cid.wrapping_add(1);
    let slot = q.sq_ring.push().ok_or(NvmeError::QueueFull { qid: 0, in_flight: q.sq_ring.used() as usize })?;
    write_sqe(&q.sq, slot, &sqe)?;
    regs.write32(sq_tail_doorbell(0, dstrd), q.sq_ring.tail())?;
    let start = Instant::now();
    let mut backoff = Backoff::default();
    loop {
        while let Some(c) = read_cqe(&q.cq, &q.cq_ring)? {
            q.cq_ring.advance();
            regs.write32(cq_head_doorbell(0, dstrd), q.cq_ring.head())?;
            q.sq_ring.update_head(u32::from(c.sq_head));
            if c.cid == sqe.cid {
                return Ok(c);
            }
        }
        if Csts(regs.read32(reg::CSTS)?).cfs() {
            return Err(NvmeError::ControllerFailed("controller fatal status set during an admin command".into()));
        }
        if start.elapsed() > timeout {
            let name = AdminOpcode::from_u8(sqe.opcode).map_or("unknown", AdminOpcode::name);
            return Err(NvmeError::Timeout {
                what: format!("admin command {name}"),
                waited_ms: start.elapsed().as_millis() as u64,
            });
        }
        backoff.idle();
    }
}

fn wait_ready(bus: &dyn Bus, ready: bool, timeout: Duration) -> Result<(), NvmeError> {
    let regs = bus.registers();
    let start = Instant::now();
    let mut backoff = Backoff::default();
    loop {
        let csts = Csts(regs.read32(reg::CSTS)?);
        if csts.0 == u32::MAX {
            return Err(NvmeError::ControllerFailed("CSTS reads all ones: the device is gone".into()));
        }
        if ready && csts.cfs() {
            return Err(NvmeError::ControllerFailed(
                "controller fatal status (CSTS.CFS) while enabling: bad admin queue or configuration".into(),
            ));
        }
        if csts.rdy() == ready {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(NvmeError::Timeout {
                what: format!("CSTS.RDY to become {}", u8::from(ready)),
                waited_ms: start.elapsed().as_millis() as u64,
            });
        }
        backoff.idle();
    }
}

/// A controller brought up and ready for I/O queues. Cloning shares it; the controller is disabled when the last
/// clone and the last queue pair are gone.
#[derive(Clone, Debug)]
pub struct Controller {
    pub(crate) shared: Arc<Shared>,
}

impl Controller {
    /// Resets the controller, sets up the admin queues, enables it, identifies it and namespace `opts.nsid`, and
    /// asks for `opts.io_queues` I/O queue pairs.
    pub fn bring_up(bus: Arc<dyn Bus>, opts: BringUp) -> Result<Controller, NvmeError> {
        let regs = bus.registers();
        let cap = Cap(regs.read64(reg::CAP)?);
        if cap.0 == u64::MAX {
            return Err(NvmeError::ControllerFailed("CAP reads all ones: the device is gone or BAR0 unmapped".into()));
        }
        let version = Version(regs.read32(reg::VS)?);
        if !cap.nvm_command_set() {
            return Err(NvmeError::Unsupported("the controller does not support the NVM command set".into()));
        }
        if cap.mpsmin() != 0 {
            return Err(NvmeError::Unsupported(format!(
                "the controller's smallest memory page is {} bytes; weightlift uses 4 KiB pages",
                PAGE_SIZE << cap.mpsmin()
            )));
        }
        let timeout = opts.timeout.unwrap_or(Duration::from_millis(500 * u64::from(cap.to().max(1))));
        let admin_entries = u32::from(opts.admin_entries);
        if !(2..=4096.min(cap.max_queue_entries())).contains(&admin_entries) {
            return Err(NvmeError::invalid(
                "admin queue size",
                format!("{admin_entries} entries (the controller takes 2..={})", cap.max_queue_entries().min(4096)),
            ));
        }

        // Reset: a controller left enabled (by a previous user) is disabled first.
        let cc = Cc(regs.read32(reg::CC)?);
        if cc.en() {
            regs.write32(reg::CC, cc.with_en(false).0)?;
        }
        wait_ready(bus.as_ref(), false, timeout)?;

        let sq = bus.alloc_dma(admin_entries as usize * SQE_BYTES)?;
        let cq = bus.alloc_dma(admin_entries as usize * CQE_BYTES)?;
        let page = bus.alloc_dma(IDENTIFY_BYTES)?;
        let aqa = Aqa::new(opts.admin_entries, opts.admin_entries)
            .ok_or_else(|| NvmeError::invalid("admin queue size", admin_entries.to_string()))?;
        regs.write32(reg::AQA, aqa.0)?;
        regs.write64(reg::ASQ, sq.bus_addr())?;
        regs.write64(reg::ACQ, cq.bus_addr())?;
        regs.write32(reg::CC, Cc::weightlift().with_en(true).0)?;
        wait_ready(bus.as_ref(), true, timeout)?;

        let sq_ring = SqRing::new(admin_entries).ok_or_else(|| NvmeError::invalid("admin queue", "size"))?;
        let cq_ring = CqRing::new(admin_entries).ok_or_else(|| NvmeError::invalid("admin queue", "size"))?;
        let mut admin = AdminQueue { sq, cq, sq_ring, cq_ring, next_cid: 0, page };
        let dstrd = cap.dstrd();
        let admin_cmd = |admin: &mut AdminQueue, sqe: SubmissionEntry| -> Result<CompletionEntry, NvmeError> {
            let c = run_admin(admin, bus.as_ref(), dstrd, sqe, timeout)?;
            admin_status(&sqe, &c)?;
            Ok(c)
        };

        let page = admin.page.bus_addr();
        admin_cmd(&mut admin, SubmissionEntry::identify(0, cns::CONTROLLER, 0, page))?;
        let identify = IdentifyController::from_bytes(&read_page(&admin)?)?;
        check_entry_sizes(&identify)?;
        let nsid = opts.nsid;
        admin_cmd(&mut admin, SubmissionEntry::identify(0, cns::NAMESPACE, nsid, page))?;
        let ns_id = IdentifyNamespace::from_bytes(&read_page(&admin)?)?;
        let lba_size = ns_id.lba_size()?;
        if ns_id.nsze == 0 {
            return Err(NvmeError::invalid("namespace", format!("namespace {nsid} is empty (NSZE 0)")));
        }

        let want = u32::from(opts.io_queues.max(1) - 1);
        let c = admin_cmd(&mut admin, SubmissionEntry::set_features(0, FEATURE_NUMBER_OF_QUEUES, want | (want << 16)))?;
        // Counts come back 0's based.
        let io_sqs = ((c.dw0 & 0xFFFF) + 1).min(u32::from(opts.io_queues.max(1))) as u16;
        let io_cqs = ((c.dw0 >> 16) + 1).min(u32::from(opts.io_queues.max(1))) as u16;

        let max_transfer = identify.max_transfer(PAGE_SIZE).map_or(NO_MDTS_CAP, |m| m.min(u64::from(lba_size) << 16));
        let info = ControllerInfo { cap, version, identify, max_transfer, io_sqs, io_cqs };
        let ns = NamespaceInfo { nsid, lba_size, lbas: ns_id.nsze, identify: ns_id };
        let qids = vec![false; usize::from(io_sqs.min(io_cqs)) + 1];
        Ok(Controller {
            shared: Arc::new(Shared {
                bus,
                info,
                ns,
                timeout,
                admin: Mutex::new(admin),
                qids: Mutex::new(qids),
                dead: AtomicBool::new(false),
            }),
        })
    }

    /// What bring-up learnt about the controller.
    pub fn info(&self) -> &ControllerInfo {
        &self.shared.info
    }

    /// The namespace reads and writes go to.
    pub fn namespace(&self) -> &NamespaceInfo {
        &self.shared.ns
    }

    /// The controller's registers and DMA memory.
    pub fn bus(&self) -> &Arc<dyn Bus> {
        &self.shared.bus
    }

    /// How long commands are waited for.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Why the controller can no longer be used, if it cannot: fatal status, or it stopped answering.
    pub fn failure(&self) -> Option<String> {
        match self.shared.bus.registers().read32(reg::CSTS) {
            Ok(v) if Csts(v).cfs() => Some("controller fatal status (CSTS.CFS) set".into()),
            Ok(v) if !Csts(v).rdy() => Some("controller no longer ready (CSTS.RDY clear)".into()),
            Err(e) => Some(e.to_string()),
            _ if self.shared.is_dead() => Some("controller stopped answering admin commands".into()),
            _ => None,
        }
    }

    /// Identify Controller, read again.
    pub fn identify_controller(&self) -> Result<IdentifyController, NvmeError> {
        let mut q = self.shared.admin.lock().unwrap_or_else(|p| p.into_inner());
        let sqe = SubmissionEntry::identify(0, cns::CONTROLLER, 0, q.page.bus_addr());
        let c = run_admin(&mut q, self.shared.bus.as_ref(), self.shared.dstrd(), sqe, self.shared.timeout)?;
        admin_status(&sqe, &c)?;
        IdentifyController::from_bytes(&read_page(&q)?)
    }

    /// Identify Namespace `nsid`.
    pub fn identify_namespace(&self, nsid: u32) -> Result<IdentifyNamespace, NvmeError> {
        let mut q = self.shared.admin.lock().unwrap_or_else(|p| p.into_inner());
        let sqe = SubmissionEntry::identify(0, cns::NAMESPACE, nsid, q.page.bus_addr());
        let c = run_admin(&mut q, self.shared.bus.as_ref(), self.shared.dstrd(), sqe, self.shared.timeout)?;
        admin_status(&sqe, &c)?;
        IdentifyNamespace::from_bytes(&read_page(&q)?)
    }

    /// Get Features `fid`: the completion's DW0.
    pub fn get_features(&self, fid: u8) -> Result<u32, NvmeError> {
        Ok(self.shared.admin_ok(SubmissionEntry::get_features(0, fid))?.dw0)
    }

    /// Delete I/O Submission Queue `qid` (a queue pair's queues are deleted when it is dropped; this is for
    /// queues set up with [`Controller::admin_raw`]).
    pub fn delete_io_sq(&self, qid: u16) -> Result<(), NvmeError> {
        self.shared.admin_ok(SubmissionEntry::delete_io_sq(0, qid)).map(|_| ())
    }

    /// Delete I/O Completion Queue `qid`.
    pub fn delete_io_cq(&self, qid: u16) -> Result<(), NvmeError> {
        self.shared.admin_ok(SubmissionEntry::delete_io_cq(0, qid)).map(|_| ())
    }

    /// Submits any admin command (its CID is replaced) and returns its completion, whatever its status.
    ///
    /// # Safety
    /// Memory the command points the controller at (PRPs, queue base addresses) must be DMA memory that nothing
    /// else reads or writes while the controller may use it: the controller writes there without further checks.
    pub unsafe fn admin_raw(&self, sqe: SubmissionEntry) -> Result<CompletionEntry, NvmeError> {
        self.shared.admin_raw(sqe)
    }

    /// Creates an I/O completion queue and submission queue of `entries` entries (same queue id), in fresh DMA
    /// memory. Dropping the pair deletes both queues.
    pub fn create_raw_queue_pair(&self, entries: u32) -> Result<RawQueuePair, NvmeError> {
        let max = self.shared.info.cap.max_queue_entries();
        if !(2..=max).contains(&entries) {
            return Err(NvmeError::invalid(
                "queue size",
                format!("{entries} entries (the controller takes 2..={max})"),
            ));
        }
        let qid = {
            let mut qids = self.shared.qids.lock().unwrap_or_else(|p| p.into_inner());
            let free = qids.iter().skip(1).position(|used| !used).map(|i| i + 1);
            let Some(q) = free else {
                return Err(NvmeError::invalid(
                    "queue pairs",
                    format!("all {} granted I/O queue pairs are in use", qids.len() - 1),
                ));
            };
            qids[q] = true;
            q as u16
        };
        let release = |shared: &Shared| {
            let mut qids = shared.qids.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(u) = qids.get_mut(usize::from(qid)) {
                *u = false;
            }
        };
        let made = (|| {
            let cq = self.shared.bus.alloc_dma(entries as usize * CQE_BYTES)?;
            let sq = self.shared.bus.alloc_dma(entries as usize * SQE_BYTES)?;
            self.shared.admin_ok(SubmissionEntry::create_io_cq(0, qid, entries, cq.bus_addr()))?;
            if let Err(e) = self.shared.admin_ok(SubmissionEntry::create_io_sq(0, qid, entries, qid, sq.bus_addr())) {
                let _ = self.shared.admin_ok(SubmissionEntry::delete_io_cq(0, qid));
                return Err(e);
            }
            Ok((sq, cq))
        })();
        match made {
            Ok((sq, cq)) => {
                let dstrd = self.shared.dstrd();
                Ok(RawQueuePair {
                    ctrl: self.clone(),
                    qid,
                    entries,
                    sq,
                    cq,
                    sq_doorbell: sq_tail_doorbell(qid, dstrd),
                    cq_doorbell: cq_head_doorbell(qid, dstrd),
                })
            }
            Err(e) => {
                release(&self.shared);
                Err(e)
            }
        }
    }
}

fn read_page(q: &AdminQueue) -> Result<Vec<u8>, NvmeError> {
    // SAFETY: the admin queue is driven synchronously under its lock: the Identify that wrote the page has
    // completed and no other command targets the page until the lock is released.
    Ok(unsafe { q.page.slice(0, IDENTIFY_BYTES) }?.to_vec())
}

fn check_entry_sizes(id: &IdentifyController) -> Result<(), NvmeError> {
    let fits = |v: u8, want: u8| (v & 0xF) <= want && want <= (v >> 4);
    if !fits(id.sqes, 6) || !fits(id.cqes, 4) {
        return Err(NvmeError::Unsupported(format!(
            "the controller's queue entry sizes (SQES {:#04x}, CQES {:#04x}) do not allow 64/16-byte entries",
            id.sqes, id.cqes
        )));
    }
    Ok(())
}

/// An I/O submission queue and its completion queue, created on the controller; the memory and queue id are held
/// until drop, which deletes both queues first.
#[derive(Debug)]
pub struct RawQueuePair {
    ctrl: Controller,
    qid: u16,
    entries: u32,
    sq: DmaBuffer,
    cq: DmaBuffer,
    sq_doorbell: usize,
    cq_doorbell: usize,
}

impl RawQueuePair {
    /// The pair's queue id (its submission and completion queues share it).
    pub fn qid(&self) -> u16 {
        self.qid
    }
    /// Entries per queue.
    pub fn entries(&self) -> u32 {
        self.entries
    }
    /// The submission queue's memory (`entries` entries of 64 bytes).
    pub fn sq(&self) -> &DmaBuffer {
        &self.sq
    }
    /// The completion queue's memory (`entries` entries of 16 bytes).
    pub fn cq(&self) -> &DmaBuffer {
        &self.cq
    }
    /// BAR0 offset of the Submission Queue Tail doorbell.
    pub fn sq_doorbell(&self) -> usize {
        self.sq_doorbell
    }
    /// BAR0 offset of the Completion Queue Head doorbell.
    pub fn cq_doorbell(&self) -> usize {
        self.cq_doorbell
    }
    /// The controller the pair belongs to.
    pub fn controller(&self) -> &Controller {
        &self.ctrl
    }
}

impl Drop for RawQueuePair {
    fn drop(&mut self) {
        let shared = &self.ctrl.shared;
        // Delete the queues before their memory is freed; a dead controller is disabled by `Shared`'s drop instead.
        if !shared.is_dead() {
            for (what, r) in [
                ("submission", shared.admin_ok(SubmissionEntry::delete_io_sq(0, self.qid))),
                ("completion", shared.admin_ok(SubmissionEntry::delete_io_cq(0, self.qid))),
            ] {
                if let Err(e) = r {
                    tracing::warn!("deleting I/O {what} queue {}: {e}", self.qid);
                    // The queue may still be live in the controller: disable it now so it cannot touch the memory
                    // about to be freed.
                    let regs = shared.bus.registers();
                    if let Ok(cc) = regs.read32(reg::CC) {
                        let _ = regs.write32(reg::CC, Cc(cc).with_en(false).0);
                        let _ = wait_ready(shared.bus.as_ref(), false, shared.timeout);
                    }
                    shared.mark_dead();
                    break;
                }
            }
        }
        let mut qids = shared.qids.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = qids.get_mut(usize::from(self.qid)) {
            *u = false;
        }
    }
}
