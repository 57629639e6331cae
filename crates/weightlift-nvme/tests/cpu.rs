//! The CPU submitter against the software controller, end to end: every byte read equals what `std::fs::read` sees,
//! writes read back, queues wrap and flip phase, full queues push back, PRPs land at and across page boundaries,
//! MDTS holds, and every error status surfaces as a typed error naming its LBAs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use weightlift_nvme::spec::{IoOpcode, SubmissionEntry};
use weightlift_nvme::spec::{PAGE_SIZE, Status};
use weightlift_nvme::{
    BringUp, ByteRange, Controller, Fault, IoQueuePair, NvmeError, QueueOptions, SoftConfig, SoftNvme, load_host,
};

const WAIT: Duration = Duration::from_secs(20);

/// Deterministic pseudo-random bytes: the synthetic-checkpoint generator's, so every test shares one.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    weightlift_format::synth::tensor_bytes(seed, 0, 0, &mut v);
    v
}

fn backing(dir: &Path, len: usize, seed: u64) -> PathBuf {
    let p = dir.join(format!("ns-{seed}.bin"));
    std::fs::write(&p, pattern(len, seed)).unwrap();
    p
}

fn start(path: &Path, config: SoftConfig) -> (SoftNvme, Controller) {
    let soft = SoftNvme::start(path, config).unwrap();
    let ctrl = Controller::bring_up(soft.bus(), BringUp::default()).unwrap();
    (soft, ctrl)
}

/// Reads `nlb` blocks at `slba` through `q` and returns the data.
fn read(q: &mut IoQueuePair, slba: u64, nlb: u32) -> Result<Vec<u8>, NvmeError> {
    q.submit_read(slba, nlb)?;
    let mut out = None;
    while out.is_none() {
        q.wait(WAIT, |c| out = Some(c.result().map(|()| c.data().to_vec())))?;
    }
    out.unwrap()
}

fn expect(file: &[u8], lba: u32, slba: u64, nlb: u32) -> &[u8] {
    let s = slba as usize * lba as usize;
    &file[s..s + nlb as usize * lba as usize]
}

#[test]
fn bring_up_identifies_controller_and_namespace() {
    let dir = tempfile::tempdir().unwrap();
    for (lba, len) in [(512u32, 1_000_000usize), (4096, 1 << 20)] {
        let path = backing(dir.path(), len, 1);
        let (_soft, ctrl) = start(&path, SoftConfig { lba_size: lba, mdts: 6, ..SoftConfig::default() });
        let info = ctrl.info();
        assert_eq!(info.identify.mdts, 6);
        assert_eq!(info.max_transfer, 256 << 10);
        assert_eq!((info.identify.sqes, info.identify.cqes, info.identify.nn), (0x66, 0x44, 1));
        assert_eq!(info.identify.model, "weightlift software NVMe");
        assert_eq!(info.version.major(), 2);
        let ns = ctrl.namespace();
        assert_eq!(ns.lba_size, lba);
        assert_eq!(ns.lbas, (len as u64).div_ceil(u64::from(lba)));
        assert_eq!((ns.identify.ncap, ns.identify.nuse), (ns.lbas, ns.lbas));
        assert_eq!(ctrl.identify_controller().unwrap(), info.identify);
        let e = ctrl.identify_namespace(2).unwrap_err();
        assert!(e.status().unwrap().same_code(Status::INVALID_NAMESPACE), "{e}");
        assert_eq!(ctrl.get_features(0x07).unwrap(), 63 | (63 << 16));
        assert!(ctrl.failure().is_none());
    }
}

