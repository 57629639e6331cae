//! Where completed reads go. The engine hands each completed read's bytes to a sink, which copies the pieces to
//! their destinations (host memory here; device memory in the CUDA crate).

use std::fmt;
use std::marker::PhantomData;

use crate::plan::Piece;

pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// A destination for loaded bytes, used from several I/O threads ("lanes") at once.
///
/// Contract the engine keeps: the memory behind `data` in [`Sink::deliver`] is neither written nor freed until the
/// returned pending delivery (if any) has been reported done by [`Sink::poll`] or [`Sink::wait`]. A sink may
/// therefore keep reading `data` asynchronously (a DMA copy) after `deliver` returns.
pub trait Sink: Sync {
    /// An asynchronous delivery still reading from a staging slot.
    type Pending: Send;

    /// Whether deliveries can stay pending (keep reading their slot after `deliver` returns). Synchronous sinks
    /// need no more slots than reads in flight; asynchronous ones get spare slots to overlap copies with reads.
    fn asynchronous(&self) -> bool {
        false
    }

    /// The host address where `piece`'s bytes go, when this sink's destinations are host memory that reads may
    /// target directly (then a buffered read lands in place, with no staging copy). `None` by default.
    fn host_destination(&self, _piece: &Piece) -> Option<*mut u8> {
        None
    }

    /// Called on each lane's thread before its first delivery.
    fn begin_lane(&self, _lane: usize) -> Result<(), SinkError> {
        Ok(())
    }

    /// Delivers a completed read: `data[p.at..p.at + p.len]` goes to destination `p.dest` at `p.dest_offset`.
    fn deliver(&self, lane: usize, pieces: &[Piece], data: &[u8]) -> Result<Option<Self::Pending>, SinkError>;

    /// Whether a pending delivery has finished reading its slot.
    fn poll(&self, pending: &Self::Pending) -> Result<bool, SinkError>;

    /// Blocks until a pending delivery has finished reading its slot.
    fn wait(&self, pending: Self::Pending) -> Result<(), SinkError>;

    /// Called on each lane's thread after its last delivery has completed.
    fn end_lane(&self, _lane: usize) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Copies pieces into caller-owned host byte buffers (one per destination id).
pub struct HostSink<'a> {
    dests: Vec<(*mut u8, usize)>,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl fmt::Debug for HostSink<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostSink").field("dests", &self.dests.len()).finish()
    }
}

// SAFETY: the raw pointers come from `&'a mut` borrows held for the sink's lifetime; deliveries from different
// threads write disjoint ranges (the planner rejects overlapping destination ranges) after a bounds check.
unsafe impl Sync for HostSink<'_> {}
// SAFETY: as above; the sink owns nothing and only writes through the borrowed pointers.
unsafe impl Send for HostSink<'_> {}

impl<'a> HostSink<'a> {
    /// A sink writing into `buffers`, destination id `i` being `buffers[i]`.
    pub fn new<B: std::ops::DerefMut<Target = [u8]>>(buffers: &'a mut [B]) -> HostSink<'a> {
        let dests = buffers.iter_mut().map(|b| (b.as_mut_ptr(), b.len())).collect();
        HostSink { dests, _borrow: PhantomData }
    }
}

impl Sink for HostSink<'_> {
    type Pending = ();

    fn host_destination(&self, p: &Piece) -> Option<*mut u8> {
        let (dst, cap) = *self.dests.get(p.dest as usize)?;
        let end = p.dest_offset.checked_add(p.len)?;
        // SAFETY: `dest_offset + len <= cap` (checked), so the address stays inside the destination.
        (end <= cap as u64).then(|| unsafe { dst.add(p.dest_offset as usize) })
    }

    fn deliver(&self, _lane: usize, pieces: &[Piece], data: &[u8]) -> Result<Option<()>, SinkError> {
        for p in pieces {
            let (dst, cap) = *self.dests.get(p.dest as usize).ok_or_else(|| format!("no destination {}", p.dest))?;
            let (at, len, off) = (p.at as usize, p.len as usize, p.dest_offset as usize);
            if at.checked_add(len).is_none_or(|e| e > data.len()) || off.checked_add(len).is_none_or(|e| e > cap) {
                return Err(format!("piece {p:?} out of bounds (read {} bytes, destination {cap})", data.len()).into());
            }
            // SAFETY: both ranges were bounds-checked just above; the destination range is written by this piece
            // alone (the plan has no overlapping destination ranges) and the source is a completed read.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(at), dst.add(off), len) };
        }
        Ok(None)
    }

    fn poll(&self, _pending: &()) -> Result<bool, SinkError> {
        Ok(true)
    }

    fn wait(&self, _pending: ()) -> Result<(), SinkError> {
        Ok(())
    }
}
