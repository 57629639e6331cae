//! Read plans: which reads to issue so that every requested byte range lands in its destination.
//!
//! Requested ranges (extents) are split at absolute multiples of the chunk size, neighbours are coalesced into reads
//! of at most one chunk, and each read is either kept exact (buffered) or widened to the file's block size
//! (O_DIRECT; the unaligned head and tail are read and dropped). Every read maps back to the destination ranges it
//! feeds (pieces). Planning is plain data: nothing here touches a file.

use std::ops::Range;

/// A byte range of an input file and where it must land.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// The input's index in the load.
    pub file: u32,
    /// Where the range starts in the file, in bytes.
    pub offset: u64,
    /// The range's length in bytes.
    pub len: u64,
    /// Destination id (a tensor).
    pub dest: u32,
    /// Offset inside the destination.
    pub dest_offset: u64,
}

/// Part of a read's buffer that goes to a destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Offset inside the read's buffer.
    pub at: u64,
    /// Bytes of the piece.
    pub len: u64,
    /// Destination id.
    pub dest: u32,
    /// Offset inside the destination.
    pub dest_offset: u64,
}

/// One read to issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadOp {
    /// The input's index in the load.
    pub file: u32,
    /// File offset of the read (block-aligned when `direct`).
    pub offset: u64,
    /// Bytes to ask for (block-aligned when `direct`; may reach past the end of the file).
    pub len: u64,
    /// Bytes the file actually holds from `offset` within `len`: the read is complete once this many arrived.
    pub valid: u64,
    /// Read through the O_DIRECT descriptor (else the buffered one).
    pub direct: bool,
    /// A buffered read of cold pages ([`ReadKind::ColdBuffered`]; never `direct`): the page cache keeps what it reads.
    pub cold: bool,
    /// Indexes into [`Plan::pieces`].
    pub pieces: Range<usize>,
}

/// What the planner needs to know of an input file.
#[derive(Clone, Copy, Debug)]
pub struct PlanFile {
    /// The file's length in bytes.
    pub len: u64,
    /// O_DIRECT alignment.
    pub block: u64,
    /// Whether O_DIRECT reads are possible on this file.
    pub direct: bool,
}

/// How a region of a file is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadKind {
    /// Buffered, in chunks (the pages are cached: a memory copy).
    Cached,
    /// O_DIRECT, in large block-aligned requests.
    Direct,
    /// Buffered, in large requests (cold pages read through the page cache, which keeps them).
    ColdBuffered,
    /// An object's bytes: reads of [`PlanOptions::object_piece`], several consecutive ones served by one ranged GET
    /// (a [`Plan::groups`] entry).
    Object,
}

/// How [`plan`] cuts and joins reads.
#[derive(Clone, Copy, Debug)]
pub struct PlanOptions {
    /// Largest buffered read of cached pages.
    pub chunk: u64,
    /// Largest read of cold pages (O_DIRECT before widening to block alignment, or buffered): cold storage prefers
    /// larger requests.
    pub direct_chunk: u64,
    /// Neighbouring extents closer than this are read together (the bytes between are read and dropped).
    pub coalesce_gap: u64,
    /// Never put two destinations in one read (a streaming load decides per destination what to read).
    pub separate_destinations: bool,
    /// Largest read of an object ([`ReadKind::Object`]): the staging a GET in flight holds at a time.
    pub object_piece: u64,
    /// Largest span of an object one GET covers (its reads, and gaps between them of at most `object_piece`).
    pub object_get: u64,
    /// GETs the load keeps in flight from its start (0: GETs span `object_get` whatever the load's size). Where the
    /// object bytes make less than two rounds of GETs that long, GETs are cut shorter (down to [`SPREAD_GET_FLOOR`])
    /// so that each round fills every GET it has: see [`get_span`].
    pub object_gets_in_flight: usize,
}

