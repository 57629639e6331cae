//! Physical Region Pages: how a command names its data buffer (NVMe 2.0 §4.1.1), built by hosts and walked by
//! controllers. Shared by the CPU submitter, the GPU path's per-slot tables and the software controller.
//!
//! PRP1 points at the first byte (dword aligned, any offset within its page). If the transfer ends within a page
//! boundary of PRP1's page, PRP2 is unused; if it needs exactly one more page, PRP2 is that page; otherwise PRP2
//! points at a PRP list (qword aligned, any offset) of page addresses. A list that does not fit in the rest of its
//! page continues on another page named by the page's last entry.
#![forbid(unsafe_code)]

use crate::error::NvmeError;
use crate::spec::{PAGE_SIZE, Status};

const PAGE: u64 = PAGE_SIZE as u64;

/// A built data pointer: the two PRP fields, and the list qwords to store contiguously at the list address (empty
/// when no list is needed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrpSet {
    /// PRP Entry 1: the data's bus address.
    pub prp1: u64,
    /// PRP Entry 2: 0 when the data fits PRP1's page, the second page's address when it ends there, else the list's
    /// bus address.
    pub prp2: u64,
    /// The list's qwords, page addresses (and, where a list page fills, the pointer to the next list page).
    pub list: Vec<u64>,
}

fn pages_after_first(data: u64, len: u64) -> u64 {
    let first = (PAGE - data % PAGE).min(len);
    (len - first).div_ceil(PAGE)
}

/// How many list qwords a transfer of `len` bytes at bus address `data` needs with its list at `list_bus`.
pub fn list_qwords(data: u64, len: u64, list_bus: u64) -> u64 {
    let mut n = pages_after_first(data, len);
    if n <= 1 {
        return 0;
    }
    let mut pos = list_bus;
    let mut total = 0;
    loop {
        let slots = (PAGE - pos % PAGE) / 8;
        if n <= slots {
            return total + n;
        }
        // All but the last slot hold data; the last points at the next page.
        total += slots;
        n -= slots - 1;
        pos += slots * 8;
    }
}

/// Builds the PRPs for `len` bytes of a buffer that is contiguous in bus address space from `data`, with the list
/// (if one is needed) stored contiguously from `list_bus`, within `list_capacity` bytes.
pub fn build(data: u64, len: u64, list_bus: u64, list_capacity: usize) -> Result<PrpSet, NvmeError> {
    if len == 0 {
        return Err(NvmeError::invalid("PRP transfer", "zero-length transfer"));
    }
    if !data.is_multiple_of(4) {
        return Err(NvmeError::invalid("PRP transfer", format!("data address {data:#x} is not dword aligned")));
    }
    data.checked_add(len).ok_or_else(|| NvmeError::invalid("PRP transfer", "address range overflows"))?;
    let second = (data / PAGE + 1) * PAGE;
    let mut n = pages_after_first(data, len);
    match n {
        0 => return Ok(PrpSet { prp1: data, prp2: 0, list: Vec::new() }),
        1 => return Ok(PrpSet { prp1: data, prp2: second, list: Vec::new() }),
        _ => {}
    }
    if !list_bus.is_multiple_of(8) {
        return Err(NvmeError::invalid("PRP list", format!("list address {list_bus:#x} is not qword aligned")));
    }
    let need = list_qwords(data, len, list_bus);
    if need.saturating_mul(8) > list_capacity as u64 {
        return Err(NvmeError::invalid(
            "PRP list",
            format!("a {len}-byte transfer needs {} bytes of list, {list_capacity} are reserved", need * 8),
        ));
    }
    let mut list = Vec::with_capacity(need as usize);
    let mut page = second;
    let mut pos = list_bus;
    loop {
        let slots = (PAGE - pos % PAGE) / 8;
        let data_here = if n <= slots { n } else { slots - 1 };
        for _ in 0..data_here {
            list.push(page);
            page += PAGE;
        }
        n -= data_here;
        if n == 0 {
            break;
        }
        pos += slots * 8;
        list.push(pos);
    }
    Ok(PrpSet { prp1: data, prp2: list_bus, list })
}

/// One contiguous piece of a transfer in bus address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Bus address of the piece's first byte.
    pub addr: u64,
    /// The piece's length in bytes.
    pub len: u64,
}

