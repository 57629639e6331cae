//! The io_uring backend: each lane owns a ring with the load's files registered (buffered and O_DIRECT
//! descriptors) and its staging slots registered as fixed buffers, keeps up to `queue_depth` reads in flight, and
//! hands completed slots to the sink.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::Instant;

use io_uring::{IoUring, opcode, squeue, types};

use crate::error::IoError;
use crate::lane::{LaneStats, Next, Reading, Request, Shared, in_place_targets, iovecs};
use crate::sink::Sink;

/// Whether this process may use io_uring: `Ok` or the reason it may not. Probed once.
pub fn available() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| match IoUring::new(2) {
            Ok(_) => Ok(()),
            Err(e) => {
                let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").ok();
                let hint = match sysctl.as_deref().map(str::trim) {
                    Some("1") | Some("2") => " (kernel.io_uring_disabled is set)",
                    _ if e.raw_os_error() == Some(libc::ENOSYS) => " (kernel without io_uring)",
                    _ if e.raw_os_error() == Some(libc::EPERM) => " (refused by the kernel or a seccomp filter)",
                    _ => "",
                };
                Err(format!("{e}{hint}"))
            }
        })
        .clone()
}

/// What a lane's ring reports about itself.
#[derive(Clone, Debug, Default)]
pub struct RingInfo {
    /// Whether the staging slots were accepted as fixed buffers (refused, e.g., by RLIMIT_MEMLOCK).
    pub fixed_buffers: bool,
    pub fixed_refusal: Option<String>,
}

enum SlotState {
    Free,
    Reading(Reading),
    Delivering,
}

/// Runs one lane to completion over `slots` (memory this lane owns for the duration of the call).
pub(crate) fn run_lane<S: Sink>(
    shared: &Shared<'_, S>,
    lane: usize,
    slots: Vec<&mut [u8]>,
) -> Result<(LaneStats, RingInfo), IoError> {
    let qd = shared.queue_depth.min(slots.len()).max(1);
    let entries = (qd * 2).next_power_of_two() as u32;
    let ring: IoUring = IoUring::builder().build(entries).map_err(|e| IoError::Uring(format!("setup: {e}")))?;
    let fds: Vec<i32> = shared
        .files
        .iter()
        .flat_map(|f| [f.buffered.as_raw_fd(), f.direct.as_ref().map_or(-1, |d| d.as_raw_fd())])
        .collect();
    ring.submitter().register_files(&fds).map_err(|e| IoError::Uring(format!("registering files: {e}")))?;
    // From here on, the kernel may write into the slots through these raw pointers; Rust code only forms a slice
    // of a slot once its read has completed and before the next read into it is issued.
    let ptrs: Vec<(*mut u8, usize)> = slots.into_iter().map(|s| (s.as_mut_ptr(), s.len())).collect();
    let iovecs: Vec<libc::iovec> = ptrs.iter().map(|&(p, l)| libc::iovec { iov_base: p.cast(), iov_len: l }).collect();
    // SAFETY: each iovec describes a slot borrowed for this whole call; the ring is dropped at the end of the call,
    // after every read has completed (see `drain`), so the registration never outlives the memory.
    let registered = unsafe { ring.submitter().register_buffers(&iovecs) };
    let info = match registered {
        Ok(()) => RingInfo { fixed_buffers: true, fixed_refusal: None },
        Err(e) => RingInfo { fixed_buffers: false, fixed_refusal: Some(e.to_string()) },
    };
    let n = ptrs.len();
    let mut lane_state = Lane {
        ring,
        ptrs,
        fixed: info.fixed_buffers,
        inflight: 0,
        stats: LaneStats::default(),
        in_place: (0..n).map(|_| None).collect(),
    };
    let result = lane_state.run(shared, lane, qd);
    let drained = lane_state.drain();
    match (result, drained) {
        (Ok(()), Ok(())) => Ok((lane_state.stats, info)),
        (Err(e), _) | (Ok(()), Err(e)) => {
            shared.fail();
            Err(e)
        }
    }
}

struct Lane {
    ring: IoUring,
    ptrs: Vec<(*mut u8, usize)>,
    fixed: bool,
    inflight: usize,
    stats: LaneStats,
    /// Per slot, for an op read straight into host destinations.
    in_place: Vec<Option<InPlace>>,
}

