//! Where completed reads go. The lanes hand each completed read's bytes to a sink, which copies the pieces to their
//! destinations (host memory here; device memory in the CUDA crate).

use std::fmt;

use crate::plan::Piece;

/// What a sink's failure carries: any error (the CUDA crate's device errors, say).
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// A delivery that may still be reading its staging slot (an asynchronous device copy).
pub trait Pending: Send {
    /// Whether the delivery has finished reading its slot.
    fn poll(&mut self) -> Result<bool, SinkError>;
    /// Blocks until the delivery has finished reading its slot.
    fn wait(self: Box<Self>) -> Result<(), SinkError>;
}

/// A destination for loaded bytes, used from several I/O threads ("lanes") at once.
///
/// Contract the lanes keep: the memory behind `data` in [`Sink::deliver`] is neither written nor freed until the
/// returned [`Pending`] (if any) has reported completion. A sink may therefore keep reading `data` asynchronously
/// (a DMA copy) after `deliver` returns.
pub trait Sink: Send + Sync {
    /// Whether deliveries can stay pending. Synchronous sinks need no more slots than reads in flight; asynchronous
    /// ones get spare slots to overlap copies with reads.
    fn asynchronous(&self) -> bool {
        false
    }

    /// Destinations that reads may target directly, when this sink's destinations are host memory (then a buffered
    /// read lands in place, with no staging copy).
    fn in_place(&self) -> Option<&dyn InPlace> {
        None
    }

    /// Called on a lane's thread before its first delivery of a load.
    fn begin_lane(&self, _lane: usize) -> Result<(), SinkError> {
        Ok(())
    }

    /// Delivers a completed read: `data[p.at..p.at + p.len]` goes to destination `p.dest` at `p.dest_offset`.
    fn deliver(&self, lane: usize, pieces: &[Piece], data: &[u8]) -> Result<Option<Box<dyn Pending>>, SinkError>;

    /// Called once `pieces` are in their destinations (after a synchronous delivery, a pending one's completion, or
    /// an in-place read). Streaming loads count landed bytes per destination here.
    fn landed(&self, _pieces: &[Piece]) {}

    /// Called on a lane's thread after its last delivery of a load has completed.
    fn end_lane(&self, _lane: usize) -> Result<(), SinkError> {
        Ok(())
    }
}

/// A sink that reports every landing to `observer` (a checker hashing destinations as they complete, say) and
/// otherwise behaves as `inner`.
pub struct Observed<'a> {
    /// The sink that takes the bytes.
    pub inner: &'a dyn Sink,
    /// Called with the pieces of every landing, after `inner`'s `landed`.
    pub observer: &'a Observer<'a>,
}

/// What [`Observed`] tells about landings.
pub type Observer<'a> = dyn Fn(&[Piece]) + Sync + 'a;

impl fmt::Debug for Observed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Observed")
    }
}

impl Sink for Observed<'_> {
    fn asynchronous(&self) -> bool {
        self.inner.asynchronous()
    }
    fn in_place(&self) -> Option<&dyn InPlace> {
        self.inner.in_place()
    }
    fn begin_lane(&self, lane: usize) -> Result<(), SinkError> {
        self.inner.begin_lane(lane)
    }
    fn deliver(&self, lane: usize, pieces: &[Piece], data: &[u8]) -> Result<Option<Box<dyn Pending>>, SinkError> {
        self.inner.deliver(lane, pieces, data)
    }
    fn landed(&self, pieces: &[Piece]) {
        self.inner.landed(pieces);
        (self.observer)(pieces);
    }
    fn end_lane(&self, lane: usize) -> Result<(), SinkError> {
        self.inner.end_lane(lane)
    }
}

/// Host destinations that reads may write straight into.
///
/// # Safety
/// Implementors guarantee that an address returned for a piece is valid for writes of `piece.len` bytes, that no
/// other piece of the same load maps to any of those bytes, and that the memory stays valid and untouched by
/// anything else until the load using the sink has returned. The lanes hand such addresses to the kernel.
pub unsafe trait InPlace: Sync {
    /// The host address where `piece`'s bytes go, if this piece may be read in place.
    fn host_destination(&self, piece: &Piece) -> Option<*mut u8>;
}

