//! The software controller's threads: one serves the registers (enable, reset, shutdown) and the admin queue, the
//! others serve I/O queues. Every access to host memory goes through the IOMMU table; queue entries and doorbells
//! are read and written atomically, and a completion's DW3 (with the phase tag) is stored last, after a release
//! fence, so whoever polls it (a host thread or a GPU) sees the whole entry and the data before it.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use super::config::{Fault, SoftConfig, SoftStats};
use super::iommu::{Iommu, Region};
use crate::error::NvmeError;
use crate::host::Backoff;
use crate::prp;
use crate::queue::{CqProducer, SqConsumer};
use crate::spec::{
    AdminCommand, Aqa, CQE_BYTES, Cap, Cc, CompletionEntry, Csts, DOORBELL_BASE, FEATURE_NUMBER_OF_QUEUES,
    IDENTIFY_BYTES, IdentifyController, IdentifyNamespace, IoCommand, IoOpcode, PAGE_SIZE, SQE_BYTES, Status,
    SubmissionEntry, Version, cns, cq_head_doorbell, parse_admin, parse_io, reg, sq_tail_doorbell,
};

/// CAP.TO: 10 seconds to become ready, in 500 ms units.
const READY_TIMEOUT_UNITS: u8 = 20;

struct Pending {
    cid: u16,
    status: Status,
    dw0: u32,
    sq_head: u16,
    due: Instant,
}

struct SqRun {
    consumer: SqConsumer,
    deleted: bool,
    pending: VecDeque<Pending>,
}

struct SimCq {
    qid: u16,
    base: u64,
    entries: u32,
    producer: Mutex<CqProducer>,
    /// Submission queues completing here: a CQ with any cannot be deleted.
    attached: AtomicU32,
}

struct SimSq {
    qid: u16,
    cq: Arc<SimCq>,
    base: u64,
    entries: u32,
    run: Mutex<SqRun>,
}

#[derive(Default)]
struct Table {
    sqs: Vec<Option<Arc<SimSq>>>,
    cqs: Vec<Option<Arc<SimCq>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// State shared by the controller's threads and the bus handed to the host.
pub(crate) struct SimShared {
    pub path: PathBuf,
    file: File,
    lbas: u64,
    config: SoftConfig,
    /// The register page; accessed only through `regs` (atomically).
    _page: MmapMut,
    regs: NonNull<u8>,
    regs_len: usize,
    pub iommu: Arc<Iommu>,
    pub latency_ns: AtomicU64,
    pub faults: Mutex<Vec<Fault>>,
    pub stop: AtomicBool,
    pub fatal: Mutex<Option<String>>,
    /// Set while enabled and not failed: I/O threads serve queues only then.
    ready: AtomicBool,
    table: RwLock<Table>,
    /// Bumped whenever queues are created or deleted, so I/O threads refresh their lists.
    generation: AtomicU64,
    /// I/O queue pairs granted by Set Features (Number of Queues).
    granted: AtomicU32,
    io_commands: AtomicU64,
    admin_commands: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

// SAFETY: `regs` points into `_page`, owned by this struct, and is only accessed with atomic operations; everything
// else is Send/Sync on its own.
unsafe impl Send for SimShared {}
// SAFETY: as above.
unsafe impl Sync for SimShared {}

impl std::fmt::Debug for SimShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimShared({}, {} blocks of {} bytes)", self.path.display(), self.lbas, self.config.lba_size)
    }
}

impl SimShared {
    pub fn new(path: PathBuf, file: File, file_len: u64, config: SoftConfig) -> Result<SimShared, NvmeError> {
        let lbas = file_len.div_ceil(u64::from(config.lba_size));
        let queues = usize::from(config.max_io_queues) + 1;
        let regs_len = (DOORBELL_BASE + queues * 2 * (4usize << config.doorbell_stride)).next_multiple_of(PAGE_SIZE);
        let mut page = MmapMut::map_anon(regs_len)
            .map_err(|e| NvmeError::Dma { bytes: regs_len as u64, reason: format!("register page: {e}") })?;
        let regs = NonNull::new(page.as_mut_ptr())
            .ok_or_else(|| NvmeError::Dma { bytes: regs_len as u64, reason: "register page at null".into() })?;
        let sh = SimShared {
            path,
            file,
            lbas,
            latency_ns: AtomicU64::new(config.latency.as_nanos().min(u128::from(u64::MAX)) as u64),
            granted: AtomicU32::new(u32::from(config.max_io_queues)),
            config,
            _page: page,
            regs,
            regs_len,
            iommu: Arc::new(Iommu::default()),
            faults: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            fatal: Mutex::new(None),
            ready: AtomicBool::new(false),
            table: RwLock::new(Table { sqs: vec![None; queues], cqs: vec![None; queues] }),
            generation: AtomicU64::new(0),
            io_commands: AtomicU64::new(0),
            admin_commands: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
        };
        let cap = Cap::new(sh.config.max_queue_entries, true, READY_TIMEOUT_UNITS, sh.config.doorbell_stride, 0, 0);
        sh.set_reg(reg::CAP, cap.0 as u32);
        sh.set_reg(reg::CAP + 4, (cap.0 >> 32) as u32);
        sh.set_reg(reg::VS, Version::V2_0.0);
        Ok(sh)
    }