#[test]
fn reads_match_the_file_through_wraps_and_phase_flips() {
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), 3 << 20, 2);
    let file = std::fs::read(&path).unwrap();
    let (_soft, ctrl) = start(&path, SoftConfig::default());
    let mut q = ctrl.create_queue_pair(&QueueOptions { entries: 4, ..QueueOptions::default() }).unwrap();
    assert_eq!(q.capacity(), 3);
    let mut phases = Vec::new();
    let mut x = 7u64;
    for i in 0..200u64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let nlb = 1 + (x >> 40) as u32 % 64;
        let slba = (x >> 20) % (6144 - u64::from(nlb));
        // Alternate single commands and full batches so the rings wrap at every position.
        let batch: usize = if i % 3 == 0 { 3 } else { 1 };
        let mut cids = Vec::new();
        for b in 0..batch {
            cids.push((q.submit_read(slba + b as u64, nlb).unwrap(), slba + b as u64));
        }
        let mut seen = 0;
        while seen < batch {
            seen += q
                .wait(WAIT, |c| {
                    c.result().unwrap();
                    assert_eq!(c.opcode, IoOpcode::Read as u8);
                    let &(_, at) = cids.iter().find(|(cid, _)| *cid == c.cid).unwrap();
                    assert_eq!(c.slba, at);
                    assert!(c.data() == expect(&file, 512, at, nlb), "read {at}+{nlb}");
                })
                .unwrap();
        }
        phases.push(q.ring_state().2);
    }
    assert!(phases.windows(2).filter(|w| w[0] != w[1]).count() > 50, "the completion phase flipped on each wrap");
}

#[test]
fn full_queues_push_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), 1 << 20, 3);
    let file = std::fs::read(&path).unwrap();
    let (soft, ctrl) = start(&path, SoftConfig { latency: Duration::from_millis(30), ..SoftConfig::default() });
    let mut q = ctrl.create_queue_pair(&QueueOptions { entries: 8, ..QueueOptions::default() }).unwrap();
    for i in 0..7 {
        q.submit_read(i * 8, 8).unwrap();
    }
    match q.submit_read(100, 1) {
        Err(NvmeError::QueueFull { in_flight: 7, .. }) => {}
        other => panic!("expected a full queue, got {other:?}"),
    }
    let mut done = 0;
    while done < 7 {
        done += q
            .wait(WAIT, |c| {
                c.result().unwrap();
                assert!(c.data() == expect(&file, 512, c.slba, 8));
                assert!(c.latency >= Duration::from_millis(25), "latency was injected: {:?}", c.latency);
            })
            .unwrap();
        // Each freed slot takes a new command at once.
        if done < 7 {
            assert!(q.in_flight() < 7);
        }
    }
    soft.set_latency(Duration::ZERO);
    assert_eq!(read(&mut q, 100, 1).unwrap(), expect(&file, 512, 100, 1));
}

#[test]
fn prps_at_and_across_page_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), 4 << 20, 4);
    let file = std::fs::read(&path).unwrap();
    let (_soft, ctrl) = start(&path, SoftConfig { mdts: 5, ..SoftConfig::default() });
    let mdts_blocks = (ctrl.info().max_transfer / 512) as u32;
    assert_eq!(mdts_blocks, 256);
    for data_offset in [0usize, 4, 512, 3584, PAGE_SIZE - 4] {
        for prp_list_offset in [0usize, 8, 2048, PAGE_SIZE - 16, PAGE_SIZE - 8] {
            let opts = QueueOptions { entries: 4, data_offset, prp_list_offset, ..QueueOptions::default() };
            let mut q = ctrl.create_queue_pair(&opts).unwrap();
            // One block, exactly a page, one byte-block past a page, two pages, three (a list), and MDTS.
            for nlb in [1u32, 7, 8, 9, 16, 17, 24, 100, mdts_blocks - 1, mdts_blocks] {
                let slba = u64::from(nlb) * 13 % 4000;
                let got = read(&mut q, slba, nlb).unwrap();
                assert!(
                    got == expect(&file, 512, slba, nlb),
                    "data offset {data_offset}, list offset {prp_list_offset}, {nlb} blocks"
                );
            }
        }
    }
}

