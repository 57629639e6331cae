//! The unpack kernels' source, compiled by the host C++ compiler with a prelude standing in for CUDA's names and
//! run thread by thread (the kernels use no shared memory, barriers or warp operations, so this is their exact
//! semantics): xxh3-64 must equal the xxhash crate's for every length class and alignment, and the plane merge
//! must equal the CPU merge. Skips with a reason where no `c++` compiler is installed.

use std::path::Path;
use std::process::Command;

use weightlift_cuda::unpack::KERNEL_SOURCE;

const HARNESS: &str = r#"
#include <cstdio>
#include <cstdlib>
#include <vector>
struct Dim { unsigned x, y, z; };
static Dim threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
#include "kernels.cu"
template <class F> static void launch(unsigned grid, unsigned block, F f) {
    gridDim = {grid, 1, 1}; blockDim = {block, 1, 1};
    for (unsigned b = 0; b < grid; ++b) for (unsigned t = 0; t < block; ++t) { blockIdx = {b, 0, 0}; threadIdx = {t, 0, 0}; f(); }
}
static std::vector<u64> words(FILE* f, size_t n) { std::vector<u64> v(n); if (n && fread(v.data(), 8, n, f) != n) exit(3); return v; }
int main(int argc, char** argv) {
    FILE* f = fopen(argv[2], "rb");
    u64 head[3]; if (fread(head, 8, 3, f) != 3) return 2;
    std::vector<u64> table = words(f, head[1]);
    std::vector<unsigned char> mem(head[2] + 64);
    unsigned char* base = mem.data() + (64 - ((u64)mem.data() & 63));
    if (head[2] && fread(base, 1, head[2], f) != head[2]) return 4;
    if (argv[1][0] == 'u') {  // table: (source offset, source length, output length, output misalignment) per job
        // Each stream and each output in an allocation of its own, so that a sanitizer sees any access outside.
        u32 n = (u32)head[0];
        std::vector<u64> in_ptrs(n), in_sizes(n), out_ptrs(n), out_lens(n), sizes(n);
        std::vector<u32> statuses(n, 0);
        std::vector<unsigned char*> outs(n);
        for (u32 i = 0; i < n; ++i) {
            u64 len = table[4 * i + 1];
            unsigned char* in = (unsigned char*)malloc(len ? len : 1);
            for (u64 k = 0; k < len; ++k) in[k] = base[table[4 * i] + k];
            outs[i] = (unsigned char*)malloc(table[4 * i + 2] + table[4 * i + 3] + 1);
            in_ptrs[i] = (u64)in; in_sizes[i] = len;
            out_ptrs[i] = (u64)(outs[i] + table[4 * i + 3]); out_lens[i] = table[4 * i + 2];
        }
        launch(3, 5, [&] { wl_huff_decode(in_ptrs.data(), in_sizes.data(), out_ptrs.data(), out_lens.data(), sizes.data(), statuses.data(), n); });
        FILE* o = fopen(argv[3], "wb");
        for (u32 i = 0; i < n; ++i) {
            printf("%u %llu\n", statuses[i], sizes[i]);
            fwrite((const void*)out_ptrs[i], 1, out_lens[i], o);
            free((void*)in_ptrs[i]); free(outs[i]);
        }
        fclose(o);
    } else if (argv[1][0] == 'h') {  // table: (offset, len) per range
        u32 n = (u32)head[0];
        std::vector<HashJob> jobs(n); u64 blocks = 0;
        for (u32 i = 0; i < n; ++i) { jobs[i] = {(u64)(base + table[2 * i]), table[2 * i + 1], blocks}; blocks += wl_blocks_of(table[2 * i + 1]); }
        std::vector<u64> sums(blocks * 8 + 8), accs(8 * n + 8), out(n + 1);
        launch(3, 7, [&] { wl_xxh3_blocks(jobs.data(), n, sums.data()); });
        launch(5, 11, [&] { wl_xxh3_lanes(jobs.data(), n, sums.data(), accs.data()); });
        launch(2, 3, [&] { wl_xxh3_final(jobs.data(), n, accs.data(), out.data()); });
        for (u32 i = 0; i < n; ++i) printf("%016llx\n", out[i]);
    } else {  // table: per job (dst offset, plane_len, first_src | planes << 32), then source offsets
        u32 n = (u32)head[0];
        std::vector<MergeJob> jobs(n);
        for (u32 i = 0; i < n; ++i) jobs[i] = {(u64)(base + table[3 * i]), table[3 * i + 1], (u32)table[3 * i + 2], (u32)(table[3 * i + 2] >> 32)};
        std::vector<u64> srcs(table.begin() + 3 * n, table.end());
        for (auto& s : srcs) s = (u64)(base + s);
        launch(2, 13, [&] { wl_merge(jobs.data(), srcs.data(), n); });
        fwrite(base, 1, head[2], stdout);
    }
    return 0;
}
"#;

fn build(dir: &Path) -> Option<std::path::PathBuf> {
    build_with(dir, &[])
}

