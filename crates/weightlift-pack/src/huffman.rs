//! weightlift's Huffman stream: canonical Huffman codes over byte symbols, cut into independent segments so that a
//! GPU decodes a plane with one thread per segment and no library.
//!
//! Why a codec of our own: the exponent plane of bf16 weights is nearly all entropy (few distinct bytes, skewed
//! counts, almost no repeats), which Huffman coding captures; zstd gets its ratio on these planes from its Huffman
//! literals, but nvCOMP's zstd decoder ran at 51 GB/s on them on the H100 (`bench/results/2026-11-23-h100 at b3a4ec8/
//! unpack-gpu.json`), under the PCIe link, so a packed load could not beat the link. nvCOMP's ANS decoded the same
//! planes at 1,034 GB/s, but its stream format is undocumented, has no CPU decoder and changed between nvCOMP
//! releases: a pack must unpack byte for byte on a machine with no GPU, years later. The `huffman` codec in the
//! usual crates (zstd's Huff0, deflate) is not cut into segments a GPU can decode independently.
//!
//! ```text
//! 0  u8 L: the longest code, 1..=11 bits; 0: every byte of the plane is the one symbol at offset 2
//! 1  u8 S: log2 of the segment length, 6..=16 (the plane is cut into segments of 2^S bytes, the last shorter)
//! L = 0:  2  u8 symbol,  3  u8 written as 0, ignored  (4 bytes in all)
//! L > 0:  2  u16 LE count[1..=L]: codes of each length (a code set that over-fills its lengths is refused)
//!            u8 symbol[sum of counts]: the symbols in canonical order (by code length, then as listed)
//!            bytes written as 0 (ignored) up to a multiple of 4
//!            u32 LE end[n]: for each of the n segments, where its bits end, in bytes from the start of the bits
//!                           (a multiple of 4, not decreasing; the last is the length of the bits)
//!            the bits: segment i in bytes [end[i-1], end[i]) (end[-1] = 0)
//! ```
//!
//! A segment's codes are packed least significant bit first into little-endian 32-bit words, each code from its
//! most significant bit (as deflate packs its Huffman codes), and decode to exactly its 2^S bytes (fewer for the
//! last). Canonical codes: the first code of length 1 is 0; the first code of length l + 1 is `(first code of length
//! l + count[l]) << 1`; codes of one length follow each other. A decoder refuses a code that no symbol has and a
//! segment that needs more bits than it holds; the chunk's xxh3 catches the rest.

/// Longest code: a 2,048-entry table decodes on the CPU, and 11 one-bit steps at most on the GPU.
pub const MAX_LEN: usize = 11;
/// Segment length written: 1 KiB of plane per GPU thread (64 segments for a 64 KiB plane).
pub const SEG_SHIFT: u8 = 10;
const MIN_SEG_SHIFT: u8 = 6;
const MAX_SEG_SHIFT: u8 = 16;

/// Code lengths (0: symbol absent) of a Huffman code for `freq`, no code longer than [`MAX_LEN`]. Standard
/// Huffman on the counts; where a code comes out longer, the counts are halved (kept above zero) and the code built
/// again, which flattens the tree until it fits (with every count at 1 the longest code of 256 symbols is 8 bits).
/// Ties are broken by symbol, so a plane always gets the same code.
fn code_lengths(freq: &[u64; 256]) -> [u8; 256] {
    let mut f = *freq;
    loop {
        let lens = huffman_lengths(&f);
        if lens.iter().all(|&l| usize::from(l) <= MAX_LEN) {
            return lens;
        }
        for x in f.iter_mut().filter(|x| **x > 0) {
            *x = (*x / 2).max(1);
        }
    }
}