#[test]
fn mdts_is_enforced_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), 2 << 20, 5);
    let (_soft, ctrl) = start(&path, SoftConfig { mdts: 4, ..SoftConfig::default() });
    let mdts = ctrl.info().max_transfer;
    assert_eq!(mdts, 64 << 10);
    let mut q = ctrl.create_queue_pair(&QueueOptions::default()).unwrap();
    let blocks = (mdts / 512) as u32;
    read(&mut q, 0, blocks).unwrap();
    match q.submit_read(0, blocks + 1) {
        Err(NvmeError::TooLarge { bytes, limit, .. }) => assert_eq!((bytes, limit), (mdts + 512, mdts)),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // A host that ignores MDTS is refused by the controller: a slot big enough, a command too large.
    let big = ctrl.create_queue_pair(&QueueOptions { slot_bytes: Some(2 * mdts), ..QueueOptions::default() });
    let mut big = big.unwrap();
    let e = big.submit_read(0, blocks + 1).unwrap_err();
    assert!(matches!(e, NvmeError::TooLarge { .. }), "the host checks MDTS before the slot size: {e}");
    let raw = SubmissionEntry::rw(IoOpcode::Read, 0, 1, 0, blocks + 8, 0, 0).unwrap();
    // SAFETY: PRPs of 0 name no memory: the controller fails the command before any transfer.
    unsafe { big.submit_raw(raw) }.unwrap();
    let mut status = None;
    big.wait(WAIT, |c| status = Some(c.result())).unwrap();
    let e = status.unwrap().unwrap_err();
    assert!(e.status().unwrap().same_code(Status::INVALID_FIELD), "{e}");
    assert_eq!(e.lba(), Some(0));
}

/// Runs one raw command and returns its error.
fn raw_error(q: &mut IoQueuePair, sqe: SubmissionEntry) -> NvmeError {
    // SAFETY: the tests' raw commands name no memory (PRPs 0 or unmapped addresses the controller must refuse).
    unsafe { q.submit_raw(sqe) }.unwrap();
    let mut status = None;
    q.wait(WAIT, |c| status = Some(c.result())).unwrap();
    status.unwrap().unwrap_err()
}

#[test]
fn every_error_status_is_typed_and_names_the_lba() {
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), 1 << 20, 6);
    let (soft, ctrl) = start(&path, SoftConfig { writable: true, ..SoftConfig::default() });
    let lbas = ctrl.namespace().lbas;
    let mut q = ctrl.create_queue_pair(&QueueOptions::default()).unwrap();
    let check = |e: NvmeError, want: Status, lba: u64| {
        assert!(e.status().is_some_and(|s| s.same_code(want)), "{e}: expected {want}");
        assert_eq!(e.lba(), Some(lba), "{e}");
        assert!(e.to_string().contains(&format!("LBA {lba}..")), "{e}");
    };

    check(read(&mut q, lbas - 2, 4).unwrap_err(), Status::LBA_OUT_OF_RANGE, lbas - 2);
    check(read(&mut q, u64::MAX - 1, 4).unwrap_err(), Status::LBA_OUT_OF_RANGE, u64::MAX - 1);

    soft.inject(Fault { lba: 1000, status: Status::UNRECOVERED_READ_ERROR, op: Some(IoOpcode::Read) });
    check(read(&mut q, 990, 16).unwrap_err(), Status::UNRECOVERED_READ_ERROR, 990);
    read(&mut q, 1001, 16).unwrap();
    soft.inject(Fault { lba: 2000, status: Status::INTERNAL_ERROR, op: None });
    check(read(&mut q, 2000, 1).unwrap_err(), Status::INTERNAL_ERROR, 2000);
    soft.inject(Fault { lba: 500, status: Status::WRITE_FAULT, op: Some(IoOpcode::Write) });
    q.submit_write(499, &[7u8; 1024]).unwrap();
    let mut r = None;
    q.wait(WAIT, |c| r = Some(c.result())).unwrap();
    check(r.unwrap().unwrap_err(), Status::WRITE_FAULT, 499);
    soft.clear_faults();
    read(&mut q, 990, 16).unwrap();

    let mut bad = SubmissionEntry::flush(0, 1);
    bad.opcode = 0x7E;
    bad.cdw10 = 42;
    check(raw_error(&mut q, bad), Status::INVALID_OPCODE, 42);
    let mut sgl = SubmissionEntry::rw(IoOpcode::Read, 0, 1, 43, 1, 0, 0).unwrap();
    sgl.psdt = 1;
    check(raw_error(&mut q, sgl), Status::INVALID_FIELD, 43);
    let other_ns = SubmissionEntry::rw(IoOpcode::Read, 0, 2, 44, 1, 0, 0).unwrap();
    check(raw_error(&mut q, other_ns), Status::INVALID_NAMESPACE, 44);
    let misaligned = SubmissionEntry::rw(IoOpcode::Read, 0, 1, 45, 1, 0x1002, 0).unwrap();
    check(raw_error(&mut q, misaligned), Status::PRP_OFFSET_INVALID, 45);
    // An address no DMA window covers is a data transfer error, never a wild write.
    let unmapped = SubmissionEntry::rw(IoOpcode::Read, 0, 1, 46, 1, 0x1000, 0).unwrap();
    check(raw_error(&mut q, unmapped), Status::DATA_TRANSFER_ERROR, 46);
    assert!(ctrl.failure().is_none(), "command errors leave the controller healthy");
}