/// Walks the PRPs of a `len`-byte transfer as a controller does, reading list entries through `read_entry`, and
/// returns the transfer as contiguous segments. Errors are the statuses a controller completes the command with.
pub fn walk(
    prp1: u64,
    prp2: u64,
    len: u64,
    mut read_entry: impl FnMut(u64) -> Result<u64, Status>,
) -> Result<Vec<Segment>, Status> {
    if len == 0 {
        return Ok(Vec::new());
    }
    if !prp1.is_multiple_of(4) {
        return Err(Status::PRP_OFFSET_INVALID);
    }
    let mut segs: Vec<Segment> = Vec::new();
    let mut push = |addr: u64, n: u64| -> Result<(), Status> {
        addr.checked_add(n).ok_or(Status::DATA_TRANSFER_ERROR)?;
        match segs.last_mut() {
            Some(last) if last.addr + last.len == addr => last.len += n,
            _ => segs.push(Segment { addr, len: n }),
        }
        Ok(())
    };
    let first = (PAGE - prp1 % PAGE).min(len);
    push(prp1, first)?;
    let mut rest = len - first;
    if rest == 0 {
        return Ok(segs);
    }
    if rest <= PAGE {
        if !prp2.is_multiple_of(PAGE) {
            return Err(Status::PRP_OFFSET_INVALID);
        }
        push(prp2, rest)?;
        return Ok(segs);
    }
    if !prp2.is_multiple_of(8) {
        return Err(Status::PRP_OFFSET_INVALID);
    }
    let mut pos = prp2;
    let mut n = rest.div_ceil(PAGE);
    // Each list page holds at least one data entry unless it is the first; more reads than this is a loop.
    let mut budget = 2 * n + 2;
    while n > 0 {
        budget = budget.checked_sub(1).ok_or(Status::INVALID_FIELD)?;
        let entry = read_entry(pos)?;
        let last_slot = pos % PAGE == PAGE - 8;
        if last_slot && n > 1 {
            if entry % PAGE != 0 {
                return Err(Status::PRP_OFFSET_INVALID);
            }
            pos = entry;
            continue;
        }
        if entry % PAGE != 0 {
            return Err(Status::PRP_OFFSET_INVALID);
        }
        let take = rest.min(PAGE);
        push(entry, take)?;
        rest -= take;
        n -= 1;
        pos += 8;
    }
    Ok(segs)
}

/// PRPs for a fixed slot buffer, precomputed once for its largest transfer, from which the PRPs of any shorter
/// transfer starting at the same address follow without building: this is what the GPU kernel does per command.
/// Only valid when the slot's list does not chain (a chained list's pointer slot would be read as data by a shorter
/// transfer), which [`SlotPrps::new`] checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotPrps {
    /// PRP Entry 1 of every transfer: the slot's bus address.
    pub prp1: u64,
    /// The page after PRP1's: PRP2 of a transfer that needs exactly one more page.
    pub page2: u64,
    /// Where the slot's list lives: PRP2 of a transfer that needs a list.
    pub list: u64,
    /// Bytes that fit in PRP1's page.
    pub first: u64,
}

impl SlotPrps {
    /// For a slot of `max_len` bytes at `data`, with its list at `list_bus`; returns the list qwords to store.
    pub fn new(
        data: u64,
        max_len: u64,
        list_bus: u64,
        list_capacity: usize,
    ) -> Result<(SlotPrps, Vec<u64>), NvmeError> {
        let set = build(data, max_len, list_bus, list_capacity)?;
        let n = pages_after_first(data, max_len);
        if set.list.len() as u64 > n {
            return Err(NvmeError::invalid(
                "slot PRP list",
                format!("the list at {list_bus:#x} crosses a page boundary; slot lists must not chain"),
            ));
        }
        let prps = SlotPrps {
            prp1: data,
            page2: (data / PAGE + 1) * PAGE,
            list: list_bus,
            first: (PAGE - data % PAGE).min(max_len),
        };
        Ok((prps, set.list))
    }

