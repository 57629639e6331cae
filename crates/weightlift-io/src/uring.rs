//! The io_uring interface of a lane: one ring per lane for the engine's life, its staging registered once as a
//! fixed buffer, reads pushed by the lane and reaped in batches.

use std::io;
use std::sync::OnceLock;

use io_uring::{IoUring, opcode, squeue, types};

use crate::error::IoError;
use crate::submit::{Submission, Submitter};

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

/// A lane's ring: reads into its staging (fixed buffer 0 when the kernel accepts the registration) or straight
/// into host destinations (readv).
pub(crate) struct Ring {
    ring: IoUring,
    registered: bool,
}

impl Ring {
    pub fn new(queue_depth: usize) -> Result<Ring, IoError> {
        let entries = (queue_depth * 2).next_power_of_two().max(8) as u32;
        let ring = IoUring::builder().build(entries).map_err(|cause| IoError::Uring { call: "setup", cause })?;
        Ok(Ring { ring, registered: false })
    }

    fn push_entry(&mut self, entry: squeue::Entry) -> Result<(), IoError> {
        loop {
            // SAFETY: the entry's memory is valid until its completion (the caller's contract in `push`).
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return Ok(());
            }
            self.ring.submit().map_err(|cause| IoError::Uring { call: "submit", cause })?;
        }
    }
}

impl Submitter for Ring {
    unsafe fn push(&mut self, user_data: u64, s: Submission) -> Result<(), IoError> {
        let entry = match s {
            Submission::Slot { fd, buf, len, offset, fixed: true } if self.registered => {
                opcode::ReadFixed::new(types::Fd(fd), buf, len, 0).offset(offset).build()
            }
            Submission::Slot { fd, buf, len, offset, .. } => {
                opcode::Read::new(types::Fd(fd), buf, len).offset(offset).build()
            }
            Submission::Vectored { fd, iov, count, offset } => {
                opcode::Readv::new(types::Fd(fd), iov, count).offset(offset).build()
            }
            Submission::Object { .. } => {
                return Err(IoError::Destinations("an object read reached the file interface".into()));
            }
        };
        self.push_entry(entry.user_data(user_data))
    }

    fn complete(&mut self, out: &mut Vec<(u64, io::Result<usize>)>) -> Result<(), IoError> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => break,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)) => {}
                Err(cause) => return Err(IoError::Uring { call: "submit", cause }),
            }
        }
        out.extend(self.ring.completion().map(|c| {
            let r = c.result();
            (c.user_data(), if r < 0 { Err(io::Error::from_raw_os_error(-r)) } else { Ok(r as usize) })
        }));
        Ok(())
    }

    unsafe fn register(&mut self, region: Option<(*mut u8, usize)>) -> (bool, Option<String>) {
        if self.registered {
            let _ = self.ring.submitter().unregister_buffers();
            self.registered = false;
        }
        let Some((ptr, len)) = region else { return (false, None) };
        let iov = [libc::iovec { iov_base: ptr.cast(), iov_len: len }];
        // SAFETY: the caller keeps the region mapped until it is replaced or dropped through this method.
        match unsafe { self.ring.submitter().register_buffers(&iov) } {
            Ok(()) => {
                self.registered = true;
                (true, None)
            }
            Err(e) => (false, Some(e.to_string())),
        }
    }
}