    pub fn register_page(&self) -> (NonNull<u8>, usize) {
        (self.regs, self.regs_len)
    }

    pub fn stats(&self) -> SoftStats {
        SoftStats {
            io_commands: self.io_commands.load(Ordering::Relaxed),
            admin_commands: self.admin_commands.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
        }
    }

    fn reg_atomic(&self, offset: usize) -> Option<&AtomicU32> {
        if !offset.is_multiple_of(4) || offset + 4 > self.regs_len {
            return None;
        }
        // SAFETY: in bounds and aligned within the page this struct owns; every access to the page is atomic (the
        // host's through `Mmio` with `MmioKind::Memory`).
        Some(unsafe { AtomicU32::from_ptr(self.regs.as_ptr().add(offset).cast()) })
    }

    fn reg(&self, offset: usize) -> u32 {
        self.reg_atomic(offset).map_or(0, |r| r.load(Ordering::Acquire))
    }

    fn set_reg(&self, offset: usize, value: u32) {
        if let Some(r) = self.reg_atomic(offset) {
            r.store(value, Ordering::Release);
        }
    }

    fn reg64(&self, offset: usize) -> u64 {
        u64::from(self.reg(offset)) | (u64::from(self.reg(offset + 4)) << 32)
    }

    fn dstrd(&self) -> u8 {
        self.config.doorbell_stride
    }

    fn latency(&self) -> Duration {
        Duration::from_nanos(self.latency_ns.load(Ordering::Relaxed))
    }

    fn set_fatal(&self, why: String) {
        tracing::warn!("software NVMe controller failed: {why}");
        self.ready.store(false, Ordering::Release);
        self.set_reg(reg::CSTS, self.reg(reg::CSTS) | Csts::CFS);
        lock(&self.fatal).get_or_insert(why);
    }

    fn is_fatal(&self) -> bool {
        Csts(self.reg(reg::CSTS)).cfs()
    }