#[test]
fn admin_errors_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), 1 << 20, 7);
    let (_soft, ctrl) = start(&path, SoftConfig { max_io_queues: 4, ..SoftConfig::default() });
    let q = ctrl.create_queue_pair(&QueueOptions::default()).unwrap();
    let qid = q.qid();
    let admin = |sqe: SubmissionEntry| {
        // SAFETY: the commands either name the controller's own existing queue memory through queue ids only, or
        // fail validation before the controller touches memory.
        let c = unsafe { ctrl.admin_raw(sqe) }.unwrap();
        c.status
    };
    let mem = ctrl.bus().alloc_dma(64 * 64).unwrap();
    assert!(admin(SubmissionEntry::create_io_cq(0, 0, 16, mem.bus_addr())).same_code(Status::INVALID_QUEUE_IDENTIFIER));
    assert!(admin(SubmissionEntry::create_io_cq(0, 9, 16, mem.bus_addr())).same_code(Status::INVALID_QUEUE_IDENTIFIER));
    assert!(
        admin(SubmissionEntry::create_io_cq(0, qid, 16, mem.bus_addr())).same_code(Status::INVALID_QUEUE_IDENTIFIER)
    );
    assert!(admin(SubmissionEntry::create_io_cq(0, 3, 2000, mem.bus_addr())).same_code(Status::INVALID_QUEUE_SIZE));
    assert!(admin(SubmissionEntry::create_io_cq(0, 3, 16, 0x1000)).same_code(Status::DATA_TRANSFER_ERROR));
    assert!(
        admin(SubmissionEntry::create_io_sq(0, 3, 16, 4, mem.bus_addr())).same_code(Status::COMPLETION_QUEUE_INVALID)
    );
    let e = ctrl.delete_io_cq(qid).unwrap_err();
    assert!(e.status().unwrap().same_code(Status::INVALID_QUEUE_DELETION), "{e}");
    assert!(e.to_string().contains("Delete I/O Completion Queue"), "{e}");
    let e = ctrl.delete_io_sq(3).unwrap_err();
    assert!(e.status().unwrap().same_code(Status::INVALID_QUEUE_IDENTIFIER), "{e}");
    let mut bad = SubmissionEntry::get_features(0, 0x07);
    bad.opcode = 0x7F;
    assert!(admin(bad).same_code(Status::INVALID_OPCODE));
    assert!(admin(SubmissionEntry::get_features(0, 0x55)).same_code(Status::INVALID_FIELD));
    drop(q);
    // The queue id is free again once its pair is gone.
    assert_eq!(ctrl.create_queue_pair(&QueueOptions::default()).unwrap().qid(), qid);
}

