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
    if (argv[1][0] == 'h') {  // table: (offset, len) per range
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
    std::fs::write(dir.join("kernels.cu"), KERNEL_SOURCE).unwrap();
    std::fs::write(dir.join("harness.cpp"), HARNESS).unwrap();
    let exe = dir.join("harness");
    let out = Command::new("c++").args(["-O2", "-std=c++17", "-o"]).arg(&exe).arg(dir.join("harness.cpp")).output();
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
