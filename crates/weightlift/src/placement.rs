//! Where tensors go in device memory. Small tensors that sit near each other in a file share a block whose layout
//! mirrors the file (tensor at file offset `o` lands at `block + o - block_start`), so one read's bytes reach the
//! device in one copy instead of one per tensor: a checkpoint of 20,000 small tensors costs a few hundred copies
//! and allocations, not 20,000 of each. Large tensors, and tensors whose file offset would misalign them, get blocks
//! of their own.

use weightlift_format::{DType, TensorEntry};

/// Tensors smaller than this are packed into shared blocks.
pub const SMALL_TENSOR: u64 = 1 << 20;
/// Largest shared block.
pub const BLOCK_MAX: u64 = 64 << 20;
/// Bytes between neighbouring tensors that a shared block may carry along (and copy).
pub const GAP_MAX: u64 = 64 << 10;
/// Alignment of block starts relative to the file, so that in-block addresses keep the file's alignment mod 256.
const BLOCK_ALIGN: u64 = 256;
/// The alignment every device allocation has at least (`cuMemAllocAsync`): the largest `pack_aligned` can keep.
pub const DEVICE_ALIGN: u64 = 256;

/// A range of one file that lands, as is, in one device allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub file: usize,
    pub start: u64,
    pub len: u64,
}

/// Blocks, and for each tensor (in the order given) its block and offset inside it.
#[derive(Clone, Debug, Default)]
pub struct Placement {
    pub blocks: Vec<Block>,
    pub tensors: Vec<(usize, u64)>,
}

fn element_align(dtype: DType) -> u64 {
    dtype.element_bytes().unwrap_or(1).clamp(1, 8)
}

/// Places `entries` (any order) into blocks.
pub fn pack(entries: &[&TensorEntry]) -> Placement {
    pack_aligned(entries, None)
}

/// Places `entries` (any order) into blocks so that, with `align`, every tensor sits at a multiple of `align` from
/// its block's start (blocks are allocated at least that aligned): a shared block starts at its first tensor, and a
/// small tensor joins it only at an aligned offset. Without `align`, blocks mirror the file's alignment mod 256.
pub fn pack_aligned(entries: &[&TensorEntry], align: Option<u64>) -> Placement {
    let align = align.filter(|&a| a > 1);
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|&i| (entries[i].file, entries[i].offset, entries[i].nbytes));
    let mut out = Placement { blocks: Vec::new(), tensors: vec![(0, 0); entries.len()] };
    // The shared block being filled: its index in `out.blocks`.
    let mut open: Option<usize> = None;
    for i in order {
        let t = entries[i];
        let aligned = t.offset % element_align(t.dtype) == 0;
        if t.nbytes >= SMALL_TENSOR || !aligned {
            out.tensors[i] = (out.blocks.len(), 0);
            out.blocks.push(Block { file: t.file, start: t.offset, len: t.nbytes });
            continue;
        }
        if let Some(b) = open {
            let blk = &mut out.blocks[b];
            let end = blk.start + blk.len;
            // Entries come in file order, so `t.offset >= blk.start`.
            let fits = align.is_none_or(|a| (t.offset - blk.start) % a == 0);
            if blk.file == t.file && t.offset <= end + GAP_MAX && t.end() - blk.start <= BLOCK_MAX && fits {
                blk.len = blk.len.max(t.end() - blk.start);
                out.tensors[i] = (b, t.offset - blk.start);
                continue;
            }
        }
        let start = if align.is_some() { t.offset } else { t.offset / BLOCK_ALIGN * BLOCK_ALIGN };
        open = Some(out.blocks.len());
        out.tensors[i] = (out.blocks.len(), t.offset - start);
        out.blocks.push(Block { file: t.file, start, len: t.end() - start });
    }
    out
}