/// The shortest GET [`get_span`] cuts to spread a load: AWS's guidance for S3 is ranges of 8-16 MB, each GET's
/// rate being capped (85-90 MB/s) and its first byte late (20-80 ms).
pub const SPREAD_GET_FLOOR: u64 = 8 << 20;

/// The reads of one load.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// The reads, in the order they are handed to the lanes (file by file, by offset).
    pub ops: Vec<ReadOp>,
    /// Every read's pieces, each read's contiguous (see [`ReadOp::pieces`]).
    pub pieces: Vec<Piece>,
    /// Buffer size that holds any op of this plan (a multiple of 4 KiB).
    pub slot_bytes: u64,
    /// Sum of the extents' lengths (the bytes the caller asked for).
    pub requested_bytes: u64,
    /// Runs of consecutive ops of one object served by one GET each (ranges of indexes into `ops`, ascending);
    /// every op of an object is in exactly one, no op of a local file in any.
    pub groups: Vec<Range<usize>>,
}

impl Plan {
    /// The pieces `op` feeds.
    pub fn pieces_of(&self, op: &ReadOp) -> &[Piece] {
        &self.pieces[op.pieces.clone()]
    }

    /// Bytes the reads will transfer (alignment and coalesced gaps included).
    pub fn read_bytes(&self) -> u64 {
        self.ops.iter().map(|o| o.valid).sum()
    }
}

/// Why a plan could not be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// An extent lies past the end of its file.
    PastEnd {
        /// The input's index in the load.
        file: u32,
        /// Where the extent starts.
        offset: u64,
        /// The extent's length in bytes.
        len: u64,
        /// The file's length in bytes.
        file_len: u64,
    },
    /// An extent names a missing destination, overflows it, or overlaps another extent's destination range.
    Destination(String),
}

/// Plans the reads for `extents`. `kind(file, offset, len)` says how each region of `direct_chunk` bytes is read;
/// `Direct` is honoured only on files that allow O_DIRECT (buffered in large requests elsewhere).
pub fn plan(
    files: &[PlanFile],
    extents: &[Extent],
    dest_lens: &[u64],
    opts: &PlanOptions,
    kind: &mut dyn FnMut(u32, u64, u64) -> ReadKind,
) -> Result<Plan, PlanError> {
    check_destinations(files, extents, dest_lens)?;
    let chunk = opts.chunk.max(1);
    let direct_chunk = opts.direct_chunk.max(chunk);
    // Split at absolute multiples of the chunk size that applies where the piece lies: reads of one O_DIRECT
    // region never mix with buffered ones.
    let mut subs: Vec<(Extent, ReadKind)> = Vec::with_capacity(extents.len());
    for e in extents.iter().filter(|e| e.len > 0) {
        let f = files[e.file as usize];
        let end = e.offset + e.len;
        let mut pos = e.offset;
        while pos < end {
            let region = pos / direct_chunk * direct_chunk;
            let k = match kind(e.file, region, direct_chunk.min(f.len - region)) {
                ReadKind::Direct if !f.direct => ReadKind::ColdBuffered,
                k => k,
            };
            let c = match k {
                ReadKind::Cached => chunk,
                ReadKind::Object => opts.object_piece.max(1),
                _ => direct_chunk,
            };
            let next = end.min((pos / c + 1) * c);
            subs.push((
                Extent { offset: pos, len: next - pos, dest_offset: e.dest_offset + (pos - e.offset), ..*e },
                k,
            ));
            pos = next;
        }
    }
    subs.sort_by_key(|(s, _)| (s.file, s.offset, s.dest, s.dest_offset));

    let mut out = Plan { requested_bytes: extents.iter().map(|e| e.len).sum(), ..Plan::default() };
    // Whether each op reads an object.
    let mut objects = Vec::new();
    let mut i = 0;
    while i < subs.len() {
        let (first, k) = subs[i];
        let direct = k == ReadKind::Direct;
        let limit = match k {
            ReadKind::Cached => chunk,
            ReadKind::Object => opts.object_piece.max(1),
            _ => direct_chunk,
        };
        let (file, start) = (first.file, first.offset);
        let mut end = first.offset + first.len;
        let mut j = i + 1;
        while j < subs.len() {
            let (s, d) = subs[j];
            let s_end = s.offset + s.len;
            if s.file != file
                || d != k
                || (opts.separate_destinations && s.dest != first.dest)
                || s.offset > end.saturating_add(opts.coalesce_gap)
                || s_end.max(end) - start > limit
            {
                break;
            }
            end = end.max(s_end);
            j += 1;
        }
        let f = files[file as usize];
        let (offset, len, valid) = if direct {
            let a = start / f.block * f.block;
            let b = end.div_ceil(f.block) * f.block;
            (a, b - a, f.len.min(b) - a)
        } else {
            (start, end - start, end - start)
        };
        let first_piece = out.pieces.len();
        for (s, _) in &subs[i..j] {
            out.pieces.push(Piece { at: s.offset - offset, len: s.len, dest: s.dest, dest_offset: s.dest_offset });
        }
        out.slot_bytes = out.slot_bytes.max(len);
        let cold = k == ReadKind::ColdBuffered;
        objects.push(k == ReadKind::Object);
        out.ops.push(ReadOp { file, offset, len, valid, direct, cold, pieces: first_piece..out.pieces.len() });
        i = j;
    }
    out.slot_bytes = out.slot_bytes.next_multiple_of(4096);
    out.groups = group_objects(&out.ops, &objects, opts);
    Ok(out)
}