#[test]
fn writes_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), 1 << 20, 8);
    let (_soft, ctrl) = start(&path, SoftConfig { writable: true, lba_size: 4096, ..SoftConfig::default() });
    let mut q = ctrl.create_queue_pair(&QueueOptions { data_offset: 1024, ..QueueOptions::default() }).unwrap();
    let data = pattern(30 * 4096, 99);
    q.submit_write(10, &data).unwrap();
    let mut r = None;
    q.wait(WAIT, |c| r = Some(c.result())).unwrap();
    r.unwrap().unwrap();
    q.submit_flush().unwrap();
    q.wait(WAIT, |c| c.result().unwrap()).unwrap();
    assert!(read(&mut q, 10, 30).unwrap() == data);
    let file = std::fs::read(&path).unwrap();
    assert!(file[10 * 4096..40 * 4096] == data[..], "the backing file holds what was written");
    let e = q.submit_write(0, &[1u8; 100]).unwrap_err();
    assert!(matches!(e, NvmeError::Invalid { .. }), "{e}");
}

#[test]
fn read_only_namespaces_refuse_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), 1 << 20, 9);
    let (_soft, ctrl) = start(&path, SoftConfig::default());
    let mut q = ctrl.create_queue_pair(&QueueOptions::default()).unwrap();
    q.submit_write(3, &[1u8; 512]).unwrap();
    let mut r = None;
    q.wait(WAIT, |c| r = Some(c.result())).unwrap();
    let e = r.unwrap().unwrap_err();
    assert!(e.status().unwrap().same_code(Status::NAMESPACE_WRITE_PROTECTED), "{e}");
}

#[test]
fn several_queue_pairs_on_several_threads() {
    let dir = tempfile::tempdir().unwrap();
    let len = (8 << 20) + 1234;
    let path = backing(dir.path(), len, 10);
    let file = Arc::new(std::fs::read(&path).unwrap());
    let (_soft, ctrl) = start(&path, SoftConfig { io_threads: 2, ..SoftConfig::default() });
    let lbas = ctrl.namespace().lbas;
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (ctrl, file) = (&ctrl, &file);
            s.spawn(move || {
                let mut q = ctrl.create_queue_pair(&QueueOptions { entries: 16, ..QueueOptions::default() }).unwrap();
                let mut x = t + 1;
                let mut issued = std::collections::HashMap::new();
                for _ in 0..300 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let nlb = 1 + (x >> 33) as u32 % 256;
                    let slba = (x >> 7) % (lbas - u64::from(nlb));
                    loop {
                        match q.submit_read(slba, nlb) {
                            Ok(cid) => {
                                issued.insert(cid, (slba, nlb));
                                break;
                            }
                            Err(NvmeError::QueueFull { .. }) => {
                                q.wait(WAIT, |c| {
                                    c.result().unwrap();
                                    let (slba, nlb) = issued.remove(&c.cid).unwrap();
                                    let want =
                                        &file[slba as usize * 512..(slba as usize * 512 + nlb as usize * 512).min(len)];
                                    assert!(&c.data()[..want.len()] == want);
                                })
                                .unwrap();
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                while q.in_flight() > 0 {
                    q.wait(WAIT, |c| {
                        c.result().unwrap();
                        issued.remove(&c.cid).unwrap();
                    })
                    .unwrap();
                }
            });
        }
    });
}