    /// PRP1 and PRP2 for a transfer of `len` bytes (at most the slot's length) from the slot's start.
    pub fn select(&self, len: u64) -> (u64, u64) {
        let prp2 = if len <= self.first {
            0
        } else if len <= self.first + PAGE {
            self.page2
        } else {
            self.list
        };
        (self.prp1, prp2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Lays a built list out in a sparse "memory" and walks it back.
    fn round_trip(data: u64, len: u64, list_bus: u64) -> PrpSet {
        let set = build(data, len, list_bus, 1 << 20).unwrap();
        assert_eq!(set.list.len() as u64, list_qwords(data, len, list_bus));
        let mem: HashMap<u64, u64> = set.list.iter().enumerate().map(|(i, &e)| (list_bus + 8 * i as u64, e)).collect();
        let segs = walk(set.prp1, set.prp2, len, |a| mem.get(&a).copied().ok_or(Status::DATA_TRANSFER_ERROR))
            .unwrap_or_else(|s| panic!("walk of {data:#x}+{len} with list at {list_bus:#x}: {s}"));
        assert_eq!(segs, vec![Segment { addr: data, len }], "{data:#x}+{len} list at {list_bus:#x}");
        set
    }

    #[test]
    fn one_and_two_pages_need_no_list() {
        let s = round_trip(0x10000, 4096, 0x90000);
        assert_eq!((s.prp2, s.list.len()), (0, 0));
        // 512 bytes straddling a page boundary: PRP2 is the next page.
        let s = round_trip(0x10F00, 512, 0x90000);
        assert_eq!((s.prp1, s.prp2), (0x10F00, 0x11000));
        let s = round_trip(0x10000, 8192, 0x90000);
        assert_eq!(s.prp2, 0x11000);
        let s = round_trip(0x10000, 8193, 0x90000);
        assert_eq!((s.prp2, s.list.clone()), (0x90000, vec![0x11000, 0x12000]));
    }

    #[test]
    fn lists_chain_across_page_boundaries() {
        // A list starting 16 bytes before a page end has two slots there: one data entry, then the chain pointer.
        let s = round_trip(0x100000, 5 * 4096, 0x90FF0);
        assert_eq!(s.list, vec![0x101000, 0x91000, 0x102000, 0x103000, 0x104000]);
        // A list that exactly fills the rest of its page does not chain.
        let s = round_trip(0x100000, 3 * 4096, 0x90FF0);
        assert_eq!(s.list, vec![0x101000, 0x102000]);
        // Long lists chain several times.
        let s = round_trip(0x200000, 1200 * 4096, 0x90FF8);
        assert_eq!(s.list.len(), 1199 + 3);
    }

    #[test]
    fn every_offset_and_length_round_trips() {
        for data_off in [0u64, 4, 8, 512, 2048, 4092] {
            for len in (1..=40).map(|k| k * 512).chain([4, 100, 4092, 4096, 4100, 131072, 131072 + 512]) {
                for list_off in [0u64, 8, 4088, 4080, 2048] {
                    round_trip(0x4000_0000 + data_off, len, 0x7000_0000 + list_off);
                }
            }
        }
    }

    #[test]
    fn bad_prps_get_the_right_status() {
        let ok = |_| Ok(0x5000);
        assert_eq!(walk(0x1002, 0, 16, ok), Err(Status::PRP_OFFSET_INVALID));
        assert_eq!(walk(0x1000, 0x2004, 8192, ok), Err(Status::PRP_OFFSET_INVALID));
        assert_eq!(walk(0x1000, 0x2004, 3 * 4096, ok), Err(Status::PRP_OFFSET_INVALID));
        assert_eq!(walk(0x1000, 0x2000, 3 * 4096, |_| Ok(0x5008)), Err(Status::PRP_OFFSET_INVALID));
        assert_eq!(
            walk(0x1000, 0x2000, 3 * 4096, |_| Err(Status::DATA_TRANSFER_ERROR)),
            Err(Status::DATA_TRANSFER_ERROR)
        );
        // A chain pointer must name a page.
        let chain = |a| Ok(if a == 0x2FF8 { 0x5008 } else { 0x6000 });
        assert_eq!(walk(0x1000, 0x2FF8, 3 * 4096, chain), Err(Status::PRP_OFFSET_INVALID));
        assert!(build(0x1001, 10, 0, 0).is_err());
        assert!(build(0x1000, 0, 0, 0).is_err());
        assert!(build(0x1000, 5 * 4096, 0x2004, 4096).is_err());
        assert!(build(0x1000, 5 * 4096, 0x2000, 8).is_err());
    }

    #[test]
    fn slot_prps_select_what_build_builds() {
        for data_off in [0u64, 512, 4092] {
            let data = 0x4000_0000 + data_off;
            let max = 32 * 4096;
            let (slot, list) = SlotPrps::new(data, max, 0x7000_0000, 4096).unwrap();
            for len in (1..=256).map(|k| k * 512) {
                let set = build(data, len, 0x7000_0000, 4096).unwrap();
                assert_eq!(slot.select(len), (set.prp1, set.prp2), "len {len} off {data_off}");
                assert!(list.starts_with(&set.list));
            }
        }
        assert!(SlotPrps::new(0x4000_0000, 32 * 4096, 0x7000_0FF0, 4096).is_err());
    }
}