fn huffman_lengths(freq: &[u64; 256]) -> [u8; 256] {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut lens = [0u8; 256];
    let mut heap = BinaryHeap::new();
    // Nodes 0..256 are the symbols; merged nodes follow. parent[n] is the node n was merged into.
    let mut parent: Vec<usize> = vec![usize::MAX; 256];
    for (s, &c) in freq.iter().enumerate() {
        if c > 0 {
            heap.push(Reverse((c, s)));
        }
    }
    if heap.len() == 1 {
        if let Some(Reverse((_, s))) = heap.pop() {
            lens[s] = 1;
        }
        return lens;
    }
    while heap.len() > 1 {
        let (Some(Reverse((a, x))), Some(Reverse((b, y)))) = (heap.pop(), heap.pop()) else { break };
        let n = parent.len();
        parent.push(usize::MAX);
        parent[x] = n;
        parent[y] = n;
        heap.push(Reverse((a + b, n)));
    }
    for (s, len) in lens.iter_mut().enumerate() {
        if freq[s] == 0 {
            continue;
        }
        let (mut depth, mut n) = (0u32, s);
        while parent[n] != usize::MAX {
            n = parent[n];
            depth += 1;
        }
        *len = depth.min(255) as u8;
    }
    lens
}

fn reverse(code: u32, len: u32) -> u32 {
    code.reverse_bits() >> (32 - len)
}

/// Canonical code of every symbol (bit-reversed, ready to be packed least significant bit first), the counts per
/// length and the symbols in canonical order.
struct Canonical {
    counts: [u16; MAX_LEN + 1],
    symbols: Vec<u8>,
    codes: [u32; 256],
    lens: [u8; 256],
}

fn canonical(lens: &[u8; 256]) -> Canonical {
    let mut counts = [0u16; MAX_LEN + 1];
    let mut symbols = Vec::new();
    for (l, count) in counts.iter_mut().enumerate().skip(1) {
        for (s, &len) in lens.iter().enumerate() {
            if usize::from(len) == l {
                *count += 1;
                symbols.push(s as u8);
            }
        }
    }
    let mut codes = [0u32; 256];
    let (mut code, mut at) = (0u32, 0usize);
    for l in 1..=MAX_LEN {
        for &s in &symbols[at..at + usize::from(counts[l])] {
            codes[usize::from(s)] = reverse(code, l as u32);
            code += 1;
        }
        at += usize::from(counts[l]);
        code <<= 1;
    }
    Canonical { counts, symbols, codes, lens: *lens }
}

/// Encodes `raw` (one plane of one chunk) as a Huffman stream. Planes up to 256 MiB (their bits then stay under the
/// 4 GiB the segment ends can say); packs cut planes of at most 16 MiB.
pub fn encode(raw: &[u8]) -> Vec<u8> {
    debug_assert!(raw.len() <= 256 << 20, "a Huffman plane of {} bytes", raw.len());
    let mut freq = [0u64; 256];
    for &b in raw {
        freq[usize::from(b)] += 1;
    }
    let distinct = freq.iter().filter(|&&c| c > 0).count();
    if distinct <= 1 {
        let symbol = raw.first().copied().unwrap_or(0);
        return vec![0, SEG_SHIFT, symbol, 0];
    }
    let c = canonical(&code_lengths(&freq));
    let max_len = (1..=MAX_LEN).rev().find(|&l| c.counts[l] > 0).unwrap_or(1);
    let seg = 1usize << SEG_SHIFT;
    let n = raw.len().div_ceil(seg);
    let mut out = vec![max_len as u8, SEG_SHIFT];
    for l in 1..=max_len {
        out.extend_from_slice(&c.counts[l].to_le_bytes());
    }
    out.extend_from_slice(&c.symbols);
    out.resize(out.len().next_multiple_of(4), 0);
    let ends_at = out.len();
    out.resize(ends_at + 4 * n, 0);
    let bits_at = out.len();
    for (i, segment) in raw.chunks(seg).enumerate() {
        let (mut acc, mut have) = (0u64, 0u32);
        for &b in segment {
            acc |= u64::from(c.codes[usize::from(b)]) << have;
            have += u32::from(c.lens[usize::from(b)]);
            if have >= 32 {
                out.extend_from_slice(&(acc as u32).to_le_bytes());
                acc >>= 32;
                have -= 32;
            }
        }
        if have > 0 {
            out.extend_from_slice(&(acc as u32).to_le_bytes());
        }
        let end = (out.len() - bits_at) as u32;
        out[ends_at + 4 * i..ends_at + 4 * i + 4].copy_from_slice(&end.to_le_bytes());
    }
    out
}

/// The parts of a stream's header, checked.
struct Header<'a> {
    max_len: usize,
    seg_shift: u8,
    counts: [u16; MAX_LEN + 1],
    symbols: &'a [u8],
    ends: &'a [u8],
    bits: &'a [u8],
}

