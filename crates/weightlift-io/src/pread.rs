//! The fallback interface for kernels or sandboxes without io_uring: each lane issues one blocking `pread` (or
//! `preadv` straight into host destinations) at a time; lanes are more numerous instead. A read completes as it
//! is pushed, so the lane loop is the same for both interfaces.

use std::collections::VecDeque;
use std::io;

use crate::error::IoError;
use crate::submit::{Submission, Submitter};

#[derive(Default)]
pub(crate) struct Blocking {
    done: VecDeque<(u64, io::Result<usize>)>,
}

impl Submitter for Blocking {
    unsafe fn push(&mut self, user_data: u64, s: Submission) -> Result<(), IoError> {
        let r = match s {
            // SAFETY: the caller guarantees `buf..buf + len` is writable and unaliased until the completion is
            // returned, which happens after this call.
            Submission::Slot { fd, buf, len, offset, .. } => unsafe {
                libc::pread(fd, buf.cast(), len as usize, offset as libc::off_t)
            },
            // SAFETY: as above, for every iovec.
            Submission::Vectored { fd, iov, count, offset } => unsafe {
                libc::preadv(fd, iov, count as i32, offset as libc::off_t)
            },
            Submission::Object { .. } => {
                return Err(IoError::Destinations("an object read reached the file interface".into()));
            }
        };
        self.done.push_back((user_data, if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r as usize) }));
        Ok(())
    }

    fn complete(&mut self, out: &mut Vec<(u64, io::Result<usize>)>) -> Result<(), IoError> {
        out.extend(self.done.drain(..));
        Ok(())
    }

    unsafe fn register(&mut self, _region: Option<(*mut u8, usize)>) -> (bool, Option<String>) {
        (false, Some("pread lanes use no fixed buffers".into()))
    }
}