    /// CC.EN went 1: check the configuration and the admin queues, then report ready.
    fn enable(&self, cc: Cc) -> Result<(), String> {
        if cc.css() != 0 || cc.mps() != 0 || cc.ams() != 0 {
            return Err(format!(
                "CC {:#x} selects command set {}, page size {} or arbitration {} that this controller lacks",
                cc.0,
                cc.css(),
                PAGE_SIZE << cc.mps(),
                cc.ams()
            ));
        }
        let aqa = Aqa(self.reg(reg::AQA));
        let (asq, acq) = (self.reg64(reg::ASQ), self.reg64(reg::ACQ));
        for (what, base, entries, size) in [
            ("admin submission queue", asq, aqa.sq_entries(), SQE_BYTES),
            ("admin completion queue", acq, aqa.cq_entries(), CQE_BYTES),
        ] {
            if entries < 2 {
                return Err(format!("{what} of {entries} entries"));
            }
            if base == 0
                || base % PAGE_SIZE as u64 != 0
                || !self.iommu.host_contains(base, u64::from(entries) * size as u64)
            {
                return Err(format!(
                    "{what} at {base:#x} ({entries} entries) is not page aligned memory mapped for DMA"
                ));
            }
        }
        let cq = Arc::new(SimCq {
            qid: 0,
            base: acq,
            entries: aqa.cq_entries(),
            producer: Mutex::new(CqProducer::new(aqa.cq_entries()).ok_or("admin CQ size")?),
            attached: AtomicU32::new(1),
        });
        let sq = Arc::new(SimSq {
            qid: 0,
            cq: cq.clone(),
            base: asq,
            entries: aqa.sq_entries(),
            run: Mutex::new(SqRun {
                consumer: SqConsumer::new(aqa.sq_entries()).ok_or("admin SQ size")?,
                deleted: false,
                pending: VecDeque::new(),
            }),
        });
        let mut t = self.table.write().unwrap_or_else(|p| p.into_inner());
        t.cqs[0] = Some(cq);
        t.sqs[0] = Some(sq);
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// CC.EN went 0: drop every queue (no thread touches their memory after this), clear the doorbells and status.
    fn reset(&self) {
        self.ready.store(false, Ordering::Release);
        let mut t = self.table.write().unwrap_or_else(|p| p.into_inner());
        for sq in t.sqs.iter().flatten() {
            lock(&sq.run).deleted = true;
        }
        t.sqs.iter_mut().for_each(|s| *s = None);
        t.cqs.iter_mut().for_each(|c| *c = None);
        drop(t);
        self.generation.fetch_add(1, Ordering::AcqRel);
        for off in (DOORBELL_BASE..self.regs_len).step_by(4) {
            self.set_reg(off, 0);
        }
        self.granted.store(u32::from(self.config.max_io_queues), Ordering::Relaxed);
        lock(&self.fatal).take();
        self.set_reg(reg::CSTS, 0);
    }

    fn read_sqe(&self, addr: u64) -> Option<SubmissionEntry> {
        let mut d = [0u32; 16];
        for (i, w) in d.iter_mut().enumerate() {
            *w = self.iommu.load_u32(addr + 4 * i as u64)?;
        }
        Some(SubmissionEntry::from_dwords(d))
    }

    /// Posts one completion unless the CQ is full (`Ok(false)`).
    fn post(&self, cq: &SimCq, sqid: u16, p: &Pending) -> Result<bool, String> {
        let mut prod = lock(&cq.producer);
        let head = self.reg(cq_head_doorbell(cq.qid, self.dstrd()));
        if !prod.set_head(head) {
            return Err(format!(
                "completion queue {} head doorbell written with {head}, beyond its {} entries",
                cq.qid, cq.entries
            ));
        }
        let Some((at, phase)) = prod.push() else { return Ok(false) };
        let addr = cq.base + u64::from(at) * CQE_BYTES as u64;
        let entry = CompletionEntry {
            dw0: p.dw0,
            dw1: 0,
            sq_head: p.sq_head,
            sq_id: sqid,
            cid: p.cid,
            phase,
            status: p.status,
        }
        .to_dwords();
        let mut ok = true;
        for (i, d) in entry.iter().take(3).enumerate() {
            ok &= self.iommu.store_u32(addr + 4 * i as u64, *d, Ordering::Relaxed);
        }
        // The data and DW0-2 become visible before the phase tag that announces them.
        fence(Ordering::Release);
        ok &= self.iommu.store_u32(addr + 12, entry[3], Ordering::Release);
        if !ok {
            return Err(format!("completion queue {} entry at {addr:#x} is not mapped for DMA", cq.qid));
        }
        Ok(true)
    }

    fn post_due(&self, sq: &SimSq, pending: &mut VecDeque<Pending>, force: bool) -> Result<bool, String> {
        let now = Instant::now();
        let mut progress = false;
        while let Some(p) = pending.front() {
            if !force && p.due > now {
                break;
            }
            if !self.post(&sq.cq, sq.qid, p)? {
                break;
            }
            pending.pop_front();
            progress = true;
        }
        Ok(progress)
    }

    /// Fetches and executes what the host submitted on `sq`, then posts the completions that are due. Returns
    /// whether anything happened and when the next held completion is due.
    fn serve(
        &self,
        sq: &SimSq,
        latency: Duration,
        exec: &mut dyn FnMut(&SubmissionEntry) -> (Status, u32),
    ) -> Result<(bool, Option<Instant>), String> {
        let mut run = lock(&sq.run);
        if run.deleted {
            return Ok((false, None));
        }
        let tail = self.reg(sq_tail_doorbell(sq.qid, self.dstrd()));
        let now = Instant::now();
        let mut progress = false;
        while run.pending.len() < sq.entries as usize {
            let slot = match run.consumer.pop(tail) {
                Ok(Some(s)) => s,
                Ok(None) => break,
                Err(t) => {
                    return Err(format!(
                        "submission queue {} tail doorbell written with {t}, beyond its {} entries",
                        sq.qid, sq.entries
                    ));
                }
            };
            let addr = sq.base + u64::from(slot) * SQE_BYTES as u64;
            let sqe = self
                .read_sqe(addr)
                .ok_or_else(|| format!("submission queue {} entry at {addr:#x} is not mapped for DMA", sq.qid))?;
            let (status, dw0) = exec(&sqe);
            let sq_head = run.consumer.head() as u16;
            run.pending.push_back(Pending { cid: sqe.cid, status, dw0, sq_head, due: now + latency });
            progress = true;
        }
        progress |= self.post_due(sq, &mut run.pending, false)?;
        Ok((progress, run.pending.front().map(|p| p.due)))
    }

    fn fault(&self, op: IoOpcode, slba: u64, nlb: u32) -> Option<Status> {
        let faults = lock(&self.faults);
        let end = slba.saturating_add(u64::from(nlb));
        faults.iter().find(|f| f.op.is_none_or(|o| o == op) && (slba..end).contains(&f.lba)).map(|f| f.status)
    }

    fn exec_io(&self, sqe: &SubmissionEntry, scratch: &mut Vec<u8>) -> (Status, u32) {
        self.io_commands.fetch_add(1, Ordering::Relaxed);
        let status = match parse_io(sqe) {
            Err(s) => s,
            Ok(IoCommand::Flush { nsid }) => {
                if nsid != 1 && nsid != u32::MAX {
                    Status::INVALID_NAMESPACE
                } else if self.config.writable && self.file.sync_data().is_err() {
                    Status::WRITE_FAULT
                } else {
                    Status::SUCCESS
                }
            }
            Ok(IoCommand::Read { nsid, slba, nlb, prp1, prp2 }) => {
                self.rw(IoOpcode::Read, nsid, slba, nlb, prp1, prp2, scratch)
            }
            Ok(IoCommand::Write { nsid, slba, nlb, prp1, prp2 }) => {
                self.rw(IoOpcode::Write, nsid, slba, nlb, prp1, prp2, scratch)
            }
        };
        (status, 0)
    }

    #[allow(clippy::too_many_arguments)]
    fn rw(&self, op: IoOpcode, nsid: u32, slba: u64, nlb: u32, prp1: u64, prp2: u64, scratch: &mut Vec<u8>) -> Status {
        if nsid != 1 {
            return Status::INVALID_NAMESPACE;
        }
        if slba.checked_add(u64::from(nlb)).is_none_or(|end| end > self.lbas) {
            return Status::LBA_OUT_OF_RANGE;
        }
        let lba = u64::from(self.config.lba_size);
        let bytes = u64::from(nlb) * lba;
        if bytes > (PAGE_SIZE as u64) << self.config.mdts {
            return Status::INVALID_FIELD;
        }
        if op == IoOpcode::Write && !self.config.writable {
            return Status::NAMESPACE_WRITE_PROTECTED;
        }
        if let Some(s) = self.fault(op, slba, nlb) {
            return s;
        }
        let segs = match prp::walk(prp1, prp2, bytes, |a| self.iommu.load_u64(a).ok_or(Status::DATA_TRANSFER_ERROR)) {
            Ok(s) => s,
            Err(s) => return s,
        };
        let mut off = slba * lba;
        for seg in segs {
            let (mut addr, mut left) = (seg.addr, seg.len);
            while left > 0 {
                let moved = self.iommu.access(addr, left, |region, n| self.move_piece(op, region, n, off, scratch));
                match moved {
                    None => return Status::DATA_TRANSFER_ERROR,
                    Some((Err(s), _)) => return s,
                    Some((Ok(()), n)) => {
                        addr += n;
                        left -= n;
                        off += n;
                    }
                }
            }
        }
        let counter = if op == IoOpcode::Read { &self.bytes_read } else { &self.bytes_written };
        counter.fetch_add(bytes, Ordering::Relaxed);
        Status::SUCCESS
    }

    /// Moves `n` bytes between the backing file at `off` and one piece of memory.
    fn move_piece(
        &self,
        op: IoOpcode,
        region: Region<'_>,
        n: u64,
        off: u64,
        scratch: &mut Vec<u8>,
    ) -> Result<(), Status> {
        let n = n as usize;
        match (op, region) {
            (IoOpcode::Read, Region::Host(p)) => {
                // SAFETY: `n` bytes at `p` lie in a host window held mapped for this call; the host handed them to
                // this command, so no one else accesses them until its completion is posted.
                let buf = unsafe { std::slice::from_raw_parts_mut(p, n) };
                self.read_full(buf, off)
            }
            (IoOpcode::Read, Region::Device(dma, a)) => {
                scratch.resize(n, 0);
                self.read_full(scratch, off)?;
                dma.write(a, scratch).map_err(|e| {
                    tracing::warn!("software NVMe: device write of {n} bytes at {a:#x}: {e}");
                    Status::DATA_TRANSFER_ERROR
                })
            }
            (IoOpcode::Write, Region::Host(p)) => {
                // SAFETY: as for reads; the controller only reads the memory here.
                let buf = unsafe { std::slice::from_raw_parts(p.cast_const(), n) };
                self.file.write_all_at(buf, off).map_err(|_| Status::WRITE_FAULT)
            }
            (IoOpcode::Write, Region::Device(dma, a)) => {
                scratch.resize(n, 0);
                dma.read(a, scratch).map_err(|_| Status::DATA_TRANSFER_ERROR)?;
                self.file.write_all_at(scratch, off).map_err(|_| Status::WRITE_FAULT)
            }
            (IoOpcode::Flush, _) => Ok(()),
        }
    }

    /// Reads `buf.len()` bytes at `off`; past the end of the file the namespace reads as zeros.
    fn read_full(&self, buf: &mut [u8], off: u64) -> Result<(), Status> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], off + done as u64) {
                Ok(0) => {
                    buf[done..].fill(0);
                    return Ok(());
                }
                Ok(k) => done += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Err(Status::UNRECOVERED_READ_ERROR),
            }
        }
        Ok(())
    }

    fn identify_controller(&self) -> IdentifyController {
        IdentifyController {
            vid: 0,
            ssvid: 0,
            serial: "WL-SOFT-0001".into(),
            model: "weightlift software NVMe".into(),
            firmware: env!("CARGO_PKG_VERSION").into(),
            mdts: self.config.mdts,
            cntlid: 0,
            ver: Version::V2_0.0,
            cntrltype: 1,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: self.config.max_queue_entries.min(u32::from(u16::MAX)) as u16,
            nn: 1,
            oncs: 0,
            vwc: 1,
        }
    }

    /// Copies `data` to the memory the PRPs name.
    fn dma_out(&self, prp1: u64, prp2: u64, data: &[u8]) -> Status {
        let segs = match prp::walk(prp1, prp2, data.len() as u64, |a| {
            self.iommu.load_u64(a).ok_or(Status::DATA_TRANSFER_ERROR)
        }) {
            Ok(s) => s,
            Err(s) => return s,
        };
        let mut at = 0usize;
        for seg in segs {
            let piece = &data[at..at + seg.len as usize];
            if self.iommu.write(seg.addr, piece).is_err() {
                return Status::DATA_TRANSFER_ERROR;
            }
            at += seg.len as usize;
        }
        Status::SUCCESS
    }

    fn exec_admin(&self, sqe: &SubmissionEntry) -> (Status, u32) {
        self.admin_commands.fetch_add(1, Ordering::Relaxed);
        let cmd = match parse_admin(sqe) {
            Ok(c) => c,
            Err(s) => return (s, 0),
        };
        let granted = self.granted.load(Ordering::Relaxed);
        let queues_dw0 = (granted - 1) | ((granted - 1) << 16);
        let max_entries = self.config.max_queue_entries;
        let cc = Cc(self.reg(reg::CC));
        let valid_qid = |qid: u16| qid != 0 && u32::from(qid) <= granted;
        let status = match cmd {
            AdminCommand::Identify { cns, nsid, prp1, prp2 } => {
                let data = match cns {
                    cns::CONTROLLER => self.identify_controller().to_bytes(),
                    cns::NAMESPACE if nsid == 1 => {
                        IdentifyNamespace::simple(self.lbas, self.config.lba_size.trailing_zeros() as u8).to_bytes()
                    }
                    cns::NAMESPACE => return (Status::INVALID_NAMESPACE, 0),
                    cns::ACTIVE_NAMESPACES => {
                        let mut list = vec![0u8; IDENTIFY_BYTES];
                        if nsid < 1 {
                            list[..4].copy_from_slice(&1u32.to_le_bytes());
                        }
                        list
                    }
                    _ => return (Status::INVALID_FIELD, 0),
                };
                self.dma_out(prp1, prp2, &data)
            }
            AdminCommand::CreateIoCq { qid, entries, prp1, contiguous, .. } => {
                // Interrupts are accepted and never raised: hosts of this controller poll.
                let mut t = self.table.write().unwrap_or_else(|p| p.into_inner());
                if !valid_qid(qid) || t.cqs[usize::from(qid)].is_some() {
                    Status::INVALID_QUEUE_IDENTIFIER
                } else if !(2..=max_entries).contains(&entries) {
                    Status::INVALID_QUEUE_SIZE
                } else if !contiguous || cc.iocqes() != 4 || prp1 % PAGE_SIZE as u64 != 0 {
                    Status::INVALID_FIELD
                } else if !self.iommu.host_contains(prp1, u64::from(entries) * CQE_BYTES as u64) {
                    Status::DATA_TRANSFER_ERROR
                } else if let Some(producer) = CqProducer::new(entries) {
                    // A new queue starts empty: the head doorbell of an earlier queue with this id is void.
                    self.set_reg(cq_head_doorbell(qid, self.dstrd()), 0);
                    t.cqs[usize::from(qid)] = Some(Arc::new(SimCq {
                        qid,
                        base: prp1,
                        entries,
                        producer: Mutex::new(producer),
                        attached: AtomicU32::new(0),
                    }));
                    Status::SUCCESS
                } else {
                    Status::INVALID_QUEUE_SIZE
                }
            }
            AdminCommand::CreateIoSq { qid, entries, cqid, prp1, contiguous } => {
                let mut t = self.table.write().unwrap_or_else(|p| p.into_inner());
                let cq = t.cqs.get(usize::from(cqid)).cloned().flatten().filter(|_| cqid != 0);
                if !valid_qid(qid) || t.sqs[usize::from(qid)].is_some() {
                    Status::INVALID_QUEUE_IDENTIFIER
                } else if cq.is_none() {
                    Status::COMPLETION_QUEUE_INVALID
                } else if !(2..=max_entries).contains(&entries) {
                    Status::INVALID_QUEUE_SIZE
                } else if !contiguous || cc.iosqes() != 6 || prp1 % PAGE_SIZE as u64 != 0 {
                    Status::INVALID_FIELD
                } else if !self.iommu.host_contains(prp1, u64::from(entries) * SQE_BYTES as u64) {
                    Status::DATA_TRANSFER_ERROR
                } else if let (Some(cq), Some(consumer)) = (cq, SqConsumer::new(entries)) {
                    cq.attached.fetch_add(1, Ordering::AcqRel);
                    self.set_reg(sq_tail_doorbell(qid, self.dstrd()), 0);
                    t.sqs[usize::from(qid)] = Some(Arc::new(SimSq {
                        qid,
                        cq,
                        base: prp1,
                        entries,
                        run: Mutex::new(SqRun { consumer, deleted: false, pending: VecDeque::new() }),
                    }));
                    self.generation.fetch_add(1, Ordering::AcqRel);
                    Status::SUCCESS
                } else {
                    Status::INVALID_QUEUE_SIZE
                }
            }
            AdminCommand::DeleteIoSq { qid } => {
                let mut t = self.table.write().unwrap_or_else(|p| p.into_inner());
                match t.sqs.get_mut(usize::from(qid)).filter(|_| qid != 0).and_then(Option::take) {
                    None => Status::INVALID_QUEUE_IDENTIFIER,
                    Some(sq) => {
                        let mut run = lock(&sq.run);
                        // Completions still held are posted where they fit; the rest are dropped with the queue.
                        let mut pending = std::mem::take(&mut run.pending);
                        let _ = self.post_due(&sq, &mut pending, true);
                        run.deleted = true;
                        sq.cq.attached.fetch_sub(1, Ordering::AcqRel);
                        self.generation.fetch_add(1, Ordering::AcqRel);
                        Status::SUCCESS
                    }
                }
            }
            AdminCommand::DeleteIoCq { qid } => {
                let mut t = self.table.write().unwrap_or_else(|p| p.into_inner());
                match t.cqs.get(usize::from(qid)).cloned().flatten().filter(|_| qid != 0) {
                    None => Status::INVALID_QUEUE_IDENTIFIER,
                    Some(cq) if cq.attached.load(Ordering::Acquire) > 0 => Status::INVALID_QUEUE_DELETION,
                    Some(_) => {
                        t.cqs[usize::from(qid)] = None;
                        Status::SUCCESS
                    }
                }
            }
            AdminCommand::GetFeatures { fid: FEATURE_NUMBER_OF_QUEUES } => return (Status::SUCCESS, queues_dw0),
            AdminCommand::SetFeatures { fid: FEATURE_NUMBER_OF_QUEUES, cdw11 } => {
                let (nsqr, ncqr) = (cdw11 & 0xFFFF, cdw11 >> 16);
                if nsqr == 0xFFFF || ncqr == 0xFFFF {
                    Status::INVALID_FIELD
                } else {
                    let g = (nsqr.min(ncqr) + 1).min(u32::from(self.config.max_io_queues));
                    self.granted.store(g, Ordering::Relaxed);
                    return (Status::SUCCESS, (g - 1) | ((g - 1) << 16));
                }
            }
            AdminCommand::GetFeatures { .. } | AdminCommand::SetFeatures { .. } => Status::INVALID_FIELD,
        };
        (status, 0)
    }
}