/// An op read straight into host destinations: the destinations, and the iovecs of the read in flight (kept here
/// until its completion, since the kernel reads them).
type InPlace = (Vec<(*mut u8, usize)>, Vec<libc::iovec>);

impl Lane {
    fn run<S: Sink>(&mut self, shared: &Shared<'_, S>, lane: usize, qd: usize) -> Result<(), IoError> {
        let mut state: Vec<SlotState> = (0..self.ptrs.len()).map(|_| SlotState::Free).collect();
        let mut free: Vec<usize> = (0..self.ptrs.len()).rev().collect();
        let mut pending: VecDeque<(usize, S::Pending)> = VecDeque::new();
        shared.sink.begin_lane(lane).map_err(|e| shared.sink_error(e))?;
        let result = self.pump(shared, lane, qd, &mut state, &mut free, &mut pending);
        // Deliveries still reading slots must finish before the slots can be given back, whatever happened.
        let mut first_err = result.err();
        for (_, p) in pending.drain(..) {
            if let Err(e) = shared.sink.wait(p) {
                first_err.get_or_insert_with(|| shared.sink_error(e));
            }
        }
        if let Err(e) = shared.sink.end_lane(lane) {
            first_err.get_or_insert_with(|| shared.sink_error(e));
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Issues reads and delivers completions until the plan is exhausted or the load stops. Returns early on the
    /// first error; the caller drains what is still in flight.
    fn pump<S: Sink>(
        &mut self,
        shared: &Shared<'_, S>,
        lane: usize,
        qd: usize,
        state: &mut [SlotState],
        free: &mut Vec<usize>,
        pending: &mut VecDeque<(usize, S::Pending)>,
    ) -> Result<(), IoError> {
        let plan = shared.plan;
        let mut exhausted = false;
        loop {
            // Slots whose delivery finished are free again.
            while let Some((_, p)) = pending.front() {
                if !shared.sink.poll(p).map_err(|e| shared.sink_error(e))? {
                    break;
                }
                if let Some((slot, _)) = pending.pop_front() {
                    state[slot] = SlotState::Free;
                    free.push(slot);
                }
            }
            while self.inflight < qd && !exhausted {
                let Some(&slot) = free.last() else { break };
                let Some(op_idx) = shared.next_op() else {
                    exhausted = true;
                    break;
                };
                free.pop();
                let op = &plan.ops[op_idx];
                let reading = Reading::start(op_idx, op.direct);
                state[slot] = SlotState::Reading(reading);
                self.in_place[slot] = in_place_targets(plan, op, shared.sink).map(|t| (t, Vec::new()));
                self.stats.ops += 1;
                self.push(shared, slot, op_idx, reading.request(op))?;
                self.inflight += 1;
            }
            if self.inflight == 0 {
                if exhausted || shared.stopping() {
                    return Ok(());
                }
                // Every slot is waiting for its delivery to finish: back-pressure.
                let Some((slot, p)) = pending.pop_front() else { return Ok(()) };
                let t = Instant::now();
                shared.sink.wait(p).map_err(|e| shared.sink_error(e))?;
                self.stats.backpressure += t.elapsed();
                state[slot] = SlotState::Free;
                free.push(slot);
                continue;
            }
            let t = Instant::now();
            self.submit_and_wait(1)?;
            self.stats.io_wait += t.elapsed();
            let done: Vec<(u64, i32)> = self.ring.completion().map(|c| (c.user_data(), c.result())).collect();
            // Every completion ends one read; a continued op counts again when its next read is pushed. Counting
            // up front keeps `inflight` exact even when an error below leaves the rest of `done` unprocessed.
            self.inflight -= done.len();
            for (user_data, res) in done {
                let slot = user_data as usize;
                let Some(&SlotState::Reading(mut reading)) = state.get(slot) else {
                    return Err(IoError::Uring(format!("completion for idle slot {slot}")));
                };
                let op = &plan.ops[reading.op];
                let file = &shared.files[op.file as usize];
                let asked = reading.request(op);
                let mut result = if res < 0 { Err(io::Error::from_raw_os_error(-res)) } else { Ok(res as usize) };
                if let Some(f) = shared.faults {
                    result = f.after_read(op.file, asked.offset, asked.len, result);
                }
                match reading.on_result(op, file, result, &mut self.stats)? {
                    Next::Read(req) => {
                        state[slot] = SlotState::Reading(reading);
                        self.push(shared, slot, reading.op, req)?;
                        self.inflight += 1;
                    }
                    Next::Complete if self.in_place[slot].take().is_some() => {
                        // The bytes are already in their destinations.
                        shared.add_progress(op.valid);
                        state[slot] = SlotState::Free;
                        free.push(slot);
                    }
                    Next::Complete => {
                        state[slot] = SlotState::Delivering;
                        let (ptr, _) = self.ptrs[slot];
                        // SAFETY: the slot's read has completed and no other read into it is in flight; the slice
                        // lives only for the `deliver` call, and the slot is not reused until the delivery is done.
                        let data = unsafe { std::slice::from_raw_parts(ptr, op.valid as usize) };
                        let t = Instant::now();
                        let p =
                            shared.sink.deliver(lane, plan.pieces_of(op), data).map_err(|e| shared.sink_error(e))?;
                        self.stats.deliver += t.elapsed();
                        shared.add_progress(op.valid);
                        match p {
                            Some(p) => pending.push_back((slot, p)),
                            None => {
                                state[slot] = SlotState::Free;
                                free.push(slot);
                            }
                        }
                    }
                }
            }
        }
    }

    fn push<S: Sink>(
        &mut self,
        shared: &Shared<'_, S>,
        slot: usize,
        op_idx: usize,
        req: Request,
    ) -> Result<(), IoError> {
        let Request { offset, len, direct } = req;
        let op = &shared.plan.ops[op_idx];
        if let Some(f) = shared.faults {
            f.before_read(op.file, &shared.files[op.file as usize].path, offset, len);
        }
        let fd = types::Fixed(op.file * 2 + u32::from(direct));
        let at = offset - op.offset;
        if let Some((targets, iov)) = self.in_place[slot].as_mut() {
            *iov = iovecs(targets, at, len);
            let entry =
                opcode::Readv::new(fd, iov.as_ptr(), iov.len() as u32).offset(offset).build().user_data(slot as u64);
            return self.push_entry(entry);
        }
        let (base, slot_len) = self.ptrs[slot];
        let at = at as usize;
        let len = len.min((slot_len - at) as u64) as u32;
        // SAFETY: `at < slot_len` because `offset - op.offset < op.len <= slot_len`.
        let buf = unsafe { base.add(at) };
        let entry: squeue::Entry = if self.fixed {
            opcode::ReadFixed::new(fd, buf, len, slot as u16).offset(offset).build()
        } else {
            opcode::Read::new(fd, buf, len).offset(offset).build()
        };
        self.push_entry(entry.user_data(slot as u64))
    }

    fn push_entry(&mut self, entry: squeue::Entry) -> Result<(), IoError> {
        loop {
            // SAFETY: the entry reads into a slot this lane owns, or (in place) into destination ranges of the sink
            // whose iovecs live in `in_place` — neither is touched until the completion carrying the slot arrives,
            // and the sink's destinations outlive the load; the fixed file index refers to a descriptor registered
            // above (for direct reads only when the file has an O_DIRECT descriptor, since planning marks only
            // those reads direct).
            let pushed = unsafe { self.ring.submission().push(&entry) };
            if pushed.is_ok() {
                return Ok(());
            }
            self.ring.submit().map_err(|e| IoError::Uring(format!("submit: {e}")))?;
        }
    }

    fn submit_and_wait(&mut self, want: usize) -> Result<(), IoError> {
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => return Ok(()),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)) => {
                    continue;
                }
                Err(e) => return Err(IoError::Uring(format!("submit: {e}"))),
            }
        }
    }

    /// Waits until no read is in flight, whatever happened, so that no kernel write into a slot can outlive it.
    fn drain(&mut self) -> Result<(), IoError> {
        let mut first = None;
        while self.inflight > 0 {
            if let Err(e) = self.submit_and_wait(1) {
                // The ring cannot make progress (a kernel failure, not an I/O error). Fixed buffers stay pinned by
                // the kernel until their reads end, so the pages cannot be handed to anyone else meanwhile.
                first.get_or_insert(e);
                break;
            }
            let n = self.ring.completion().count();
            self.inflight = self.inflight.saturating_sub(n);
        }
        first.map_or(Ok(()), Err)
    }
}