/// The GETs of a plan's object reads: runs of consecutive ops of one object, each op starting at most
/// `object_piece` bytes after the last one ended (the bytes between are fetched and dropped: on a bucket one more
/// round trip costs more than that), spanning at most `object_get` bytes.
fn group_objects(ops: &[ReadOp], objects: &[bool], opts: &PlanOptions) -> Vec<Range<usize>> {
    let span = get_span(ops, objects, opts);
    let mut groups = Vec::new();
    let mut i = 0;
    while i < ops.len() {
        if !objects.get(i).copied().unwrap_or(false) {
            i += 1;
            continue;
        }
        let (file, start) = (ops[i].file, ops[i].offset);
        let mut end = ops[i].offset + ops[i].len;
        let mut j = i + 1;
        while j < ops.len()
            && objects.get(j).copied().unwrap_or(false)
            && ops[j].file == file
            && ops[j].offset >= end
            && ops[j].offset - end <= opts.object_piece
            && ops[j].offset + ops[j].len - start <= span
        {
            end = ops[j].offset + ops[j].len;
            j += 1;
        }
        groups.push(i..j);
        i = j;
    }
    groups
}

/// The span of an object's GETs in a load: `object_get`, or shorter where the load's object bytes at that span
/// would end in a round of GETs that leaves most of the `object_gets_in_flight` idle.
///
/// Each GET of a cloud bucket is capped (85-90 MB/s), so a round of GETs takes as long as its longest GET whatever
/// the count: 185 GETs of 16 MiB with 128 in flight (a 3.0 GB pack on the H100 of 2026-12-07) ran a full round,
/// then one of 57 GETs as long. A load of less than two rounds is spread: to as many GETs as fly (less than one
/// round) or twice that, with no GET shorter than [`SPREAD_GET_FLOOR`] nor longer than `object_get`; spans are
/// whole `object_piece`s. The pack then took 0.45 s, not 0.52 (bench/results/2026-12-07-h100-remote-d, -e).
/// Longer loads keep `object_get`: the pacer raises the count as they run, and cut shorter (a 4.2 GiB file into
/// 373 or 505 GETs instead of 268) they were 7-10 % slower against curl on the same hosts, each GET paying its
/// first byte for fewer bytes.
fn get_span(ops: &[ReadOp], objects: &[bool], opts: &PlanOptions) -> u64 {
    let piece = opts.object_piece.max(1);
    let limit = opts.object_get.max(piece);
    let in_flight = opts.object_gets_in_flight as u64;
    let total: u64 = ops.iter().zip(objects).filter(|(_, o)| **o).map(|(op, _)| op.len).sum();
    if in_flight == 0 || total == 0 {
        return limit;
    }
    let floor = SPREAD_GET_FLOOR.min(limit).max(piece);
    let gets = total.div_ceil(limit);
    if gets >= 2 * in_flight {
        return limit;
    }
    let want = if gets <= in_flight { in_flight } else { 2 * in_flight };
    let most = (total / floor).max(gets);
    let count = want.min(most).max(gets);
    total.div_ceil(count).next_multiple_of(piece).clamp(floor, limit)
}