/// The thread serving registers and the admin queue.
pub(crate) fn run_admin(sh: &SimShared) {
    let mut enabled = false;
    let mut backoff = Backoff::default();
    while !sh.stop.load(Ordering::Relaxed) {
        let cc = Cc(sh.reg(reg::CC));
        let mut busy = false;
        if cc.en() && !enabled {
            enabled = true;
            busy = true;
            match sh.enable(cc) {
                Ok(()) => {
                    sh.set_reg(reg::CSTS, Csts::RDY);
                    sh.ready.store(true, Ordering::Release);
                }
                Err(why) => sh.set_fatal(why),
            }
        } else if !cc.en() && enabled {
            sh.reset();
            enabled = false;
            busy = true;
        }
        let csts = Csts(sh.reg(reg::CSTS));
        if cc.shn() != 0 && csts.shst() != 2 {
            // Shutdown: nothing is cached, so it completes at once.
            sh.set_reg(reg::CSTS, (csts.0 & !(3 << 2)) | (2 << 2));
            busy = true;
        }
        if enabled && !sh.is_fatal() {
            let admin = sh.table.read().unwrap_or_else(|p| p.into_inner()).sqs[0].clone();
            if let Some(sq) = admin {
                match sh.serve(&sq, Duration::ZERO, &mut |e| sh.exec_admin(e)) {
                    Ok((progress, _)) => busy |= progress,
                    Err(why) => sh.set_fatal(why),
                }
            }
        }
        if busy {
            backoff.reset();
        } else {
            backoff.idle();
        }
    }
}

