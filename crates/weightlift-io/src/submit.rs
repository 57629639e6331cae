//! What a lane hands to its kernel interface, and the interface itself: the one seam between a lane's loop and
//! io_uring or blocking reads. Plain data up to `push`, where memory is handed over.

use std::io;

use crate::error::IoError;

/// A read handed to the kernel interface. The memory it names stays valid and untouched until its completion.
pub(crate) enum Submission {
    /// Into a staging slot (`fixed`: within the region registered as fixed buffer 0).
    Slot { fd: i32, buf: *mut u8, len: u32, offset: u64, fixed: bool },
    /// Straight into host destinations.
    Vectored { fd: i32, iov: *const libc::iovec, count: u32, offset: u64 },
    /// A part of an object's GET (see `objects`), into a staging slot or straight into host destinations.
    Object {
        stream: std::sync::Arc<weightlift_remote::GetStream>,
        part: usize,
        /// Where the part's bytes go, in order.
        segments: Vec<(*mut u8, usize)>,
        /// The part's offset in the object.
        offset: u64,
        /// Whether the read's job is stopping (cancelled or failed): the read then ends early.
        stop: std::sync::Arc<dyn Fn() -> bool + Send + Sync>,
        /// The object's local copy being written (`remote_cache_dir`): the bytes go there too once they landed.
        copy: Option<std::sync::Arc<crate::object_cache::CacheFill>>,
    },
}

/// The kernel interface of a lane: io_uring, or blocking reads that complete as they are pushed.
pub(crate) trait Submitter: Send {
    /// Queues a read tagged `user_data`.
    ///
    /// # Safety
    /// The memory named by `s` must stay valid, and untouched by anything else, until the completion carrying
    /// `user_data` has been returned by [`Submitter::complete`].
    unsafe fn push(&mut self, user_data: u64, s: Submission) -> Result<(), IoError>;

    /// Waits for at least one completion (reads are outstanding) and appends every available one to `out`.
    fn complete(&mut self, out: &mut Vec<(u64, io::Result<usize>)>) -> Result<(), IoError>;

    /// Registers `region` as fixed buffer 0 (replacing an earlier registration); `None` drops the registration.
    /// Returns whether fixed reads may be used, and why not.
    ///
    /// # Safety
    /// The region must stay mapped until it is replaced or dropped here, and no read may be in flight.
    unsafe fn register(&mut self, region: Option<(*mut u8, usize)>) -> (bool, Option<String>);
}
