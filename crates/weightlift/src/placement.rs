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
        let aligned = t.offset.is_multiple_of(element_align(t.dtype));
        if t.nbytes >= SMALL_TENSOR || !aligned {
            out.tensors[i] = (out.blocks.len(), 0);
            out.blocks.push(Block { file: t.file, start: t.offset, len: t.nbytes });
            continue;
        }
        if let Some(b) = open {
            let blk = &mut out.blocks[b];
            let end = blk.start + blk.len;
            // Entries come in file order, so `t.offset >= blk.start`.
            let fits = align.is_none_or(|a| (t.offset - blk.start).is_multiple_of(a));
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