/// I/O thread `k`: serves the I/O queues whose id minus one is `k` modulo the thread count.
pub(crate) fn run_io(sh: &SimShared, k: usize) {
    let threads = sh.config.io_threads;
    let mut mine: Vec<Arc<SimSq>> = Vec::new();
    let mut seen = u64::MAX;
    let mut scratch = Vec::new();
    let mut backoff = Backoff::default();
    while !sh.stop.load(Ordering::Relaxed) {
        let generation = sh.generation.load(Ordering::Acquire);
        if generation != seen {
            let t = sh.table.read().unwrap_or_else(|p| p.into_inner());
            mine = t
                .sqs
                .iter()
                .flatten()
                .filter(|s| s.qid != 0 && usize::from(s.qid - 1) % threads == k)
                .cloned()
                .collect();
            seen = generation;
        }
        if !sh.ready.load(Ordering::Acquire) {
            backoff.idle();
            continue;
        }
        let latency = sh.latency();
        let mut busy = false;
        let mut next_due: Option<Instant> = None;
        for sq in &mine {
            match sh.serve(sq, latency, &mut |e| sh.exec_io(e, &mut scratch)) {
                Ok((progress, due)) => {
                    busy |= progress;
                    next_due = match (next_due, due) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                Err(why) => sh.set_fatal(why),
            }
        }
        if busy {
            backoff.reset();
        } else if let Some(due) = next_due {
            // Completions are being held for the configured latency: wake for the first, not a backoff later.
            let wait = due.saturating_duration_since(Instant::now()).min(Duration::from_millis(1));
            if wait > Duration::from_micros(50) {
                std::thread::sleep(wait);
            } else {
                std::thread::yield_now();
            }
        } else {
            backoff.idle();
        }
    }
}
