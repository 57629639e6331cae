// Kernels for packed checkpoints: merging byte planes into their tensor, and xxh3-64 (seed 0) of byte ranges.
//
// Written so that a host C++ compiler can run them too (the tests do, on machines without a GPU): no shared memory,
// no barriers, no warp intrinsics; every thread works alone, so running the threads of a launch one after the
// other gives the same result. The host prelude defines the few CUDA names used here.
//
// xxh3-64 of an input longer than 240 bytes accumulates 1 KiB blocks into 8 lanes and scrambles the lanes after
// each block. A block's contribution does not depend on the accumulator, so it is computed for every block in
// parallel (wl_xxh3_blocks); one thread per lane then runs the short chain of adds and scrambles and the tail
// (wl_xxh3_lanes); one thread per range merges the lanes, or hashes a short input directly (wl_xxh3_final).

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

struct MergeJob {
    u64 dst;        // destination of the merged bytes
    u64 plane_len;  // bytes per plane (the chunk is plane_len * planes bytes)
    u32 first_src;  // index of plane 0's address in the source table
    u32 planes;     // 1, 2, 4 or 8
};

struct HashJob {
    u64 data;        // device address of the bytes
    u64 len;
    u64 block_base;  // first row of this range's 1 KiB block sums (8 lanes each)
};

