//! The fallback backend for kernels or sandboxes without io_uring: the same plan, slots and sink, with each lane
//! issuing one blocking `pread` at a time (lanes are more numerous instead).

use std::collections::VecDeque;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use crate::error::IoError;
use crate::lane::{LaneStats, Next, Reading, Shared, in_place_targets, iovecs};
use crate::sink::Sink;

pub(crate) fn run_lane<S: Sink>(
    shared: &Shared<'_, S>,
    lane: usize,
    slots: Vec<&mut [u8]>,
) -> Result<LaneStats, IoError> {
    // Raw pointers, as for io_uring: a slot handed to the sink may still be read (by a device copy) while this
    // thread writes into another slot, so no `&mut` to the whole set is kept alive across deliveries.
    let ptrs: Vec<(*mut u8, usize)> = slots.into_iter().map(|s| (s.as_mut_ptr(), s.len())).collect();
    let mut free: Vec<usize> = (0..ptrs.len()).rev().collect();
    let mut pending: VecDeque<(usize, S::Pending)> = VecDeque::new();
    let mut stats = LaneStats::default();
    shared.sink.begin_lane(lane).map_err(|e| shared.sink_error(e))?;
    let result = (|| -> Result<(), IoError> {
        loop {
            while let Some((_, p)) = pending.front() {
                if !shared.sink.poll(p).map_err(|e| shared.sink_error(e))? {
                    break;
                }
                if let Some((slot, _)) = pending.pop_front() {
                    free.push(slot);
                }
            }
            if free.is_empty() {
                let Some((slot, p)) = pending.pop_front() else { return Ok(()) };
                let t = Instant::now();
                shared.sink.wait(p).map_err(|e| shared.sink_error(e))?;
                stats.backpressure += t.elapsed();
                free.push(slot);
            }
            let Some(op_idx) = shared.next_op() else { return Ok(()) };
            let Some(slot) = free.pop() else { return Ok(()) };
            let op = &shared.plan.ops[op_idx];
            let file = &shared.files[op.file as usize];
            let (base, slot_len) = ptrs[slot];
            let mut reading = Reading::start(op_idx, op.direct && file.direct.is_some());
            stats.ops += 1;
            if let Some(targets) = in_place_targets(shared.plan, op, shared.sink) {
                // Straight into the destinations: no slot, no delivery.
                free.push(slot);
                loop {
                    let req = reading.request(op);
                    if let Some(f) = shared.faults {
                        f.before_read(op.file, &file.path, req.offset, req.len);
                    }
                    let iov = iovecs(&targets, req.offset - op.offset, req.len);
                    let t = Instant::now();
                    // SAFETY: the iovecs cover destination ranges of the sink that only this op writes (the plan
                    // has no overlapping destinations) and that outlive the load; the descriptor is open.
                    let r = unsafe {
                        libc::preadv(
                            std::os::fd::AsRawFd::as_raw_fd(&file.buffered),
                            iov.as_ptr(),
                            iov.len() as i32,
                            req.offset as i64,
                        )
                    };
                    stats.io_wait += t.elapsed();
                    let mut result = if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(r as usize) };
                    if let Some(f) = shared.faults {
                        result = f.after_read(op.file, req.offset, req.len, result);
                    }
                    if let Next::Complete = reading.on_result(op, file, result, &mut stats)? {
                        break;
                    }
                }
                shared.add_progress(op.valid);
                continue;
            }
            loop {
                let req = reading.request(op);
                if let Some(f) = shared.faults {
                    f.before_read(op.file, &file.path, req.offset, req.len);
                }
                let at = (req.offset - op.offset) as usize;
                let len = (req.len as usize).min(slot_len - at);
                // SAFETY: `at + len <= slot_len`; this slot is owned by this lane and not part of any pending
                // delivery (it came from the free list), so nothing else reads or writes it now.
                let buf = unsafe { std::slice::from_raw_parts_mut(base.add(at), len) };
                let fd = match (&file.direct, req.direct) {
                    (Some(d), true) => d,
                    _ => &file.buffered,
                };
                let t = Instant::now();
                let mut result = fd.read_at(buf, req.offset);
                stats.io_wait += t.elapsed();
                if let Some(f) = shared.faults {
                    result = f.after_read(op.file, req.offset, req.len, result);
                }
                if let Next::Complete = reading.on_result(op, file, result, &mut stats)? {
                    break;
                }
            }
            // SAFETY: the read into this slot has completed; the slice lives for the `deliver` call only and the
            // slot is not reused until the delivery is done.
            let data = unsafe { std::slice::from_raw_parts(base, op.valid as usize) };
            let t = Instant::now();
            let p = shared.sink.deliver(lane, shared.plan.pieces_of(op), data).map_err(|e| shared.sink_error(e))?;
            stats.deliver += t.elapsed();
            shared.add_progress(op.valid);
            match p {
                Some(p) => pending.push_back((slot, p)),
                None => free.push(slot),
            }
        }
    })();
    let mut first_err = result.err();
    if first_err.is_some() {
        shared.fail();
    }
    for (_, p) in pending.drain(..) {
        if let Err(e) = shared.sink.wait(p) {
            first_err.get_or_insert_with(|| shared.sink_error(e));
        }
    }
    if let Err(e) = shared.sink.end_lane(lane) {
        first_err.get_or_insert_with(|| shared.sink_error(e));
    }
    first_err.map_or(Ok(stats), Err)
}