#[test]
fn load_host_reads_ranges_over_several_queues() {
    let dir = tempfile::tempdir().unwrap();
    let len = (16 << 20) + 777;
    let path = backing(dir.path(), len, 11);
    let file = std::fs::read(&path).unwrap();
    let (soft, ctrl) = start(&path, SoftConfig { io_threads: 2, mdts: 5, ..SoftConfig::default() });
    let mut queues: Vec<IoQueuePair> = (0..4)
        .map(|_| ctrl.create_queue_pair(&QueueOptions { entries: 32, ..QueueOptions::default() }).unwrap())
        .collect();
    // Awkward ranges: unaligned starts and ends, one covering the file's unaligned tail, scattered destinations.
    let mut ranges = Vec::new();
    let mut dest_at = 0;
    let mut x = 5u64;
    let mut pos = 0u64;
    while pos < len as u64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let n = (1 + (x >> 33) % (3 << 20)).min(len as u64 - pos);
        ranges.push(ByteRange { offset: pos, len: n, dest_offset: dest_at });
        dest_at += n + (x >> 60);
        pos += n + (x >> 50) % 5000;
    }
    let mut dest = vec![0u8; dest_at as usize];
    let report = load_host(&mut queues, &ranges, &mut dest).unwrap();
    for r in &ranges {
        let want = &file[r.offset as usize..(r.offset + r.len) as usize];
        assert!(&dest[r.dest_offset as usize..(r.dest_offset + r.len) as usize] == want, "{r:?}");
    }
    assert_eq!(report.bytes, ranges.iter().map(|r| r.len).sum::<u64>());
    assert!(report.commands as usize >= ranges.len() && report.iops() > 0.0 && report.gbps() > 0.0);
    assert_eq!(report.queue_pairs, 4);

    // A failure in the middle is an error naming its LBAs, after the commands in flight have drained.
    soft.inject(Fault { lba: 20_000, status: Status::UNRECOVERED_READ_ERROR, op: None });
    let e = load_host(&mut queues, &ranges, &mut dest).unwrap_err();
    let (slba, status) = match &e {
        NvmeError::Command { slba, nlb, status, .. } => {
            assert!((*slba..*slba + u64::from(*nlb)).contains(&20_000), "{e}");
            (*slba, *status)
        }
        other => panic!("expected a command error, got {other}"),
    };
    assert!(status.same_code(Status::UNRECOVERED_READ_ERROR));
    assert!(e.to_string().contains(&format!("LBA {slba}..")), "{e}");
    soft.clear_faults();
    assert!(queues.iter().all(|q| q.in_flight() == 0));
    load_host(&mut queues, &ranges, &mut dest).unwrap();
    let past = [ByteRange { offset: len as u64 - 10, len: 1000, dest_offset: 0 }];
    assert!(matches!(load_host(&mut queues, &past, &mut dest), Err(NvmeError::OutOfRange { .. })));
}

#[test]
fn reset_and_bring_up_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), 1 << 20, 12);
    let file = std::fs::read(&path).unwrap();
    let soft = SoftNvme::start(&path, SoftConfig::default()).unwrap();
    for _ in 0..3 {
        let ctrl = Controller::bring_up(soft.bus(), BringUp { io_queues: 2, ..BringUp::default() }).unwrap();
        assert_eq!((ctrl.info().io_sqs, ctrl.info().io_cqs), (2, 2));
        let mut a = ctrl.create_queue_pair(&QueueOptions::default()).unwrap();
        let _b = ctrl.create_queue_pair(&QueueOptions::default()).unwrap();
        assert!(ctrl.create_queue_pair(&QueueOptions::default()).is_err(), "only two pairs were granted");
        assert_eq!(read(&mut a, 5, 3).unwrap(), expect(&file, 512, 5, 3));
    }
    assert!(soft.fatal().is_none());
    let stats = soft.stats();
    assert!(stats.io_commands >= 3 && stats.admin_commands > 10 && stats.bytes_read >= 3 * 3 * 512);
}