__device__ const u8 WL_SECRET[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

#define WL_P32_1 0x9E3779B1ULL
#define WL_P32_2 0x85EBCA77ULL
#define WL_P32_3 0xC2B2AE3DULL
#define WL_P64_1 0x9E3779B185EBCA87ULL
#define WL_P64_2 0xC2B2AE3D27D4EB4FULL
#define WL_P64_3 0x165667B19E3779F9ULL
#define WL_P64_4 0x85EBCA77C2B2AE63ULL
#define WL_P64_5 0x27D4EB2F165667C5ULL
#define WL_MX1 0x165667919E3779F9ULL
#define WL_MX2 0x9FB21C651E98DF25ULL

// Little-endian loads from any address: one 8-byte load when aligned, bytes otherwise (a range's alignment is the
// same for all its threads, so the branch does not diverge).
__device__ __forceinline__ u64 wl_ld64(const u8* p) {
    if ((((u64)p) & 7) == 0) return *(const u64*)p;
    u64 v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

__device__ __forceinline__ u32 wl_ld32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

__device__ __forceinline__ u64 wl_secret64(int at) {
    u64 v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | WL_SECRET[at + i];
    return v;
}

__device__ __forceinline__ u64 wl_fold(u64 a, u64 b) { return (a * b) ^ __umul64hi(a, b); }
__device__ __forceinline__ u64 wl_rotl(u64 x, int r) { return (x << r) | (x >> (64 - r)); }
__device__ __forceinline__ u64 wl_swap64(u64 x) {
    u64 r = 0;
    for (int i = 0; i < 8; ++i) r = (r << 8) | ((x >> (8 * i)) & 0xff);
    return r;
}

__device__ __forceinline__ u64 wl_avalanche(u64 h) {
    h ^= h >> 37;
    h *= WL_MX1;
    return h ^ (h >> 32);
}

__device__ __forceinline__ u64 wl_xxh64_avalanche(u64 h) {
    h ^= h >> 33;
    h *= WL_P64_2;
    h ^= h >> 29;
    h *= WL_P64_3;
    return h ^ (h >> 32);
}

__device__ __forceinline__ u64 wl_mix16(const u8* in, int sec) {
    return wl_fold(wl_ld64(in) ^ wl_secret64(sec), wl_ld64(in + 8) ^ wl_secret64(sec + 8));
}

// xxh3-64 of inputs of at most 240 bytes (seed 0).
__device__ u64 wl_xxh3_short(const u8* p, u64 len) {
    if (len == 0) return wl_xxh64_avalanche(wl_secret64(56) ^ wl_secret64(64));
    if (len <= 3) {
        u32 c1 = p[0], c2 = p[len >> 1], c3 = p[len - 1];
        u32 combined = (c1 << 16) | (c2 << 24) | c3 | ((u32)len << 8);
        u64 bitflip = (u64)((u32)wl_secret64(0) ^ (u32)wl_secret64(4));
        return wl_xxh64_avalanche((u64)combined ^ bitflip);
    }
    if (len <= 8) {
        u64 bitflip = wl_secret64(8) ^ wl_secret64(16);
        u64 input64 = (u64)wl_ld32(p + len - 4) + ((u64)wl_ld32(p) << 32);
        u64 h = input64 ^ bitflip;
        h ^= wl_rotl(h, 49) ^ wl_rotl(h, 24);
        h *= WL_MX2;
        h ^= (h >> 35) + len;
        h *= WL_MX2;
        return h ^ (h >> 28);
    }
    if (len <= 16) {
        u64 lo = wl_ld64(p) ^ (wl_secret64(24) ^ wl_secret64(32));
        u64 hi = wl_ld64(p + len - 8) ^ (wl_secret64(40) ^ wl_secret64(48));
        return wl_avalanche(len + wl_swap64(lo) + hi + wl_fold(lo, hi));
    }
    u64 acc = len * WL_P64_1;
    if (len <= 128) {
        if (len > 32) {
            if (len > 64) {
                if (len > 96) {
                    acc += wl_mix16(p + 48, 96);
                    acc += wl_mix16(p + len - 64, 112);
                }
                acc += wl_mix16(p + 32, 64);
                acc += wl_mix16(p + len - 48, 80);
            }
            acc += wl_mix16(p + 16, 32);
            acc += wl_mix16(p + len - 32, 48);
        }
        acc += wl_mix16(p, 0);
        acc += wl_mix16(p + len - 16, 16);
        return wl_avalanche(acc);
    }
    for (int i = 0; i < 8; ++i) acc += wl_mix16(p + 16 * i, 16 * i);
    acc = wl_avalanche(acc);
    int rounds = (int)(len / 16);
    for (int i = 8; i < rounds; ++i) acc += wl_mix16(p + 16 * i, 16 * (i - 8) + 3);
    acc += wl_mix16(p + len - 16, 136 - 17);
    return wl_avalanche(acc);
}

// Contribution of `stripes` 64-byte stripes at `p` to lane `i`: the product of lane i's keyed word and the plain
// word of lane i^1 (xxh3's accumulate_512 adds lane i's word to lane i^1).
__device__ __forceinline__ u64 wl_stripes(const u8* p, u64 stripes, int i, int sec) {
    u64 sum = 0;
    for (u64 s = 0; s < stripes; ++s) {
        u64 dk = wl_ld64(p + 64 * s + 8 * i) ^ wl_secret64(sec + (int)(8 * s) + 8 * i);
        sum += (dk & 0xffffffffULL) * (dk >> 32) + wl_ld64(p + 64 * s + 8 * (i ^ 1));
    }
    return sum;
}

__device__ __forceinline__ u64 wl_blocks_of(u64 len) { return len > 240 ? (len - 1) / 1024 : 0; }

extern "C" __global__ void wl_merge(const MergeJob* jobs, const u64* srcs, u32 n_jobs) {
    for (u32 j = blockIdx.x; j < n_jobs; j += gridDim.x) {
        MergeJob job = jobs[j];
        u8* dst = (u8*)job.dst;
        for (u64 e = threadIdx.x; e < job.plane_len; e += blockDim.x) {
            for (u32 p = 0; p < job.planes; ++p) dst[e * job.planes + p] = ((const u8*)srcs[job.first_src + p])[e];
        }
    }
}

extern "C" __global__ void wl_xxh3_blocks(const HashJob* jobs, u32 n_jobs, u64* sums) {
    for (u32 j = blockIdx.x; j < n_jobs; j += gridDim.x) {
        HashJob job = jobs[j];
        u64 units = wl_blocks_of(job.len) * 8;
        for (u64 t = threadIdx.x; t < units; t += blockDim.x) {
            u64 b = t / 8;
            int i = (int)(t % 8);
            sums[(job.block_base + b) * 8 + i] = wl_stripes((const u8*)job.data + 1024 * b, 16, i, 0);
        }
    }
}

extern "C" __global__ void wl_xxh3_lanes(const HashJob* jobs, u32 n_jobs, const u64* sums, u64* accs) {
    const u64 init[8] = {WL_P32_3, WL_P64_1, WL_P64_2, WL_P64_3, WL_P64_4, WL_P32_2, WL_P64_5, WL_P32_1};
    u64 total = (u64)n_jobs * 8;
    for (u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x; g < total; g += (u64)gridDim.x * blockDim.x) {
        HashJob job = jobs[g / 8];
        int i = (int)(g % 8);
        if (job.len <= 240) continue;
        const u8* p = (const u8*)job.data;
        u64 nb = wl_blocks_of(job.len);
        u64 key = wl_secret64(192 - 64 + 8 * i);
        u64 acc = init[i];
        for (u64 b = 0; b < nb; ++b) {
            acc += sums[(job.block_base + b) * 8 + i];
            acc ^= acc >> 47;
            acc ^= key;
            acc *= WL_P32_1;
        }
        u64 tail_stripes = ((job.len - 1) - 1024 * nb) / 64;
        acc += wl_stripes(p + 1024 * nb, tail_stripes, i, 0);
        acc += wl_stripes(p + job.len - 64, 1, i, 192 - 64 - 7);
        accs[g] = acc;
    }
}

extern "C" __global__ void wl_xxh3_final(const HashJob* jobs, u32 n_jobs, const u64* accs, u64* out) {
    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < n_jobs; j += (u64)gridDim.x * blockDim.x) {
        HashJob job = jobs[j];
        if (job.len <= 240) {
            out[j] = wl_xxh3_short((const u8*)job.data, job.len);
            continue;
        }
        u64 r = job.len * WL_P64_1;
        for (int k = 0; k < 4; ++k) {
            r += wl_fold(accs[j * 8 + 2 * k] ^ wl_secret64(11 + 16 * k), accs[j * 8 + 2 * k + 1] ^ wl_secret64(11 + 16 * k + 8));
        }
        out[j] = wl_avalanche(r);
    }
}

// Huffman streams (weightlift_pack::huffman, where the layout is described): one block per stream, one thread per
// segment of 2^S decoded bytes. Codes are matched one bit at a time against the canonical code's first code of
// each length (the counts stay in registers; no table to build per stream). Statuses: 0 decoded; 1 the header is
// malformed; 2 a segment's end is out of order or place; 3 bits that start no code; 4 a segment needs more bits
// than it holds. Where several segments of a stream fail for different reasons, which of their statuses is kept is
// not specified (any is non-zero). The stream's bytes are only read inside [in, in + in_len), the output only
// written inside [out, out + out_len), whatever the stream says.
#define WL_HUFF_MAX_LEN 11

__device__ __forceinline__ u32 wl_huff_word(const u8* p, bool aligned) {
    return aligned ? *(const u32*)p : wl_ld32(p);
}

__device__ u32 wl_huff_segments(const u8* in, u64 in_len, u8* out, u64 out_len, u32 first_seg, u32 step) {
    if (in_len < 4) return 1;
    u32 L = in[0], S = in[1];
    if (L > WL_HUFF_MAX_LEN || S < 6 || S > 16) return 1;
    u64 seg = 1ull << S;
    u64 nseg = (out_len >> S) + ((out_len & (seg - 1)) != 0);
    bool out_aligned = (((u64)out) & 3) == 0;
    if (L == 0) {
        if (in_len != 4) return 1;
        u8 sym = in[2];
        u32 word = (u32)sym * 0x01010101u;
        for (u64 s = first_seg; s < nseg; s += step) {
            u64 i = s << S, b = i + seg < out_len ? i + seg : out_len;
            if (out_aligned)
                for (; i + 4 <= b; i += 4) *(u32*)(out + i) = word;
            for (; i < b; ++i) out[i] = sym;
        }
        return 0;
    }
    int cnt[WL_HUFF_MAX_LEN + 1];
    int left = 1, total = 0;
    u64 at = 2;
#pragma unroll
    for (int l = 1; l <= WL_HUFF_MAX_LEN; ++l) {
        cnt[l] = 0;
        if ((u32)l <= L) {
            if (at + 2 > in_len) return 1;
            cnt[l] = (int)in[at] | ((int)in[at + 1] << 8);
            at += 2;
            left = 2 * left - cnt[l];
            if (left < 0) return 1;
            total += cnt[l];
        }
    }
    if (total == 0 || total > 256 || at + total > in_len) return 1;
    const u8* syms = in + at;
    u64 ends_at = (at + total + 3) & ~3ull;
    if (nseg > in_len / 4 || ends_at + 4 * nseg > in_len) return 1;
    if (nseg == 0 && ends_at != in_len) return 2;  // an empty plane has no bits
    const u8* bits = in + ends_at + 4 * nseg;
    u64 bits_len = in_len - (ends_at + 4 * nseg);
    bool in_aligned = (((u64)bits) & 3) == 0;
    for (u64 s = first_seg; s < nseg; s += step) {
        u64 start = s == 0 ? 0 : wl_ld32(in + ends_at + 4 * (s - 1));
        u64 end = wl_ld32(in + ends_at + 4 * s);
        if (start > end || end > bits_len || (start & 3) != 0 || (end & 3) != 0) return 2;
        if (s + 1 == nseg && end != bits_len) return 2;
        const u8* w = bits + start;
        const u8* w_end = bits + end;
        u64 buf = 0, used = 0;
        u32 have = 0;
        u64 i = s << S, b = i + seg < out_len ? i + seg : out_len;
        u32 acc = 0;
        for (; i < b; ++i) {
            if (have < 32) {
                u64 v = 0;
                if (w < w_end) {
                    v = wl_huff_word(w, in_aligned);
                    w += 4;
                }
                buf |= v << have;
                have += 32;
            }
            int code = 0, first = 0, index = 0, len = 0;
#pragma unroll
            for (int l = 1; l <= WL_HUFF_MAX_LEN; ++l) {
                code |= (int)(buf & 1);
                buf >>= 1;
                int c = cnt[l];
                if (code - c < first) {
                    len = l;
                    break;
                }
                index += c;
                first += c;
                first <<= 1;
                code <<= 1;
            }
            if (len == 0) return 3;
            have -= (u32)len;
            used += (u64)len;
            u8 sym = syms[index + (code - first)];
            if (out_aligned) {
                acc |= (u32)sym << (8 * (i & 3));
                if ((i & 3) == 3) {
                    *(u32*)(out + i - 3) = acc;
                    acc = 0;
                }
            } else {
                out[i] = sym;
            }
        }
        if (out_aligned)
            for (u64 k = b & ~3ull; k < b; ++k) out[k] = (u8)(acc >> (8 * (k & 3)));
        if (used > 8 * (end - start)) return 4;
    }
    return 0;
}

extern "C" __global__ void wl_huff_decode(const u64* in_ptrs, const u64* in_sizes, const u64* out_ptrs,
                                          const u64* out_lens, u64* out_sizes, u32* statuses, u32 n) {
    for (u32 j = blockIdx.x; j < n; j += gridDim.x) {
        if (threadIdx.x == 0) out_sizes[j] = out_lens[j];
        u32 st = wl_huff_segments((const u8*)in_ptrs[j], in_sizes[j], (u8*)out_ptrs[j], out_lens[j], threadIdx.x,
                                  blockDim.x);
        if (st != 0) statuses[j] = st;
    }
}