fn build_with(dir: &Path, flags: &[&str]) -> Option<std::path::PathBuf> {
    std::fs::write(dir.join("kernels.cu"), KERNEL_SOURCE).unwrap();
    std::fs::write(dir.join("harness.cpp"), HARNESS).unwrap();
    let exe = dir.join("harness");
    let out = Command::new("c++")
        .args(["-O2", "-std=c++17"])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(dir.join("harness.cpp"))
        .output();
    match out {
        Ok(o) if o.status.success() => Some(exe),
        Ok(o) => panic!("the kernels do not compile as host C++:\n{}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("skipping: no host C++ compiler (c++): {e}");
            None
        }
    }
}

fn input(head0: u64, table: &[u64], mem: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    for w in [head0, table.len() as u64, mem.len() as u64].iter().chain(table) {
        v.extend_from_slice(&w.to_le_bytes());
    }
    v.extend_from_slice(mem);
    v
}

#[test]
fn xxh3_kernels_match_the_xxhash_crate_for_every_length_and_alignment() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build(dir.path()) else { return };
    let mut mem = vec![0u8; 300_000];
    weightlift_format::synth::tensor_bytes(5, 0, 0, &mut mem);
    let mut ranges = Vec::new();
    for len in
        (0..300).chain([479, 480, 481, 1023, 1024, 1025, 1087, 1088, 2047, 2048, 2049, 4096, 65_536, 100_003, 262_144])
    {
        for align in [0u64, 1, 3, 8] {
            ranges.push((64 + align, len as u64));
        }
    }
    let table: Vec<u64> = ranges.iter().flat_map(|&(o, l)| [o, l]).collect();
    let path = dir.path().join("in.bin");
    std::fs::write(&path, input(ranges.len() as u64, &table, &mem)).unwrap();
    let out = Command::new(&exe).arg("h").arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Vec<u64> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| u64::from_str_radix(l, 16).unwrap()).collect();
    assert_eq!(got.len(), ranges.len());
    for (&(o, l), g) in ranges.iter().zip(got) {
        let want = xxhash_rust::xxh3::xxh3_64(&mem[o as usize..(o + l) as usize]);
        assert_eq!(g, want, "xxh3 of {l} bytes at offset {o}");
    }
}

#[test]
fn merge_kernel_matches_the_cpu_merge() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build(dir.path()) else { return };
    // Three chunks: 2 planes of 1001 bytes, 4 planes of 77, 1 plane of 5000; sources first, destinations after
    // (odd offsets, as tensors in an upstream safetensors file have).
    let specs = [(2usize, 1001usize), (4, 77), (1, 5000), (8, 3)];
    let mut mem = vec![0u8; 40_000];
    weightlift_format::synth::tensor_bytes(8, 0, 0, &mut mem[..20_000]);
    let (mut src_at, mut dst_at) = (0u64, 20_001u64);
    let (mut jobs, mut srcs, mut expect) = (Vec::new(), Vec::new(), Vec::new());
    for &(k, n) in &specs {
        let first = srcs.len() as u64;
        let mut planes = Vec::new();
        for _ in 0..k {
            srcs.push(src_at);
            planes.push(mem[src_at as usize..src_at as usize + n].to_vec());
            src_at += n as u64 + 3;
        }
        let mut merged = vec![0u8; n * k];
        let refs: Vec<&[u8]> = planes.iter().map(|p| p.as_slice()).collect();
        weightlift_pack::planes::merge(&refs, &mut merged);
        jobs.extend([dst_at, n as u64, first | (k as u64) << 32]);
        expect.push((dst_at, merged));
        dst_at += (n * k) as u64 + 5;
    }
    let table: Vec<u64> = jobs.into_iter().chain(srcs).collect();
    let path = dir.path().join("in.bin");
    std::fs::write(&path, input(specs.len() as u64, &table, &mem)).unwrap();
    let out = Command::new(&exe).arg("m").arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (at, merged) in expect {
        assert!(out.stdout[at as usize..at as usize + merged.len()] == merged[..], "chunk at {at}");
    }
}

/// Skewed bytes like a bf16 plane's exponent bytes (a few values near one, rarer ones further out).
fn exponent_like(n: usize, seed: u64) -> Vec<u8> {
    let mut raw = vec![0u8; 2 * n];
    weightlift_format::synth::tensor_bytes(seed, 0, 0, &mut raw);
    raw.chunks_exact(2)
        .map(|p| {
            let d = p[0].trailing_zeros() as u8;
            if p[1] & 1 == 0 { 0x3c + d } else { 0x3c - d }
        })
        .collect()
}

