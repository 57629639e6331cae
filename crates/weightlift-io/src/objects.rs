//! A lane's reads from objects, beside its reads from files: each is a part of a ranged GET running on the network
//! runtime (`weightlift_remote::GetStream`), writing into the same staging slot a file read would (or straight into
//! host destinations), and completing through the lane's one completion queue, so that the lane loop,
//! `Reading::on_result` and the deliveries are the same for both.

use std::io;
use std::sync::mpsc::{Receiver, Sender, channel};

use crate::error::IoError;
use crate::submit::{Submission, Submitter};

type Completion = (u64, io::Result<usize>);

/// Where an object read's bytes landed, read by the thread that writes them into the object's local copy before
/// it hands the completion back.
struct Landed(Vec<(*mut u8, usize)>);

// SAFETY: the pointers are only read by the one thread that writes the copy, before the completion is sent, while
// the lane keeps the slot (and its destinations) as the read's (see `push`).
unsafe impl Send for Landed {}

impl Landed {
    // A method, not the field: a closure using `landed.0` would capture the bare (not `Send`) pointers.
    fn segments(&self) -> &[(*mut u8, usize)] {
        &self.0
    }
}

/// A lane's kernel interface for files, with object reads beside it.
pub(crate) struct WithObjects {
    files: Box<dyn Submitter>,
    done_tx: Sender<Completion>,
    done_rx: Receiver<Completion>,
    files_inflight: usize,
    objects_inflight: usize,
}

impl WithObjects {
    pub fn new(files: Box<dyn Submitter>) -> WithObjects {
        let (done_tx, done_rx) = channel();
        WithObjects { files, done_tx, done_rx, files_inflight: 0, objects_inflight: 0 }
    }

    fn take_ready(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut n = 0;
        while let Ok(c) = self.done_rx.try_recv() {
            out.push(c);
            n += 1;
        }
        self.objects_inflight -= n;
        n
    }
}

impl Submitter for WithObjects {
    unsafe fn push(&mut self, user_data: u64, s: Submission) -> Result<(), IoError> {
        match s {
            Submission::Object { stream, part, segments, offset, stop, copy } => {
                let tx = self.done_tx.clone();
                let landed = Landed(segments.clone());
                let done = move |r: Result<usize, weightlift_remote::RemoteError>| {
                    let ok = r.is_ok();
                    let completion = (user_data, r.map_err(weightlift_remote::RemoteError::into_io));
                    match (ok, copy) {
                        // The write may wait on the disk: off the thread that serves sockets, the completion sent
                        // only once the bytes are in the copy.
                        (true, Some(copy)) => weightlift_remote::run_blocking(move || {
                            let mut at = offset;
                            for &(ptr, n) in landed.segments() {
                                // SAFETY: the part's bytes are in its segments, which stay valid and untouched
                                // until the completion sent below is returned (the slot is still this read's).
                                let bytes = unsafe { std::slice::from_raw_parts(ptr, n) };
                                copy.write(at, bytes);
                                at += n as u64;
                            }
                            let _ = tx.send(completion);
                        }),
                        _ => {
                            let _ = tx.send(completion);
                        }
                    }
                };
                // SAFETY: the caller keeps the segments valid and untouched until this read's completion is
                // returned by `complete`, which happens only after `done` has run.
                unsafe { stream.fill(part, segments, Some(stop), done) };
                self.objects_inflight += 1;
                Ok(())
            }
            s => {
                // SAFETY: forwarded with the caller's guarantee.
                unsafe { self.files.push(user_data, s) }?;
                self.files_inflight += 1;
                Ok(())
            }
        }
    }

    fn complete(&mut self, out: &mut Vec<Completion>) -> Result<(), IoError> {
        // Object completions ready now are returned without waiting on the file interface; a lane reading files
        // and objects at once (a load of both) submits its queued file reads on a later call.
        if self.take_ready(out) > 0 {
            return Ok(());
        }
        if self.files_inflight > 0 {
            // File reads complete quickly; an object read that completes meanwhile is taken on the next call.
            let before = out.len();
            self.files.complete(out)?;
            self.files_inflight -= out.len() - before;
            return Ok(());
        }
        if self.objects_inflight > 0 {
            // `done_tx` lives in `self`, so the channel cannot disconnect while reads are outstanding.
            if let Ok(c) = self.done_rx.recv() {
                out.push(c);
                self.objects_inflight -= 1;
                self.take_ready(out);
            }
        }
        Ok(())
    }

    unsafe fn register(&mut self, region: Option<(*mut u8, usize)>) -> (bool, Option<String>) {
        // SAFETY: forwarded with the caller's guarantee (object reads never use the fixed buffer).
        unsafe { self.files.register(region) }
    }
}