impl Placement {
    /// Puts the smallest blocks first, ascending, until they hold twice the largest block (at most a quarter of all
    /// bytes), and the rest after them in their order; tensors follow their blocks. Returns how many blocks and bytes
    /// now come first.
    ///
    /// A GPU load allocates its blocks in this order while the reads run, and reads in it: a copy waits for its
    /// block. Fresh device memory is mapped at about 1.6× the rate copies fill it (4.49 GB in 49–65 ms beside a
    /// 90 ms load on an H200, bench/results/2026-11-27-h200-l), so a load that starts on a large block (the 262 MB
    /// `lm_head.weight` opens every llama file `save_file` writes, its names being sorted) keeps the copy engine idle
    /// for that block's mapping (3 ms); one that starts on small blocks copies at once, and its allocation gains a
    /// lead that grows with the bytes copied (twice the largest block is more than the 1.6× that lead needs before
    /// the largest is reached).
    pub fn order_small_first(&mut self) -> (usize, u64) {
        let n = self.blocks.len();
        let total: u64 = self.blocks.iter().map(|b| b.len).sum();
        let largest = self.blocks.iter().map(|b| b.len).max().unwrap_or(0);
        let want = largest.saturating_mul(2).min(total / 4);
        let mut by_size: Vec<usize> = (0..n).collect();
        by_size.sort_by_key(|&b| (self.blocks[b].len, b));
        let (mut first, mut bytes) = (Vec::new(), 0u64);
        for b in by_size {
            if bytes >= want {
                break;
            }
            first.push(b);
            bytes += self.blocks[b].len;
        }
        let mut early = vec![false; n];
        first.iter().for_each(|&b| early[b] = true);
        let order: Vec<usize> = first.iter().copied().chain((0..n).filter(|&b| !early[b])).collect();
        let mut new_index = vec![0; n];
        for (new, &old) in order.iter().enumerate() {
            new_index[old] = new;
        }
        self.blocks = order.iter().map(|&old| self.blocks[old]).collect();
        for t in &mut self.tensors {
            t.0 = new_index[t.0];
        }
        (first.len(), bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(file: usize, offset: u64, nbytes: u64, dtype: DType) -> TensorEntry {
        TensorEntry { name: format!("t{offset}"), dtype, shape: vec![nbytes], file, offset, nbytes }
    }

    #[test]
    fn packs_neighbours_and_mirrors_offsets() {
        let e = [
            t(0, 1000, 100, DType::U8),
            t(0, 1100, 64, DType::F32),
            t(0, 1164, 2 << 20, DType::U8),
            t(0, (2 << 20) + 1164, 8, DType::F32),
            t(1, 8, 10, DType::U8),
            t(0, 1165 + (2 << 20) + 8, 4, DType::F32),
        ];
        let refs: Vec<&TensorEntry> = e.iter().collect();
        let p = pack(&refs);
        // The first two share a block starting at 768 (1000 rounded down to 256).
        assert_eq!(p.tensors[0].0, p.tensors[1].0);
        assert_eq!(p.blocks[p.tensors[0].0].start, 768);
        assert_eq!(p.tensors[1].1, 1100 - 768);
        // The big one has its own block.
        assert_eq!(p.blocks[p.tensors[2].0], Block { file: 0, start: 1164, len: 2 << 20 });
        // A misaligned F32 gets its own block; a tensor of another file does not join file 0's block.
        assert_eq!(p.blocks[p.tensors[5].0].start, 1165 + (2 << 20) + 8);
        assert_ne!(p.tensors[4].0, p.tensors[3].0);
        // Every tensor lies inside its block at its file position.
        for (i, entry) in e.iter().enumerate() {
            let (b, off) = p.tensors[i];
            let blk = p.blocks[b];
            assert_eq!(blk.file, entry.file);
            assert_eq!(blk.start + off, entry.offset);
            assert!(off + entry.nbytes <= blk.len);
        }
    }

    #[test]
    fn small_first_leads_with_the_smallest_blocks_and_keeps_every_tensor() {
        // A llama-like file as save_file lays it: two 64 MiB tensors first, then layers of 1-24 MiB tensors with a
        // small norm between them.
        let mut e = vec![t(0, 0, 64 << 20, DType::BF16), t(0, 64 << 20, 64 << 20, DType::BF16)];
        let mut at = 128u64 << 20;
        for _ in 0..8 {
            for len in [8 << 10, 24 << 20, 24 << 20, 2 << 20, 8 << 20] {
                e.push(t(0, at, len, DType::BF16));
                at += len;
            }
        }
        let refs: Vec<&TensorEntry> = e.iter().collect();
        let before = pack(&refs);
        let mut p = before.clone();
        let (n, bytes) = p.order_small_first();
        let total: u64 = p.blocks.iter().map(|b| b.len).sum();
        // Twice the largest block (128 MiB) is under a quarter of the load, so the small ones reach it.
        assert!(bytes >= 128 << 20 && bytes <= total / 4 + (24 << 20), "{n} blocks, {bytes} bytes");
        let lens: Vec<u64> = p.blocks[..n].iter().map(|b| b.len).collect();
        assert!(lens.windows(2).all(|w| w[0] <= w[1]), "{lens:?}");
        assert!(lens.iter().all(|&l| l < 64 << 20));
        // The rest keep file order, and each tensor still lands at its file position in its block.
        let rest: Vec<u64> = p.blocks[n..].iter().map(|b| b.start).collect();
        assert!(rest.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(p.blocks[n].start, 0, "the first large block follows the small ones");
        let mut sorted = p.blocks.clone();
        sorted.sort_by_key(|b| b.start);
        assert_eq!(sorted, before.blocks);
        for (i, entry) in e.iter().enumerate() {
            let (b, off) = p.tensors[i];
            assert_eq!(p.blocks[b].start + off, entry.offset);
            assert!(off + entry.nbytes <= p.blocks[b].len);
        }
    }

    #[test]
    fn small_first_of_one_block_or_none_changes_nothing() {
        let mut none = Placement::default();
        assert_eq!(none.order_small_first(), (0, 0));
        let e = [t(0, 0, 4 << 20, DType::U8)];
        let refs: Vec<&TensorEntry> = e.iter().collect();
        let mut one = pack(&refs);
        assert_eq!(one.order_small_first(), (1, 4 << 20));
        assert_eq!(one.tensors, vec![(0, 0)]);
    }

    #[test]
    fn aligned_packing_starts_every_tensor_at_a_multiple() {
        // An upstream layout: the data section starts 8-aligned, tensor sizes are multiples of 256 except one.
        let base = 8 + 1000;
        let e = [
            t(0, base, 1536, DType::F32),
            t(0, base + 1536, 1536, DType::F32),
            t(0, base + 3072, 100, DType::U8),
            t(0, base + 3172, 512, DType::F32),
            t(0, base + 3684, 2 << 20, DType::F32),
            t(0, base + 3684 + (2 << 20), 256, DType::F32),
        ];
        let refs: Vec<&TensorEntry> = e.iter().collect();
        let p = pack_aligned(&refs, Some(256));
        for (i, entry) in e.iter().enumerate() {
            let (b, off) = p.tensors[i];
            let blk = p.blocks[b];
            assert_eq!(off % 256, 0, "tensor {i} at {off} in its block");
            assert_eq!(blk.start + off, entry.offset);
            assert!(off + entry.nbytes <= blk.len);
        }
        // The first three share a block that starts at the first; the one after the odd-sized tensor starts anew.
        assert_eq!(p.tensors[0], (0, 0));
        assert_eq!(p.tensors[1], (0, 1536));
        assert_eq!(p.tensors[2], (0, 3072));
        assert_eq!(p.blocks[0].start, base);
        assert_eq!(p.tensors[3], (1, 0));
        assert_eq!(p.blocks.len(), 4);
        // Without alignment the same file takes three blocks (the small ones share one), at the file's offsets
        // mod 256.
        let plain = pack(&refs);
        assert_eq!(plain.blocks.len(), 3);
        assert_eq!(plain.tensors[0].1 % 256, base % 256);
    }
}