/// Runs `wl_huff_decode` over `streams` (each with its plane length and an output misalignment); the statuses, the
/// sizes written, and the outputs.
fn huff_kernel(exe: &Path, dir: &Path, streams: &[(Vec<u8>, usize, u64)]) -> Vec<(u32, u64, Vec<u8>)> {
    let (mut mem, mut table) = (Vec::new(), Vec::new());
    for (s, plane, mis) in streams {
        table.extend([mem.len() as u64, s.len() as u64, *plane as u64, *mis]);
        mem.extend_from_slice(s);
    }
    let path = dir.join("huff.bin");
    std::fs::write(&path, input(streams.len() as u64, &table, &mem)).unwrap();
    let outs = dir.join("huff.out");
    let out = Command::new(exe).arg("u").arg(&path).arg(&outs).output().unwrap();
    assert!(out.status.success(), "the harness failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&outs).unwrap();
    let mut at = 0;
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .zip(streams)
        .map(|(l, (_, plane, _))| {
            let mut f = l.split(' ');
            let st = f.next().unwrap().parse().unwrap();
            let size = f.next().unwrap().parse().unwrap();
            at += plane;
            (st, size, bytes[at - plane..at].to_vec())
        })
        .collect()
}

/// Built with AddressSanitizer where the compiler has it (each stream and output is an allocation of its own, so a
/// read or write outside them fails the run); plainly otherwise.
fn build_sanitized(dir: &Path) -> Option<std::path::PathBuf> {
    let probe = dir.join("probe.cpp");
    std::fs::write(&probe, "int main() { return 0; }\n").unwrap();
    let asan = Command::new("c++")
        .args(["-fsanitize=address", "-o"])
        .arg(dir.join("probe"))
        .arg(&probe)
        .output()
        .is_ok_and(|o| o.status.success());
    if !asan {
        eprintln!("no AddressSanitizer here: the Huffman kernel runs unsanitized");
    }
    build_with(dir, if asan { &["-fsanitize=address", "-fno-omit-frame-pointer"] } else { &[] })
}

#[test]
fn huffman_kernel_matches_the_cpu_decoder() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_sanitized(dir.path()) else { return };
    let mut planes: Vec<Vec<u8>> = [1usize, 2, 63, 64, 1000, 1024, 1025, 4096, 65_536, 70_001]
        .iter()
        .enumerate()
        .map(|(i, &n)| exponent_like(n, i as u64))
        .collect();
    let mut random = vec![0u8; 30_000];
    weightlift_format::synth::tensor_bytes(3, 0, 0, &mut random);
    planes.extend([random, vec![0x3f; 5000], vec![], (0..=255u8).cycle().take(9999).collect()]);
    let streams: Vec<(Vec<u8>, usize, u64)> = planes
        .iter()
        .enumerate()
        .map(|(i, p)| (weightlift_pack::huffman::encode(p), p.len(), [0u64, 1, 3][i % 3]))
        .collect();
    for ((st, size, got), plane) in huff_kernel(&exe, dir.path(), &streams).into_iter().zip(&planes) {
        assert_eq!((st, size), (0, plane.len() as u64), "{} bytes", plane.len());
        assert!(got == *plane, "the kernel's {} bytes differ from the plane", plane.len());
    }
}

#[test]
fn huffman_kernel_refuses_what_the_cpu_decoder_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_sanitized(dir.path()) else { return };
    let plane = exponent_like(5000, 11);
    let good = weightlift_pack::huffman::encode(&plane);
    // Every byte of the header and segment table, and bytes of the bits, changed; the stream cut short; the plane
    // length wrong.
    let mut cases: Vec<(Vec<u8>, usize)> = Vec::new();
    for at in (0..good.len()).filter(|&i| i < 80 || i % 13 == 0) {
        for x in [0x01u8, 0x80, 0xff] {
            let mut s = good.clone();
            s[at] ^= x;
            cases.push((s, plane.len()));
        }
    }
    for cut in [0, 1, 3, 4, 5, 20, good.len() / 2, good.len() - 4, good.len() - 1] {
        cases.push((good[..cut].to_vec(), plane.len()));
    }
    cases.extend([(good.clone(), plane.len() + 1), (good.clone(), plane.len() - 1), (good.clone(), 1 << 20)]);
    cases.push((vec![0, 10, 7, 0], 100));
    // An empty plane: a stream with codes but no segments holds no bits (refused when it has some).
    cases.push((good.clone(), 0));
    cases.push((weightlift_pack::huffman::encode(&[]), 0));
    cases.push((vec![0, 10, 7, 0, 0], 100));
    let streams: Vec<(Vec<u8>, usize, u64)> = cases.iter().map(|(s, n)| (s.clone(), *n, 0)).collect();
    let mut refused = 0;
    for ((st, _, got), (s, n)) in huff_kernel(&exe, dir.path(), &streams).into_iter().zip(&cases) {
        let mut cpu = vec![0u8; *n];
        let r = weightlift_pack::huffman::decode(s, &mut cpu);
        assert_eq!(st != 0, r.is_err(), "kernel status {st}, CPU {r:?}");
        if st == 0 {
            // A changed bit of the codes decodes to other bytes: the chunk's checksum refuses those.
            assert!(got == cpu, "kernel and CPU decoded a changed stream differently");
        } else {
            refused += 1;
        }
        if s.len() < good.len() && *n == plane.len() {
            assert_ne!(st, 0, "a stream cut to {} bytes was decoded", s.len());
        }
    }
    assert!(refused > cases.len() / 8, "only {refused} of {} changed streams refused", cases.len());
}
