//! Byte ranges of the namespace → read commands: each range is widened to whole logical blocks and cut into
//! commands of at most the slot size, each knowing which of its bytes land where. Shared by the CPU and GPU loaders.
#![forbid(unsafe_code)]

use crate::error::NvmeError;

/// `len` bytes at namespace byte `offset`, to land at `dest_offset` in the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    /// Where the range starts in the namespace, in bytes.
    pub offset: u64,
    /// The range's length in bytes.
    pub len: u64,
    /// Where it lands in the destination, in bytes.
    pub dest_offset: u64,
}

/// One read command of a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The command's first logical block.
    pub slba: u64,
    /// Blocks it reads.
    pub nlb: u32,
    /// Bytes at the start of the first block that belong to no range.
    pub skip: u32,
    /// Bytes delivered to the destination.
    pub len: u32,
    /// Where those bytes land in the destination.
    pub dest_offset: u64,
}

impl Chunk {
    /// Bytes the command transfers (whole blocks of `lba_size` bytes).
    pub fn bytes(&self, lba_size: u32) -> u64 {
        u64::from(self.nlb) * u64::from(lba_size)
    }
}

/// Plans reads of `ranges` from a namespace of `lbas` blocks of `lba_size` bytes into a `dest_len`-byte
/// destination, with commands of at most `max_bytes`. Destination regions must not overlap (the loaders write them
/// from several queues at once); empty ranges are dropped.
pub fn plan(
    ranges: &[ByteRange],
    lba_size: u32,
    lbas: u64,
    max_bytes: u64,
    dest_len: u64,
) -> Result<Vec<Chunk>, NvmeError> {
    let lba = u64::from(lba_size);
    if lba == 0 || !lba.is_power_of_two() {
        return Err(NvmeError::invalid("block size", format!("{lba_size} is not a power of two")));
    }
    let max_lbas = (max_bytes / lba).min(1 << 16);
    if max_lbas == 0 {
        return Err(NvmeError::invalid("command size", format!("{max_bytes} bytes is less than one {lba}-byte block")));
    }
    let ns_bytes = lbas.saturating_mul(lba);
    let mut dests: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for r in ranges.iter().filter(|r| r.len > 0) {
        let end = r.offset.checked_add(r.len).filter(|&e| e <= ns_bytes);
        if end.is_none() {
            return Err(NvmeError::OutOfRange { what: "namespace", offset: r.offset, len: r.len, limit: ns_bytes });
        }
        if r.dest_offset.checked_add(r.len).is_none_or(|e| e > dest_len) {
            return Err(NvmeError::OutOfRange {
                what: "destination",
                offset: r.dest_offset,
                len: r.len,
                limit: dest_len,
            });
        }
        dests.push((r.dest_offset, r.len));
    }
    dests.sort_unstable();
    if let Some(w) = dests.windows(2).find(|w| w[0].0 + w[0].1 > w[1].0) {
        return Err(NvmeError::invalid(
            "ranges",
            format!("destination bytes {}..{} overlap {}..", w[0].0, w[0].0 + w[0].1, w[1].0),
        ));
    }
    let mut out = Vec::new();
    for r in ranges.iter().filter(|r| r.len > 0) {
        let end = r.offset + r.len;
        let mut lba_at = r.offset / lba;
        let end_lba = end.div_ceil(lba);
        while lba_at < end_lba {
            let nlb = (end_lba - lba_at).min(max_lbas);
            let start_byte = lba_at * lba;
            let from = start_byte.max(r.offset);
            let to = ((lba_at + nlb) * lba).min(end);
            out.push(Chunk {
                slba: lba_at,
                nlb: nlb as u32,
                skip: (from - start_byte) as u32,
                len: (to - from) as u32,
                dest_offset: r.dest_offset + (from - r.offset),
            });
            lba_at += nlb;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_become_block_commands_covering_every_byte() {
        let ranges = [
            ByteRange { offset: 100, len: 5000, dest_offset: 0 },
            ByteRange { offset: 8192, len: 4096 * 40, dest_offset: 5000 },
            ByteRange { offset: 3, len: 0, dest_offset: 0 },
        ];
        let chunks = plan(&ranges, 512, 1 << 20, 64 << 10, 1 << 20).unwrap();
        let mut covered = vec![false; 5000 + 4096 * 40];
        for c in &chunks {
            assert!(c.nlb >= 1 && c.bytes(512) <= 64 << 10);
            assert!(u64::from(c.skip) + u64::from(c.len) <= c.bytes(512));
            for i in 0..c.len as u64 {
                let d = (c.dest_offset + i) as usize;
                assert!(!covered[d]);
                covered[d] = true;
                // The namespace byte this destination byte comes from.
                let src = c.slba * 512 + u64::from(c.skip) + i;
                let r = ranges.iter().find(|r| (r.dest_offset..r.dest_offset + r.len).contains(&(d as u64))).unwrap();
                assert_eq!(src, r.offset + (d as u64 - r.dest_offset));
            }
        }
        assert!(covered.iter().all(|&c| c));
    }

    #[test]
    fn bad_ranges_are_refused() {
        let r = |offset, len, dest_offset| ByteRange { offset, len, dest_offset };
        assert!(matches!(plan(&[r(0, 513, 0)], 512, 1, 4096, 1000), Err(NvmeError::OutOfRange { .. })));
        assert!(matches!(plan(&[r(0, 100, 950)], 512, 8, 4096, 1000), Err(NvmeError::OutOfRange { .. })));
        assert!(plan(&[r(0, 100, 0), r(0, 100, 50)], 512, 8, 4096, 1000).is_err());
        assert!(plan(&[r(u64::MAX, 2, 0)], 512, 8, 4096, 1000).is_err());
        assert!(plan(&[r(0, 1, 0)], 512, 8, 100, 1000).is_err());
        assert!(plan(&[r(0, 1, 0)], 500, 8, 4096, 1000).is_err());
    }
}