fn header(stored: &[u8], raw_len: usize) -> Result<Result<Header<'_>, u8>, String> {
    if stored.len() < 4 {
        return Err(format!("{} bytes is shorter than a header", stored.len()));
    }
    let (max_len, seg_shift) = (usize::from(stored[0]), stored[1]);
    if max_len > MAX_LEN || !(MIN_SEG_SHIFT..=MAX_SEG_SHIFT).contains(&seg_shift) {
        return Err(format!("code length {max_len} or segment shift {seg_shift} out of range"));
    }
    if max_len == 0 {
        if stored.len() != 4 {
            return Err(format!("a one-symbol stream of {} bytes (4 expected)", stored.len()));
        }
        return Ok(Err(stored[2]));
    }
    let mut counts = [0u16; MAX_LEN + 1];
    let mut at = 2;
    let mut left: i64 = 1; // code space left at the current length
    let mut total = 0usize;
    for (l, count) in counts.iter_mut().enumerate().take(max_len + 1).skip(1) {
        let c = stored.get(at..at + 2).ok_or("the counts run past the stream")?;
        *count = u16::from_le_bytes([c[0], c[1]]);
        at += 2;
        left = 2 * left - i64::from(*count);
        if left < 0 {
            return Err(format!("the codes over-fill length {l}"));
        }
        total += usize::from(*count);
    }
    if total == 0 || total > 256 {
        return Err(format!("{total} symbols"));
    }
    let symbols = stored.get(at..at + total).ok_or("the symbols run past the stream")?;
    let ends_at = (at + total).next_multiple_of(4);
    let n = raw_len.div_ceil(1 << seg_shift);
    let bits_at = ends_at + 4 * n;
    if bits_at > stored.len() {
        return Err(format!("{n} segment ends run past the stream"));
    }
    Ok(Ok(Header { max_len, seg_shift, counts, symbols, ends: &stored[ends_at..bits_at], bits: &stored[bits_at..] }))
}

/// Decodes a Huffman stream into `out` (the plane, which must be filled exactly). Table-driven: every `MAX_LEN`-bit
/// window maps to its symbol and code length.
pub fn decode(stored: &[u8], out: &mut [u8]) -> Result<(), String> {
    let h = match header(stored, out.len())? {
        Err(symbol) => {
            out.fill(symbol);
            return Ok(());
        }
        Ok(h) => h,
    };
    let l = h.max_len as u32;
    // Table entries: symbol | length << 8; 0 where no code starts with these bits.
    let mut table = vec![0u16; 1 << l];
    let (mut code, mut at) = (0u32, 0usize);
    for len in 1..=l {
        for &s in &h.symbols[at..at + usize::from(h.counts[len as usize])] {
            let r = reverse(code, len) as usize;
            for j in 0..1usize << (l - len) {
                table[r | j << len] = u16::from(s) | (len as u16) << 8;
            }
            code += 1;
        }
        at += usize::from(h.counts[len as usize]);
        code <<= 1;
    }
    let seg = 1usize << h.seg_shift;
    // Every segment's bits, checked before any is decoded.
    let mut ranges = Vec::with_capacity(h.ends.len() / 4);
    let mut start = 0usize;
    for (i, e) in h.ends.chunks_exact(4).enumerate() {
        let end = u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as usize;
        if end < start || end > h.bits.len() || !end.is_multiple_of(4) {
            return Err(format!("segment {i} ends at {end} (previous {start}, {} bytes of bits)", h.bits.len()));
        }
        ranges.push(start..end);
        start = end;
    }
    // Four segments at a time: each code's length comes from a table load that the next code waits for, so one
    // segment alone leaves the CPU idle most of each step; four independent chains fill it.
    let mut first = 0usize;
    for (outs, ranges) in out.chunks_mut(4 * seg).zip(ranges.chunks(4)) {
        let mut outs: Vec<&mut [u8]> = outs.chunks_mut(seg).collect();
        let bits: Vec<&[u8]> = ranges.iter().map(|r| &h.bits[r.clone()]).collect();
        let used = decode_interleaved(&table, l, &bits, &mut outs)
            .map_err(|(k, at)| format!("segment {}: {at}", first + k))?;
        for (k, u) in used.into_iter().enumerate() {
            if u > 8 * bits[k].len() {
                return Err(format!("segment {} needs {u} bits but holds {}", first + k, 8 * bits[k].len()));
            }
        }
        first += outs.len();
    }
    if start != h.bits.len() {
        return Err(format!("the segments end at {start} of {} bytes of bits", h.bits.len()));
    }
    Ok(())
}

