//! Queue bookkeeping, written once: the host's submission tail and completion head with its phase tag, the
//! controller's mirror of both, and the command-identifier slots a host hands out. The CPU submitter and the
//! software controller run this code; the GPU kernel (`gpu::KERNEL_SOURCE`) transcribes the host half line for line
//! and is generated with the same constants.
#![forbid(unsafe_code)]

/// Smallest queue size the spec allows (entries).
pub const MIN_ENTRIES: u32 = 2;
/// Largest queue size the spec allows (entries).
pub const MAX_ENTRIES: u32 = 65536;

fn valid(entries: u32) -> bool {
    (MIN_ENTRIES..=MAX_ENTRIES).contains(&entries)
}

/// The host's view of a submission queue: where it writes next (tail) and what the controller has consumed (head,
/// from completions). One entry always stays empty, so a full queue holds `entries - 1` commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqRing {
    entries: u32,
    tail: u32,
    head: u32,
}

impl SqRing {
    /// An empty queue of `entries` entries; `None` outside [`MIN_ENTRIES`]..=[`MAX_ENTRIES`].
    pub fn new(entries: u32) -> Option<SqRing> {
        valid(entries).then_some(SqRing { entries, tail: 0, head: 0 })
    }

    /// Resumes a ring whose tail and head another agent (the GPU) moved.
    pub fn resume(entries: u32, tail: u32, head: u32) -> Option<SqRing> {
        (valid(entries) && tail < entries && head < entries).then_some(SqRing { entries, tail, head })
    }

    /// The queue's size in entries.
    pub fn entries(&self) -> u32 {
        self.entries
    }
    /// The next entry the host writes (what it rings the tail doorbell with).
    pub fn tail(&self) -> u32 {
        self.tail
    }
    /// The next entry the controller consumes, as the last completion reported.
    pub fn head(&self) -> u32 {
        self.head
    }

    /// Entries written and not yet consumed by the controller.
    pub fn used(&self) -> u32 {
        (self.tail + self.entries - self.head) % self.entries
    }

    /// Whether `entries - 1` commands are waiting (no entry can be written).
    pub fn is_full(&self) -> bool {
        self.used() == self.entries - 1
    }

    /// Takes the entry at the tail and moves the tail past it (wrapping); `None` when the queue is full.
    pub fn push(&mut self) -> Option<u32> {
        if self.is_full() {
            return None;
        }
        let slot = self.tail;
        self.tail = (self.tail + 1) % self.entries;
        Some(slot)
    }

    /// Takes the SQ head a completion reports. A head outside the entries between the current head and the tail
    /// (a controller bug, or a stale completion) is refused.
    pub fn update_head(&mut self, head: u32) -> bool {
        if head >= self.entries {
            return false;
        }
        let advanced = (head + self.entries - self.head) % self.entries;
        if advanced > self.used() {
            return false;
        }
        self.head = head;
        true
    }
}

/// The host's view of a completion queue: the next entry to look at and the phase tag that marks it new. Queue
/// memory starts zeroed and the controller's first pass writes phase 1, so the expected phase starts at 1 and flips
/// each time the head wraps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqRing {
    entries: u32,
    head: u32,
    phase: bool,
}

impl CqRing {
    /// A fresh queue of `entries` entries (head 0, expecting phase 1); `None` outside
    /// [`MIN_ENTRIES`]..=[`MAX_ENTRIES`].
    pub fn new(entries: u32) -> Option<CqRing> {
        valid(entries).then_some(CqRing { entries, head: 0, phase: true })
    }

    /// Resumes a ring whose head and phase another agent (the GPU) moved.
    pub fn resume(entries: u32, head: u32, phase: bool) -> Option<CqRing> {
        (valid(entries) && head < entries).then_some(CqRing { entries, head, phase })
    }

    /// The queue's size in entries.
    pub fn entries(&self) -> u32 {
        self.entries
    }
    /// The next entry to look at (what the host rings the head doorbell with once it consumed the ones before).
    pub fn head(&self) -> u32 {
        self.head
    }
    /// The phase tag a new entry at the head carries.
    pub fn phase(&self) -> bool {
        self.phase
    }

    /// Whether the entry at the head, whose DW3 is `dw3`, was posted on this pass.
    pub fn is_new(&self, dw3: u32) -> bool {
        ((dw3 >> 16) & 1 == 1) == self.phase
    }

    /// Consumes the entry at the head.
    pub fn advance(&mut self) {
        self.head += 1;
        if self.head == self.entries {
            self.head = 0;
            self.phase = !self.phase;
        }
    }
}

/// The controller's view of a submission queue: it consumes from its head up to the tail the host rang.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqConsumer {
    entries: u32,
    head: u32,
}

impl SqConsumer {
    /// A fresh queue of `entries` entries; `None` outside [`MIN_ENTRIES`]..=[`MAX_ENTRIES`].
    pub fn new(entries: u32) -> Option<SqConsumer> {
        valid(entries).then_some(SqConsumer { entries, head: 0 })
    }
    /// The next entry to fetch (what completions report as the SQ head).
    pub fn head(&self) -> u32 {
        self.head
    }
    /// The next entry to fetch given the doorbell's `tail`, or `None` when there is none; `Err` for a tail outside
    /// the queue (an invalid doorbell write).
    pub fn pop(&mut self, tail: u32) -> Result<Option<u32>, u32> {
        if tail >= self.entries {
            return Err(tail);
        }
        if self.head == tail {
            return Ok(None);
        }
        let slot = self.head;
        self.head = (self.head + 1) % self.entries;
        Ok(Some(slot))
    }
}