#[test]
fn bad_configurations_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), 4096, 13);
    assert!(SoftNvme::start(&path, SoftConfig { lba_size: 1024, ..SoftConfig::default() }).is_err());
    assert!(SoftNvme::start(&dir.path().join("missing"), SoftConfig::default()).is_err());
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    assert!(SoftNvme::start(&empty, SoftConfig::default()).is_err());
    let (_soft, ctrl) = start(&path, SoftConfig::default());
    assert!(ctrl.create_queue_pair(&QueueOptions { entries: 1, ..QueueOptions::default() }).is_err());
    assert!(ctrl.create_queue_pair(&QueueOptions { entries: 5000, ..QueueOptions::default() }).is_err());
    assert!(ctrl.create_queue_pair(&QueueOptions { data_offset: 2, ..QueueOptions::default() }).is_err());
    assert!(ctrl.create_queue_pair(&QueueOptions { slot_bytes: Some(1000), ..QueueOptions::default() }).is_err());
}

/// Device memory for the peer-to-peer stand-in: a byte vector at a fake device address.
#[derive(Debug)]
struct FakeDevice {
    base: u64,
    mem: std::sync::Mutex<Vec<u8>>,
    fail: std::sync::atomic::AtomicBool,
}

impl weightlift_nvme::DeviceDma for FakeDevice {
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), String> {
        if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
            return Err("injected device failure".into());
        }
        let at = (addr - self.base) as usize;
        self.mem.lock().unwrap()[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), String> {
        let at = (addr - self.base) as usize;
        out.copy_from_slice(&self.mem.lock().unwrap()[at..at + out.len()]);
        Ok(())
    }
}

#[test]
fn data_moves_through_the_device_memory_hook() {
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), 1 << 20, 14);
    let file = std::fs::read(&path).unwrap();
    let (_soft, ctrl) = start(&path, SoftConfig { writable: true, ..SoftConfig::default() });
    // Above the user address space, so no host window can overlap it.
    let base = 0xdead_0000_0000u64;
    let dev = Arc::new(FakeDevice {
        base,
        mem: std::sync::Mutex::new(vec![0; 256 << 10]),
        fail: std::sync::atomic::AtomicBool::new(false),
    });
    let _window = ctrl.bus().map_device_memory(base, 256 << 10, dev.clone()).unwrap();
    let lists = ctrl.bus().alloc_dma(4096).unwrap();
    let mut q = ctrl.create_queue_pair(&QueueOptions::default()).unwrap();
    let mut run = |op: IoOpcode, slba: u64, nlb: u32, at: u64| {
        let set = weightlift_nvme::prp::build(base + at, u64::from(nlb) * 512, lists.bus_addr(), 4096).unwrap();
        for (i, e) in set.list.iter().enumerate() {
            lists.store_u64(8 * i, *e).unwrap();
        }
        let sqe = SubmissionEntry::rw(op, 0, 1, slba, nlb, set.prp1, set.prp2).unwrap();
        // SAFETY: the PRPs name the fake device's memory and a list page no one else uses.
        unsafe { q.submit_raw(sqe) }.unwrap();
        let mut r = None;
        q.wait(WAIT, |c| r = Some(c.result())).unwrap();
        r.unwrap()
    };
    // 100 blocks from an unaligned device offset: a PRP list of device addresses.
    run(IoOpcode::Read, 300, 100, 1024).unwrap();
    assert!(dev.mem.lock().unwrap()[1024..1024 + 51200] == file[300 * 512..400 * 512]);
    // And back out to another place in the namespace.
    run(IoOpcode::Write, 1000, 100, 1024).unwrap();
    assert!(std::fs::read(&path).unwrap()[1000 * 512..1100 * 512] == file[300 * 512..400 * 512]);
    dev.fail.store(true, std::sync::atomic::Ordering::Relaxed);
    let e = run(IoOpcode::Read, 5, 8, 0).unwrap_err();
    assert!(e.status().unwrap().same_code(Status::DATA_TRANSFER_ERROR), "{e}");
    assert_eq!(e.lba(), Some(5));
}
