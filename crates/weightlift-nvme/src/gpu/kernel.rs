//! The CUDA kernel that drives NVMe queues from the GPU, and the structures it shares with the host. The kernel is
//! compiled at run time by NVRTC after a prelude of `#define`s generated from this crate's constants (opcodes,
//! entry sizes, page size, structure sizes checked by `static_assert`), so the two sides cannot drift apart.
//!
//! One thread block owns one queue pair. Per round, thread 0 claims a batch of commands from a global counter;
//! the block's threads each build one submission entry in queue memory (pinned host memory mapped into the
//! device's address space) with volatile stores and `__threadfence_system`; thread 0 rings the SQ tail doorbell,
//! polls completion phase tags, rings the CQ head doorbell; then the whole block copies each completed slot's data
//! to its place in the destination. The bookkeeping is `queue::SqRing`/`CqRing`/`SlotPool` transcribed; the PRPs
//! come from per-slot tables built on the host by `prp::SlotPrps` (PRP2 chosen by length as `SlotPrps::select`
//! does).

use crate::spec::{CQE_BYTES, IoOpcode, PAGE_SIZE, SQE_BYTES};

/// Most slots (commands in flight) per queue pair: the kernel keeps per-slot state in shared memory.
pub const MAX_SLOTS: u32 = 1024;

/// Why a kernel stopped early (`Outcome::failed`).
pub const FAIL_STATUS: u32 = 1;
pub const FAIL_TIMEOUT: u32 = 2;
pub const FAIL_ABORTED: u32 = 3;
pub const FAIL_BAD_COMPLETION: u32 = 4;

/// Per queue pair, in mapped host memory: where everything is, and the ring state in and out.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QpDesc {
    pub sq: u64,
    pub cq: u64,
    pub sq_doorbell: u64,
    pub cq_doorbell: u64,
    /// Device address of slot 0's data (the kernel copies from here).
    pub slot_data: u64,
    /// Device address of this queue's `SlotPrp` table.
    pub slot_prp: u64,
    pub slot_stride: u64,
    pub entries: u32,
    pub slots: u32,
    pub qid: u32,
    pub sq_tail: u32,
    pub sq_head: u32,
    pub cq_head: u32,
    pub cq_phase: u32,
    pub submitted: u32,
}

/// `prp::SlotPrps` as the kernel reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SlotPrp {
    pub prp1: u64,
    pub page2: u64,
    pub list: u64,
    pub first: u64,
}

/// One read command, in device memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GpuCmd {
    pub slba: u64,
    pub dest: u64,
    pub nlb: u32,
    pub skip: u32,
    pub len: u32,
    pub bytes: u32,
}

/// Shared by all blocks, in device memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Control {
    pub next_cmd: u32,
    pub failed: u32,
    pub completed: u64,
}

/// The first failure, in mapped host memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Outcome {
    pub failed: u32,
    pub qp: u32,
    pub cmd: u32,
    pub status: u32,
    pub cid: u32,
    pub pad: u32,
}

/// The kernel's name in [`KERNEL_SOURCE`].
pub const KERNEL_NAME: &str = "wl_nvme_read";

/// The CUDA C source of the kernel (without the generated prelude: see [`kernel_source`]).
pub const KERNEL_SOURCE: &str = r#"
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

struct QpDesc {
    u64 sq, cq, sq_doorbell, cq_doorbell, slot_data, slot_prp, slot_stride;
    u32 entries, slots, qid, sq_tail, sq_head, cq_head, cq_phase, submitted;
};
struct SlotPrp { u64 prp1, page2, list, first; };
struct Cmd { u64 slba, dest; u32 nlb, skip, len, bytes; };
struct Control { u32 next_cmd, failed; u64 completed; };
struct Outcome { u32 failed, qp, cmd, status, cid, pad; };

static_assert(sizeof(QpDesc) == WL_QPDESC_BYTES, "QpDesc layout differs from the host's");
static_assert(sizeof(SlotPrp) == WL_SLOTPRP_BYTES, "SlotPrp layout differs from the host's");
static_assert(sizeof(Cmd) == WL_CMD_BYTES, "Cmd layout differs from the host's");
static_assert(sizeof(Control) == WL_CONTROL_BYTES, "Control layout differs from the host's");
static_assert(sizeof(Outcome) == WL_OUTCOME_BYTES, "Outcome layout differs from the host's");