fn check_destinations(files: &[PlanFile], extents: &[Extent], dest_lens: &[u64]) -> Result<(), PlanError> {
    for e in extents {
        let f =
            files.get(e.file as usize).ok_or_else(|| PlanError::Destination(format!("no input file {}", e.file)))?;
        if e.offset.checked_add(e.len).is_none_or(|end| end > f.len) {
            return Err(PlanError::PastEnd { file: e.file, offset: e.offset, len: e.len, file_len: f.len });
        }
        let cap = dest_lens
            .get(e.dest as usize)
            .ok_or_else(|| PlanError::Destination(format!("no destination {}", e.dest)))?;
        if e.dest_offset.checked_add(e.len).is_none_or(|end| end > *cap) {
            return Err(PlanError::Destination(format!(
                "{} bytes at offset {} overflow destination {} of {} bytes",
                e.len, e.dest_offset, e.dest, cap
            )));
        }
    }
    let mut by_dest: Vec<&Extent> = extents.iter().filter(|e| e.len > 0).collect();
    by_dest.sort_by_key(|e| (e.dest, e.dest_offset));
    for w in by_dest.windows(2) {
        if w[0].dest == w[1].dest && w[0].dest_offset + w[0].len > w[1].dest_offset {
            return Err(PlanError::Destination(format!(
                "two extents write destination {} at offset {}",
                w[1].dest, w[1].dest_offset
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn opts(chunk: u64) -> PlanOptions {
        PlanOptions {
            chunk,
            direct_chunk: chunk,
            coalesce_gap: 64,
            separate_destinations: false,
            object_piece: chunk,
            object_get: chunk * 4,
            object_gets_in_flight: 0,
        }
    }

    #[test]
    fn coalesces_neighbours_and_splits_huge_extents() {
        let files = [PlanFile { len: 100_000, block: 4096, direct: false }];
        let ex = [
            Extent { file: 0, offset: 10, len: 100, dest: 0, dest_offset: 0 },
            Extent { file: 0, offset: 110, len: 50, dest: 1, dest_offset: 0 },
            Extent { file: 0, offset: 200, len: 30_000, dest: 2, dest_offset: 0 },
        ];
        let p = plan(&files, &ex, &[100, 50, 30_000], &opts(16_384), &mut |_, _, _| ReadKind::Cached).unwrap();
        // [10,16384) holds the first two and the head of the third; the rest splits at 16384 and 32768.
        assert_eq!(p.ops.len(), 2);
        assert_eq!((p.ops[0].offset, p.ops[0].len), (10, 16_374));
        assert_eq!(p.pieces_of(&p.ops[0]).len(), 3);
        assert_eq!((p.ops[1].offset, p.ops[1].len), (16_384, 30_200 - 16_384));
        assert_eq!(p.requested_bytes, 30_150);
    }

    #[test]
    fn direct_reads_are_widened_to_blocks_and_clamped_to_the_file() {
        let files = [PlanFile { len: 10_000, block: 4096, direct: true }];
        let ex = [Extent { file: 0, offset: 5000, len: 4999, dest: 0, dest_offset: 0 }];
        let p = plan(&files, &ex, &[4999], &opts(1 << 20), &mut |_, _, _| ReadKind::Direct).unwrap();
        let op = &p.ops[0];
        assert!(op.direct);
        assert_eq!((op.offset, op.len, op.valid), (4096, 8192, 10_000 - 4096));
        assert_eq!(p.pieces_of(op)[0].at, 904);
    }

    #[test]
    fn rejects_bad_extents() {
        let files = [PlanFile { len: 100, block: 512, direct: false }];
        let past = [Extent { file: 0, offset: 90, len: 20, dest: 0, dest_offset: 0 }];
        assert!(matches!(
            plan(&files, &past, &[20], &opts(4096), &mut |_, _, _| ReadKind::Cached),
            Err(PlanError::PastEnd { .. })
        ));
        let overflow = [Extent { file: 0, offset: 0, len: 20, dest: 0, dest_offset: 5 }];
        assert!(matches!(
            plan(&files, &overflow, &[20], &opts(4096), &mut |_, _, _| ReadKind::Cached),
            Err(PlanError::Destination(_))
        ));
        let overlap = [
            Extent { file: 0, offset: 0, len: 10, dest: 0, dest_offset: 0 },
            Extent { file: 0, offset: 20, len: 10, dest: 0, dest_offset: 5 },
        ];
        assert!(matches!(
            plan(&files, &overlap, &[20], &opts(4096), &mut |_, _, _| ReadKind::Cached),
            Err(PlanError::Destination(_))
        ));
    }

    /// GETs of one object of `mib` MiB read whole, 512 KiB parts, 16 MiB GETs, `in_flight` of them at once.
    fn gets_of(mib: u64, in_flight: usize) -> Vec<u64> {
        let len = mib << 20;
        let files = [PlanFile { len, block: 4096, direct: false }];
        let extents = [Extent { file: 0, offset: 0, len, dest: 0, dest_offset: 0 }];
        let o = PlanOptions {
            chunk: 4 << 20,
            direct_chunk: 16 << 20,
            coalesce_gap: 64 << 10,
            separate_destinations: false,
            object_piece: 512 << 10,
            object_get: 16 << 20,
            object_gets_in_flight: in_flight,
        };
        let p = plan(&files, &extents, &[len], &o, &mut |_, _, _| ReadKind::Object).unwrap();
        p.groups.iter().map(|g| p.ops[g.clone()].iter().map(|op| op.len).sum()).collect()
    }

    #[test]
    fn gets_are_spread_so_that_each_round_fills_the_gets_in_flight() {
        // 2960 MiB at 16 MiB: 185 GETs, a round of 128 and one of 57. Spread: 247 GETs of 12 MiB, rounds of 128
        // and 119.
        assert_eq!(gets_of(2960, 0).len(), 185);
        let spread = gets_of(2960, 128);
        assert_eq!(spread.len(), 247, "{spread:?}");
        assert!(spread[..246].iter().all(|&g| g == 12 << 20) && spread.iter().sum::<u64>() == 2960 << 20);
        // Less than a round: as many GETs as may fly, none shorter than 8 MiB.
        assert_eq!(gets_of(64, 256), vec![8 << 20; 8]);
        assert_eq!(gets_of(4096, 256), vec![16 << 20; 256], "a whole round at the longest span is kept");
        // Two rounds or more keep the longest span: the pacer raises the count as they run.
        assert_eq!(gets_of(10_000, 256).len(), 625);
        assert_eq!(gets_of(4288, 128).len(), 268);
    }

    proptest! {
        #[test]
        fn every_requested_byte_is_delivered_once(
            lens in prop::collection::vec(0u64..20_000, 1..30),
            gaps in prop::collection::vec(0u64..3000, 30),
            chunk_kib in 1u64..16,
            direct_factor in 1u64..4,
            direct_every in 0u32..3,
            block_shift in 9u32..13,
            spread in 0usize..5,
        ) {
            let mut extents = Vec::new();
            let mut pos = 0u64;
            for (i, &len) in lens.iter().enumerate() {
                pos += gaps[i];
                extents.push(Extent { file: (i % 2) as u32, offset: pos, len, dest: i as u32, dest_offset: 0 });
                pos += len;
            }
            let block = 1u64 << block_shift;
            let files = [PlanFile { len: pos + 7, block, direct: true }, PlanFile { len: pos + 7, block, direct: false }];
            let chunk = chunk_kib * 4096;
            let mut n = 0u32;
            let o = PlanOptions {
                chunk,
                direct_chunk: chunk * direct_factor,
                coalesce_gap: 64,
                separate_destinations: direct_every == 2,
                object_piece: chunk / 2,
                object_get: chunk * 3,
                object_gets_in_flight: spread,
            };
            let p = plan(&files, &extents, &lens, &o, &mut |file, _, _| {
                n += 1;
                match (direct_every, n % 3) {
                    // The second file stands for an object where the reads are mixed.
                    (1, _) if file == 1 => ReadKind::Object,
                    (0, _) => ReadKind::Cached,
                    (_, 0) => ReadKind::ColdBuffered,
                    _ if n.is_multiple_of(direct_every) => ReadKind::Direct,
                    _ => ReadKind::Cached,
                }
            }).unwrap();
            let mut covered: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l as usize]).collect();
            let mut last = (0u32, 0u64);
            for op in &p.ops {
                prop_assert!(op.len <= p.slot_bytes);
                prop_assert!(op.valid <= op.len);
                // In file order by the first byte each op delivers (an O_DIRECT op's start is widened down to a
                // block boundary, which may lie before the previous op's start).
                let first = op.offset + p.pieces[op.pieces.start].at;
                prop_assert!((op.file, first) >= last, "ops out of file order");
                last = (op.file, first);
                if op.direct {
                    prop_assert_eq!(op.offset % block, 0);
                    prop_assert_eq!(op.len % block, 0);
                    prop_assert!(op.len <= chunk * direct_factor + 2 * block);
                } else {
                    prop_assert!(op.len <= chunk * direct_factor);
                }
                for piece in p.pieces_of(op) {
                    prop_assert!(piece.at + piece.len <= op.valid);
                    let e = extents[piece.dest as usize];
                    // The piece's bytes come from the right file offset.
                    prop_assert_eq!(op.offset + piece.at, e.offset + piece.dest_offset);
                    prop_assert_eq!(op.file, e.file);
                    for b in &mut covered[piece.dest as usize][piece.dest_offset as usize..(piece.dest_offset + piece.len) as usize] {
                        *b += 1;
                    }
                }
            }
            for c in covered {
                prop_assert!(c.iter().all(|&x| x == 1));
            }
            // Object reads (the second file's, where `direct_every` is 1) are each in one GET, in order; a GET
            // spans one object, at most `object_get` bytes, with gaps of at most `object_piece`.
            let mut in_group = vec![false; p.ops.len()];
            let mut next = 0;
            for g in &p.groups {
                prop_assert!(g.start >= next && g.start < g.end);
                next = g.end;
                let ops = &p.ops[g.clone()];
                prop_assert!(ops.iter().all(|o| o.file == ops[0].file));
                prop_assert!(ops.last().unwrap().offset + ops.last().unwrap().len - ops[0].offset <= o.object_get);
                for w in ops.windows(2) {
                    prop_assert!(w[1].offset >= w[0].offset + w[0].len);
                    prop_assert!(w[1].offset - (w[0].offset + w[0].len) <= o.object_piece);
                }
                for i in g.clone() {
                    in_group[i] = true;
                }
            }
            for (op, grouped) in p.ops.iter().zip(in_group) {
                prop_assert_eq!(grouped, direct_every == 1 && op.file == 1);
                if grouped {
                    prop_assert!(op.len <= o.object_piece);
                }
            }
        }
    }
}