/// The symbol of the code at the bottom of `w` (bit `pos` of its segment); consumes the code's bits.
#[inline(always)]
fn next_code(table: &[u16], mask: u64, w: &mut u64, pos: &mut usize) -> Result<u8, String> {
    let e = table[(*w & mask) as usize];
    let len = e >> 8;
    if len == 0 {
        return Err(format!("no code starts with the bits at {pos}"));
    }
    *w >>= len;
    *pos += usize::from(len);
    Ok(e as u8)
}

/// Decodes one segment (from bit `first_bit` of `bits`) into `out` with the `l`-bit table; the bit position it ended
/// at (possibly past what `bits` holds: the caller refuses that). Five codes per 8-byte load: after a shift of at
/// most 7 bits it holds 57, and five codes take at most 55.
fn decode_segment(table: &[u16], l: u32, bits: &[u8], first_bit: usize, out: &mut [u8]) -> Result<usize, String> {
    let mask = (1u64 << l) - 1;
    let mut pos = first_bit;
    let mut i = 0usize;
    while i < out.len() {
        let byte = pos >> 3;
        let mut word = [0u8; 8];
        if byte + 8 <= bits.len() {
            word.copy_from_slice(&bits[byte..byte + 8]);
        } else if byte < bits.len() {
            word[..bits.len() - byte].copy_from_slice(&bits[byte..]);
        }
        let mut w = u64::from_le_bytes(word) >> (pos & 7);
        let end = (i + 5).min(out.len());
        for b in &mut out[i..end] {
            *b = next_code(table, mask, &mut w, &mut pos)?;
        }
        i = end;
    }
    Ok(pos)
}