/// Copies pieces into host memory (one range per destination id).
pub struct HostSink {
    dests: Vec<(*mut u8, usize)>,
}

impl fmt::Debug for HostSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostSink").field("dests", &self.dests.len()).finish()
    }
}

// SAFETY: the ranges are valid for the sink's use by `HostSink::new`'s contract; deliveries from different threads
// write disjoint ranges (the planner rejects overlapping destination ranges) after a bounds check.
unsafe impl Sync for HostSink {}
// SAFETY: as above; the sink owns nothing and only writes through the pointers it was given.
unsafe impl Send for HostSink {}

impl HostSink {
    /// A sink writing into `dests`, destination id `i` being the `dests[i].1` bytes at `dests[i].0`.
    ///
    /// # Safety
    /// Each range must be valid for writes, not overlap another, and not be accessed by anything else until every
    /// load using this sink has returned.
    pub unsafe fn new(dests: Vec<(*mut u8, usize)>) -> HostSink {
        HostSink { dests }
    }

    /// A sink over borrowed buffers (the borrow outlives the sink, so the ranges stay valid).
    pub fn borrowing<B: std::ops::DerefMut<Target = [u8]>>(buffers: &mut [B]) -> BorrowedHostSink<'_> {
        let dests = buffers.iter_mut().map(|b| (b.as_mut_ptr(), b.len())).collect();
        // SAFETY: the buffers are borrowed mutably for the returned sink's lifetime, are distinct slices, and cannot
        // be touched by anyone else while the borrow lasts.
        BorrowedHostSink { sink: unsafe { HostSink::new(dests) }, _borrow: std::marker::PhantomData }
    }

    fn target(&self, p: &Piece) -> Option<*mut u8> {
        let (dst, cap) = *self.dests.get(p.dest as usize)?;
        let end = p.dest_offset.checked_add(p.len)?;
        // SAFETY: `dest_offset + len <= cap` (checked), so the address stays inside the destination.
        (end <= cap as u64).then(|| unsafe { dst.add(p.dest_offset as usize) })
    }
}

// SAFETY: `target` returns addresses inside the destination ranges only (bounds-checked), which `HostSink::new`'s
// contract makes valid and exclusive for the load; the planner gives every destination byte to one piece.
unsafe impl InPlace for HostSink {
    fn host_destination(&self, piece: &Piece) -> Option<*mut u8> {
        self.target(piece)
    }
}

impl Sink for HostSink {
    fn in_place(&self) -> Option<&dyn InPlace> {
        Some(self)
    }

    fn deliver(&self, _lane: usize, pieces: &[Piece], data: &[u8]) -> Result<Option<Box<dyn Pending>>, SinkError> {
        for p in pieces {
            let fits = p.at.checked_add(p.len).is_some_and(|e| e <= data.len() as u64);
            let dst = self.target(p).filter(|_| fits).ok_or_else(|| {
                format!("piece {p:?} out of bounds (read {} bytes, {} destinations)", data.len(), self.dests.len())
            })?;
            // SAFETY: both ranges were bounds-checked just above; the destination range is written by this piece
            // alone (the plan has no overlapping destination ranges) and the source is a completed read.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(p.at as usize), dst, p.len as usize) };
        }
        Ok(None)
    }
}

/// A [`HostSink`] over buffers borrowed for its lifetime.
pub struct BorrowedHostSink<'a> {
    sink: HostSink,
    _borrow: std::marker::PhantomData<&'a mut [u8]>,
}

impl fmt::Debug for BorrowedHostSink<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.sink.fmt(f)
    }
}

impl std::ops::Deref for BorrowedHostSink<'_> {
    type Target = HostSink;
    fn deref(&self) -> &HostSink {
        &self.sink
    }
}