/// The controller's view of a completion queue: where it posts next, with which phase, and how far the host has
/// consumed (its head doorbell).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqProducer {
    entries: u32,
    tail: u32,
    phase: bool,
    head: u32,
}

impl CqProducer {
    /// A fresh queue of `entries` entries (posting with phase 1 first); `None` outside
    /// [`MIN_ENTRIES`]..=[`MAX_ENTRIES`].
    pub fn new(entries: u32) -> Option<CqProducer> {
        valid(entries).then_some(CqProducer { entries, tail: 0, phase: true, head: 0 })
    }

    /// Takes the head doorbell's value; `false` for a value outside the queue.
    pub fn set_head(&mut self, head: u32) -> bool {
        if head >= self.entries {
            return false;
        }
        self.head = head;
        true
    }

    /// Whether posting another entry would overwrite one the host has not consumed.
    pub fn is_full(&self) -> bool {
        (self.tail + 1) % self.entries == self.head
    }

    /// The entry to post into and the phase tag to post with, advancing the tail; `None` when full.
    pub fn push(&mut self) -> Option<(u32, bool)> {
        if self.is_full() {
            return None;
        }
        let at = (self.tail, self.phase);
        self.tail += 1;
        if self.tail == self.entries {
            self.tail = 0;
            self.phase = !self.phase;
        }
        Some(at)
    }
}

/// Command identifiers of a queue pair, each naming a slot (data buffer and PRP list) that belongs to the command
/// until its completion is consumed.
#[derive(Clone, Debug)]
pub struct SlotPool {
    free: Vec<u16>,
    capacity: usize,
}

impl SlotPool {
    /// Slots `0..capacity`, all free.
    pub fn new(capacity: u16) -> SlotPool {
        SlotPool { free: (0..capacity).rev().collect(), capacity: usize::from(capacity) }
    }
    /// A free slot (the lowest-numbered first, at the start), or `None` when all are in use.
    pub fn take(&mut self) -> Option<u16> {
        self.free.pop()
    }
    /// Returns a slot; a slot not taken (or given twice) is refused.
    pub fn give(&mut self, slot: u16) -> bool {
        if usize::from(slot) >= self.capacity || self.free.contains(&slot) {
            return false;
        }
        self.free.push(slot);
        true
    }
    /// Slots taken and not given back.
    pub fn in_use(&self) -> usize {
        self.capacity - self.free.len()
    }
    /// How many slots there are.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_controller_agree_through_wraps() {
        let entries = 4;
        let mut sq = SqRing::new(entries).unwrap();
        let mut cq = CqRing::new(entries).unwrap();
        let mut sqc = SqConsumer::new(entries).unwrap();
        let mut cqp = CqProducer::new(entries).unwrap();
        // The completion queue's memory: phase bits as the controller wrote them (zeroed at start).
        let mut cq_mem = vec![0u32; entries as usize];
        let mut flips = 0;
        for round in 0..50u32 {
            let n = 1 + round % 3;
            for _ in 0..n {
                sq.push().unwrap();
            }
            assert_eq!(sq.used(), n);
            while let Some(_slot) = sqc.pop(sq.tail()).unwrap() {
                assert!(cqp.set_head(cq.head()));
                let (at, phase) = cqp.push().unwrap();
                cq_mem[at as usize] = u32::from(phase) << 16;
            }
            let mut seen = 0;
            while cq.is_new(cq_mem[cq.head() as usize]) {
                let before = cq.phase();
                cq.advance();
                if cq.phase() != before {
                    flips += 1;
                }
                seen += 1;
            }
            assert_eq!(seen, n);
            assert!(sq.update_head(sqc.head()));
            assert_eq!(sq.used(), 0);
        }
        assert!(flips >= 20, "the phase flipped on every wrap ({flips})");
    }

    #[test]
    fn full_queues_refuse() {
        let mut sq = SqRing::new(3).unwrap();
        assert!(sq.push().is_some() && sq.push().is_some());
        assert!(sq.is_full() && sq.push().is_none());
        assert!(!sq.update_head(3), "head outside the queue");
        assert!(sq.update_head(1));
        assert!(!sq.update_head(0), "head may not move backwards past the tail");
        let mut cqp = CqProducer::new(2).unwrap();
        assert!(cqp.push().is_some());
        assert!(cqp.push().is_none(), "a 2-entry CQ holds one unconsumed completion");
        assert!(cqp.set_head(1) && cqp.push().is_some());
        let mut sqc = SqConsumer::new(4).unwrap();
        assert_eq!(sqc.pop(4), Err(4));
        assert!(SqRing::new(1).is_none() && SqRing::new(65537).is_none());
    }

    #[test]
    fn slots_are_unique() {
        let mut p = SlotPool::new(3);
        let a: Vec<u16> = (0..3).filter_map(|_| p.take()).collect();
        assert_eq!(a, vec![0, 1, 2]);
        assert!(p.take().is_none());
        assert!(p.give(1) && !p.give(1) && !p.give(7));
        assert_eq!(p.in_use(), 2);
    }
}