/// [`decode_segment`] of up to four segments, their codes interleaved while each has five left; the bits each used.
fn decode_interleaved(
    table: &[u16],
    l: u32,
    bits: &[&[u8]],
    outs: &mut [&mut [u8]],
) -> Result<Vec<usize>, (usize, String)> {
    let mask = (1u64 << l) - 1;
    let n = outs.len();
    let mut pos = [0usize; 4];
    let mut at = [0usize; 4];
    if n == 4 {
        let rounds = outs.iter().map(|o| o.len() / 5).min().unwrap_or(0);
        let mut r = 0;
        // Fast rounds: every segment has five codes left and 8 readable bytes at its position (five codes take at
        // most 55 bits).
        while r < rounds && (0..4).all(|k| (pos[k] >> 3) + 8 <= bits[k].len()) {
            let mut w = [0u64; 4];
            for k in 0..4 {
                let byte = pos[k] >> 3;
                let mut word = [0u8; 8];
                word.copy_from_slice(&bits[k][byte..byte + 8]);
                w[k] = u64::from_le_bytes(word) >> (pos[k] & 7);
            }
            for _ in 0..5 {
                for k in 0..4 {
                    outs[k][at[k]] = next_code(table, mask, &mut w[k], &mut pos[k]).map_err(|e| (k, e))?;
                    at[k] += 1;
                }
            }
            r += 1;
        }
    }
    let mut used = Vec::with_capacity(n);
    for k in 0..n {
        let rest =
            decode_segment(table, l, &bits[k][(pos[k] >> 3).min(bits[k].len())..], pos[k] & 7, &mut outs[k][at[k]..])
                .map_err(|e| (k, e))?;
        used.push((pos[k] & !7) + rest);
    }
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exponent_like(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // A skewed byte: most values near 0x3c, a few far.
                let r = (x >> 32) as u32;
                (0x3c + (r.trailing_zeros() as i32 - 2) * if r & 1 == 0 { 1 } else { -1 }) as u8
            })
            .collect()
    }

    #[test]
    fn round_trips_skewed_uniform_constant_and_odd_lengths() {
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![7],
            vec![9; 5000],
            (0..=255u8).collect(),
            (0..100_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect(),
            exponent_like(65_536, 1),
            exponent_like(1023, 2),
            exponent_like(1025, 3),
            exponent_like(3, 4),
            [vec![1u8; 4096], vec![2u8; 1]].concat(),
        ];
        // Counts spread over many orders of magnitude: the code must be flattened to fit 11 bits.
        let mut fib = Vec::new();
        let (mut a, mut b) = (1usize, 1usize);
        for s in 0..24u8 {
            fib.extend(std::iter::repeat_n(s, a));
            (a, b) = (b, a + b);
        }
        cases.push(fib);
        for raw in cases {
            let stored = encode(&raw);
            let mut out = vec![0xa5u8; raw.len()];
            decode(&stored, &mut out).unwrap();
            assert_eq!(out, raw, "{} bytes", raw.len());
            if raw.len() > 100 && raw.iter().all(|&b| b == raw[0]) {
                assert_eq!(stored.len(), 4);
            }
        }
    }

    #[test]
    fn skewed_bytes_shrink_and_random_ones_do_not_grow_much() {
        let skewed = exponent_like(65_536, 9);
        assert!(encode(&skewed).len() < skewed.len() / 2);
        let random: Vec<u8> = (0..65_536u64).map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8).collect();
        assert!(encode(&random).len() < random.len() + random.len() / 50);
    }

    #[test]
    fn codes_never_exceed_the_longest_length() {
        let mut freq = [0u64; 256];
        let mut f = 1u64;
        for x in freq.iter_mut().take(40) {
            *x = f;
            f = f.saturating_mul(2);
        }
        let lens = code_lengths(&freq);
        assert!(lens.iter().all(|&l| usize::from(l) <= MAX_LEN));
        let kraft: f64 = lens.iter().filter(|&&l| l > 0).map(|&l| 0.5f64.powi(i32::from(l))).sum();
        assert!(kraft <= 1.0 + 1e-12);
    }

    #[test]
    fn hostile_streams_are_errors_not_panics() {
        let raw = exponent_like(5000, 5);
        let good = encode(&raw);
        let mut out = vec![0u8; raw.len()];
        assert!(decode(&good[..3], &mut out).is_err());
        let mut bad = good.clone();
        bad[0] = 12; // code length past the maximum
        assert!(decode(&bad, &mut out).is_err());
        let mut bad = good.clone();
        bad[1] = 3; // segment shift out of range
        assert!(decode(&bad, &mut out).is_err());
        let mut bad = good.clone();
        bad[2] = 3; // three codes of length 1
        bad[3] = 0;
        assert!(decode(&bad, &mut out).is_err());
        // A stream cut short, a wrong plane length, a byte of the bits flipped: an error or other bytes, never a
        // panic.
        assert!(decode(&good[..good.len() - 4], &mut out).is_err());
        let mut longer = vec![0u8; raw.len() + 1024];
        assert!(decode(&good, &mut longer).is_err());
        for at in (0..good.len()).step_by(7) {
            let mut flipped = good.clone();
            flipped[at] ^= 0x5a;
            let _ = decode(&flipped, &mut out);
        }
        assert!(decode(&[0, SEG_SHIFT, 1, 0, 0], &mut out).is_err());
    }
}

#[cfg(test)]
mod speed {
    /// `cargo test --release -p weightlift-pack huffman_cpu_rate -- --ignored --nocapture`: one thread's decode rate
    /// on bf16 exponent-like planes of 64 KiB.
    #[test]
    #[ignore = "a measurement: run it in release with --ignored --nocapture"]
    fn huffman_cpu_rate() {
        let mut raw = vec![0u8; 64 << 20];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for b in raw.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let d = (x >> 40).trailing_zeros().min(6) as u8;
            *b = if x & 1 == 0 { 0x3c + d } else { 0x3c - d };
        }
        let streams: Vec<Vec<u8>> = raw.chunks(64 << 10).map(super::encode).collect();
        let mut out = vec![0u8; 64 << 10];
        let t = std::time::Instant::now();
        for s in &streams {
            super::decode(s, &mut out).unwrap();
        }
        let secs = t.elapsed().as_secs_f64();
        let stored: usize = streams.iter().map(Vec::len).sum();
        eprintln!(
            "ratio {:.3}, decode {:.0} MB/s of plane",
            stored as f64 / raw.len() as f64,
            raw.len() as f64 / secs / 1e6
        );
    }
}