__device__ __forceinline__ u64 wl_now() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Slot data changes between commands behind the GPU's back (written by the controller into host memory, or by a
// copy engine into device memory): loads bypass L1, and for host memory any cached line.
__device__ __forceinline__ void wl_load16(const u8* p, u32 host, u64* a, u64* b) {
    if (host) asm volatile("ld.global.cv.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
    else asm volatile("ld.global.cg.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
}

__device__ __forceinline__ u8 wl_load1(const u8* p, u32 host) {
    u32 v;
    if (host) asm volatile("ld.global.cv.u8 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    else asm volatile("ld.global.cg.u8 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return (u8)v;
}

// The whole block copies n bytes; 16 bytes at a time where source and destination share their alignment.
__device__ void wl_copy(u8* dst, const u8* src, u64 n, u32 host) {
    u64 t = threadIdx.x, nt = blockDim.x, head = n, body = 0;
    if ((((u64)dst) & 15) == (((u64)src) & 15)) {
        head = (16 - (((u64)dst) & 15)) & 15;
        if (head > n) head = n;
        body = (n - head) / 16;
    }
    for (u64 i = t; i < head; i += nt) dst[i] = wl_load1(src + i, host);
    for (u64 i = t; i < body; i += nt) {
        u64 a, b;
        wl_load16(src + head + 16 * i, host, &a, &b);
        u64* d = (u64*)(dst + head + 16 * i);
        d[0] = a;
        d[1] = b;
    }
    for (u64 i = head + body * 16 + t; i < n; i += nt) dst[i] = wl_load1(src + i, host);
}

// The first failure wins; its details are written before the flag the host reads.
__device__ void wl_fail(Control* ctl, volatile Outcome* out, u32 code, u32 qp, u32 cmd, u32 status, u32 cid) {
    if (atomicCAS(&ctl->failed, 0u, code) == 0u) {
        out->qp = qp;
        out->cmd = cmd;
        out->status = status;
        out->cid = cid;
        __threadfence_system();
        out->failed = code;
    }
}

extern "C" __global__ void wl_nvme_read(u64 qps, u64 cmds_ptr, u32 ncmds, u64 dest_ptr, u64 ctl_ptr, u64 out_ptr,
                                        u64 abort_ptr, u32 nsid, u64 timeout_ns, u32 batch, u32 host_slots) {
    volatile QpDesc* qd = (volatile QpDesc*)qps + blockIdx.x;
    const Cmd* cmds = (const Cmd*)cmds_ptr;
    u8* dest = (u8*)dest_ptr;
    Control* ctl = (Control*)ctl_ptr;
    volatile Outcome* out = (volatile Outcome*)out_ptr;
    volatile u32* abort_flag = (volatile u32*)abort_ptr;
    const u32 t = threadIdx.x;

    __shared__ u64 s_sq, s_cq, s_data, s_stride;
    __shared__ volatile u32* s_sqdb;
    __shared__ volatile u32* s_cqdb;
    __shared__ const SlotPrp* s_prp;
    __shared__ u32 s_entries, s_slots, s_tail, s_sq_head, s_cq_head, s_phase;
    __shared__ u32 s_inflight, s_nfree, s_exhausted, s_stop, s_quit, s_claimed, s_base, s_ndone, s_submitted;
    __shared__ u64 s_completed;
    __shared__ u16 s_free[WL_MAX_SLOTS];
    __shared__ u32 s_cmd_of[WL_MAX_SLOTS];
    __shared__ u32 s_done[WL_MAX_SLOTS];

    if (t == 0) {
        s_sq = qd->sq;
        s_cq = qd->cq;
        s_sqdb = (volatile u32*)qd->sq_doorbell;
        s_cqdb = (volatile u32*)qd->cq_doorbell;
        s_data = qd->slot_data;
        s_prp = (const SlotPrp*)qd->slot_prp;
        s_stride = qd->slot_stride;
        s_entries = qd->entries;
        s_slots = qd->slots < WL_MAX_SLOTS ? qd->slots : WL_MAX_SLOTS;
        if (s_slots > s_entries - 1) s_slots = s_entries - 1;
        s_tail = qd->sq_tail;
        s_sq_head = qd->sq_head;
        s_cq_head = qd->cq_head;
        s_phase = qd->cq_phase & 1;
        s_inflight = 0;
        s_nfree = s_slots;
        s_exhausted = 0;
        s_stop = 0;
        s_quit = 0;
        s_submitted = 0;
        s_completed = 0;
    }
    __syncthreads();
    for (u32 i = t; i < s_slots; i += blockDim.x) s_free[i] = (u16)i;
    __syncthreads();

    for (;;) {
        // Claim a batch of commands (SqRing::push and SlotPool::take: one free slot per command, and a queue never
        // holds more than entries - 1).
        if (t == 0) {
            s_claimed = 0;
            if (!s_exhausted && !s_stop) {
                if (*(volatile u32*)&ctl->failed != 0 || *abort_flag != 0) {
                    s_stop = 1;
                } else {
                    u32 want = s_nfree < batch ? s_nfree : batch;
                    if (want > 0) {
                        u32 b = atomicAdd(&ctl->next_cmd, want);
                        if (b >= ncmds) {
                            s_exhausted = 1;
                        } else {
                            s_claimed = ncmds - b < want ? ncmds - b : want;
                            s_base = b;
                            if (b + s_claimed >= ncmds) s_exhausted = 1;
                        }
                    }
                }
            }
        }
        __syncthreads();
        const u32 claimed = s_claimed;
        for (u32 i = t; i < claimed; i += blockDim.x) {
            const u32 slot = s_free[s_nfree - 1 - i];
            const u32 ci = s_base + i;
            s_cmd_of[slot] = ci;
            const Cmd c = cmds[ci];
            const SlotPrp p = s_prp[slot];
            // SlotPrps::select: no PRP2 within the first page, the next page for one more, else the slot's list.
            const u64 prp2 = c.bytes <= p.first ? 0ull : (c.bytes <= p.first + WL_PAGE ? p.page2 : p.list);
            volatile u32* e = (volatile u32*)(s_sq + (u64)((s_tail + i) % s_entries) * WL_SQE_BYTES);
            e[0] = WL_OPC_READ | (slot << 16);
            e[1] = nsid;
            e[2] = 0;
            e[3] = 0;
            e[4] = 0;
            e[5] = 0;
            e[6] = (u32)p.prp1;
            e[7] = (u32)(p.prp1 >> 32);
            e[8] = (u32)prp2;
            e[9] = (u32)(prp2 >> 32);
            e[10] = (u32)c.slba;
            e[11] = (u32)(c.slba >> 32);
            e[12] = c.nlb - 1;
            e[13] = 0;
            e[14] = 0;
            e[15] = 0;
            __threadfence_system();
        }
        __syncthreads();
        if (t == 0 && claimed > 0) {
            s_nfree -= claimed;
            s_inflight += claimed;
            s_submitted += claimed;
            s_tail = (s_tail + claimed) % s_entries;
            // Every entry is visible to the controller before the doorbell that announces it.
            __threadfence_system();
            *s_sqdb = s_tail;
        }
        __syncthreads();
        const u32 inflight = s_inflight;
        const u32 finished = s_exhausted | s_stop;
        __syncthreads();
        if (inflight == 0) {
            if (finished) break;
            continue;
        }

        // Poll the completion queue (CqRing::is_new / advance) until at least one command is done.
        if (t == 0) {
            u32 n = 0;
            u64 start = wl_now();
            for (;;) {
                volatile u32* cqe = (volatile u32*)(s_cq + (u64)s_cq_head * WL_CQE_BYTES);
                const u32 dw3 = cqe[3];
                if (((dw3 >> 16) & 1) == s_phase) {
                    // Order the phase tag's load before the loads of the entry and of the data it announces.
                    __threadfence_system();
                    s_sq_head = cqe[2] & 0xffff;
                    s_done[n++] = (dw3 & 0xffff) | ((dw3 >> 17) << 16);
                    if (++s_cq_head == s_entries) {
                        s_cq_head = 0;
                        s_phase ^= 1;
                    }
                    if (n == s_inflight) break;
                    continue;
                }
                if (n > 0) break;
                if (*abort_flag != 0) {
                    wl_fail(ctl, out, WL_FAIL_ABORTED, blockIdx.x, 0, 0, 0);
                    s_quit = 1;
                    break;
                }
                if (wl_now() - start > timeout_ns) {
                    wl_fail(ctl, out, WL_FAIL_TIMEOUT, blockIdx.x, 0, 0, 0);
                    s_quit = 1;
                    break;
                }
            }
            s_ndone = n;
            if (n > 0) {
                __threadfence_system();
                *s_cqdb = s_cq_head;
            }
        }
        __syncthreads();
        const u32 ndone = s_ndone;
        const u32 quit = s_quit;
        // Everyone has read the flags before thread 0 may change them again.
        __syncthreads();
        if (quit) break;

        // Consume: check each status, copy each good slot to its place, then free the slots.
        for (u32 d = 0; d < ndone; d++) {
            const u32 v = s_done[d];
            const u32 cid = v & 0xffff, status = v >> 16;
            if (cid >= s_slots) {
                if (t == 0) {
                    wl_fail(ctl, out, WL_FAIL_BAD_COMPLETION, blockIdx.x, 0, status, cid);
                    s_quit = 1;
                }
                continue;
            }
            const u32 ci = s_cmd_of[cid];
            if ((status & 0x7ff) != 0) {
                if (t == 0) {
                    wl_fail(ctl, out, WL_FAIL_STATUS, blockIdx.x, ci, status, cid);
                    s_stop = 1;
                }
            } else {
                const Cmd c = cmds[ci];
                wl_copy(dest + c.dest, (const u8*)(s_data + (u64)cid * s_stride) + c.skip, c.len, host_slots);
            }
            __syncthreads();
        }
        if (t == 0) {
            for (u32 d = 0; d < ndone; d++) {
                const u32 cid = s_done[d] & 0xffff;
                if (cid < s_slots) {
                    s_free[s_nfree++] = (u16)cid;
                    s_inflight--;
                    s_completed++;
                }
            }
        }
        __syncthreads();
        if (s_quit) break;
    }

    if (t == 0) {
        qd->sq_tail = s_tail;
        qd->sq_head = s_sq_head;
        qd->cq_head = s_cq_head;
        qd->cq_phase = s_phase;
        qd->submitted = s_submitted;
        atomicAdd((unsigned long long*)&ctl->completed, (unsigned long long)s_completed);
    }
}
"#;

/// The kernel's full source: `#define`s generated from this crate's constants, then [`KERNEL_SOURCE`].
pub fn kernel_source() -> String {
    let defines = [
        ("WL_PAGE", PAGE_SIZE as u64),
        ("WL_SQE_BYTES", SQE_BYTES as u64),
        ("WL_CQE_BYTES", CQE_BYTES as u64),
        ("WL_OPC_READ", IoOpcode::Read as u64),
        ("WL_MAX_SLOTS", u64::from(MAX_SLOTS)),
        ("WL_FAIL_STATUS", u64::from(FAIL_STATUS)),
        ("WL_FAIL_TIMEOUT", u64::from(FAIL_TIMEOUT)),
        ("WL_FAIL_ABORTED", u64::from(FAIL_ABORTED)),
        ("WL_FAIL_BAD_COMPLETION", u64::from(FAIL_BAD_COMPLETION)),
        ("WL_QPDESC_BYTES", std::mem::size_of::<QpDesc>() as u64),
        ("WL_SLOTPRP_BYTES", std::mem::size_of::<SlotPrp>() as u64),
        ("WL_CMD_BYTES", std::mem::size_of::<GpuCmd>() as u64),
        ("WL_CONTROL_BYTES", std::mem::size_of::<Control>() as u64),
        ("WL_OUTCOME_BYTES", std::mem::size_of::<Outcome>() as u64),
    ];
    let mut s = String::from("// Generated by weightlift-nvme from its Rust constants.\n");
    for (name, value) in defines {
        s.push_str(&format!("#define {name} {value}u\n"));
    }
    s.push_str(KERNEL_SOURCE);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prelude_defines_what_the_source_uses() {
        let src = kernel_source();
        for word in src.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("WL_")) {
            assert!(src.contains(&format!("#define {word} ")), "{word} is used but not defined");
        }
        assert!(src.contains(&format!("__global__ void {KERNEL_NAME}(")));
        assert_eq!(std::mem::size_of::<QpDesc>(), 88);
        assert_eq!(std::mem::size_of::<GpuCmd>(), 32);
    }
}
