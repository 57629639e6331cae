//! Controller registers at their BAR0 offsets, and the doorbells that follow them.

/// Register offsets in BAR0.
pub mod reg {
    /// Controller Capabilities (64-bit).
    pub const CAP: usize = 0x00;
    /// Version.
    pub const VS: usize = 0x08;
    /// Interrupt Mask Set (unused: weightlift polls).
    pub const INTMS: usize = 0x0C;
    /// Interrupt Mask Clear (unused: weightlift polls).
    pub const INTMC: usize = 0x10;
    /// Controller Configuration.
    pub const CC: usize = 0x14;
    /// Controller Status.
    pub const CSTS: usize = 0x1C;
    /// Admin Queue Attributes.
    pub const AQA: usize = 0x24;
    /// Admin Submission Queue Base Address (64-bit).
    pub const ASQ: usize = 0x28;
    /// Admin Completion Queue Base Address (64-bit).
    pub const ACQ: usize = 0x30;
}

/// Where the doorbell registers start.
pub const DOORBELL_BASE: usize = 0x1000;

/// Offset of queue `qid`'s Submission Queue Tail doorbell: 0x1000 + (2 * qid) * (4 << DSTRD).
pub fn sq_tail_doorbell(qid: u16, dstrd: u8) -> usize {
    DOORBELL_BASE + 2 * usize::from(qid) * (4usize << (dstrd & 0xF))
}

/// Offset of queue `qid`'s Completion Queue Head doorbell: 0x1000 + (2 * qid + 1) * (4 << DSTRD).
pub fn cq_head_doorbell(qid: u16, dstrd: u8) -> usize {
    DOORBELL_BASE + (2 * usize::from(qid) + 1) * (4usize << (dstrd & 0xF))
}

fn bits64(v: u64, lo: u32, width: u32) -> u64 {
    (v >> lo) & ((1u64 << width) - 1)
}

fn bits32(v: u32, lo: u32, width: u32) -> u32 {
    (v >> lo) & ((1u32 << width) - 1)
}

fn set32(v: u32, lo: u32, width: u32, field: u32) -> u32 {
    let mask = ((1u32 << width) - 1) << lo;
    (v & !mask) | ((field << lo) & mask)
}

/// Controller Capabilities.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cap(pub u64);

impl Cap {
    /// Maximum Queue Entries Supported, as an entry count (the field is 0's based).
    pub fn max_queue_entries(self) -> u32 {
        bits64(self.0, 0, 16) as u32 + 1
    }
    /// Contiguous Queues Required.
    pub fn cqr(self) -> bool {
        bits64(self.0, 16, 1) == 1
    }
    /// Timeout: worst-case time to become ready, in 500 ms units.
    pub fn to(self) -> u8 {
        bits64(self.0, 24, 8) as u8
    }
    /// Doorbell Stride: doorbells are 4 << DSTRD bytes apart.
    pub fn dstrd(self) -> u8 {
        bits64(self.0, 32, 4) as u8
    }
    /// Whether the NVM command set is supported (CSS bit 0, CAP bit 37).
    pub fn nvm_command_set(self) -> bool {
        bits64(self.0, 37, 1) == 1
    }
    /// Memory Page Size Minimum: 2 ^ (12 + MPSMIN) bytes.
    pub fn mpsmin(self) -> u8 {
        bits64(self.0, 48, 4) as u8
    }
    /// Memory Page Size Maximum.
    pub fn mpsmax(self) -> u8 {
        bits64(self.0, 52, 4) as u8
    }

    /// A CAP value from its fields (as a controller reports them).
    pub fn new(max_queue_entries: u32, cqr: bool, to: u8, dstrd: u8, mpsmin: u8, mpsmax: u8) -> Cap {
        let mqes = u64::from(max_queue_entries.clamp(2, 65536) - 1);
        Cap(mqes
            | (u64::from(cqr) << 16)
            | (u64::from(to) << 24)
            | (u64::from(dstrd & 0xF) << 32)
            | (1u64 << 37)
            | (u64::from(mpsmin & 0xF) << 48)
            | (u64::from(mpsmax & 0xF) << 52))
    }
}

/// Version (VS): major in bits 31:16, minor in 15:8, tertiary in 7:0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Version(pub u32);

impl Version {
    /// NVMe 2.0.0.
    pub const V2_0: Version = Version(0x0002_0000);
    /// Major version (bits 31:16).
    pub fn major(self) -> u16 {
        (self.0 >> 16) as u16
    }
    /// Minor version (bits 15:8).
    pub fn minor(self) -> u8 {
        (self.0 >> 8) as u8
    }
    /// Tertiary version (bits 7:0).
    pub fn tertiary(self) -> u8 {
        self.0 as u8
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major(), self.minor(), self.tertiary())
    }
}

/// Controller Configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cc(pub u32);

impl Cc {
    /// Enable.
    pub fn en(self) -> bool {
        self.0 & 1 == 1
    }
    /// I/O Command Set Selected (0: NVM).
    pub fn css(self) -> u8 {
        bits32(self.0, 4, 3) as u8
    }
    /// Memory Page Size: 2 ^ (12 + MPS).
    pub fn mps(self) -> u8 {
        bits32(self.0, 7, 4) as u8
    }
    /// Arbitration Mechanism Selected.
    pub fn ams(self) -> u8 {
        bits32(self.0, 11, 3) as u8
    }
    /// Shutdown Notification.
    pub fn shn(self) -> u8 {
        bits32(self.0, 14, 2) as u8
    }
    /// I/O Submission Queue Entry Size, log2 bytes.
    pub fn iosqes(self) -> u8 {
        bits32(self.0, 16, 4) as u8
    }
    /// I/O Completion Queue Entry Size, log2 bytes.
    pub fn iocqes(self) -> u8 {
        bits32(self.0, 20, 4) as u8
    }

    /// The same configuration with Enable set to `en`.
    pub fn with_en(self, en: bool) -> Cc {
        Cc(set32(self.0, 0, 1, u32::from(en)))
    }

    /// The configuration weightlift enables a controller with: NVM command set, 4 KiB pages, round robin, 64-byte
    /// submission and 16-byte completion entries.
    pub fn weightlift() -> Cc {
        let mut v = set32(0, 4, 3, 0);
        v = set32(v, 7, 4, 0);
        v = set32(v, 11, 3, 0);
        v = set32(v, 16, 4, 6);
        v = set32(v, 20, 4, 4);
        Cc(v)
    }
}

/// Controller Status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Csts(pub u32);

impl Csts {
    /// Ready bit (0).
    pub const RDY: u32 = 1;
    /// Controller Fatal Status bit (1).
    pub const CFS: u32 = 1 << 1;
    /// Ready.
    pub fn rdy(self) -> bool {
        self.0 & Self::RDY != 0
    }
    /// Controller Fatal Status.
    pub fn cfs(self) -> bool {
        self.0 & Self::CFS != 0
    }
    /// Shutdown Status (2: complete).
    pub fn shst(self) -> u8 {
        bits32(self.0, 2, 2) as u8
    }
}

/// Admin Queue Attributes: admin SQ size in bits 11:0, CQ size in bits 27:16, both 0's based.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Aqa(pub u32);

impl Aqa {
    /// From entry counts (2..=4096 each).
    pub fn new(sq_entries: u16, cq_entries: u16) -> Option<Aqa> {
        let ok = |n: u16| (2..=4096).contains(&n);
        (ok(sq_entries) && ok(cq_entries)).then(|| Aqa(u32::from(sq_entries - 1) | (u32::from(cq_entries - 1) << 16)))
    }
    /// Admin Submission Queue entries (1-based).
    pub fn sq_entries(self) -> u32 {
        bits32(self.0, 0, 12) + 1
    }
    /// Admin Completion Queue entries (1-based).
    pub fn cq_entries(self) -> u32 {
        bits32(self.0, 16, 12) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_offsets_are_the_specs() {
        assert_eq!(
            [reg::CAP, reg::VS, reg::INTMS, reg::INTMC, reg::CC, reg::CSTS, reg::AQA, reg::ASQ, reg::ACQ],
            [0x00, 0x08, 0x0C, 0x10, 0x14, 0x1C, 0x24, 0x28, 0x30]
        );
    }

    #[test]
    fn doorbells_follow_the_stride() {
        // DSTRD 0: 4-byte doorbells, SQ0 tail at 0x1000, CQ0 head at 0x1004, SQ1 tail at 0x1008.
        assert_eq!(sq_tail_doorbell(0, 0), 0x1000);
        assert_eq!(cq_head_doorbell(0, 0), 0x1004);
        assert_eq!(sq_tail_doorbell(1, 0), 0x1008);
        assert_eq!(cq_head_doorbell(1, 0), 0x100C);
        // DSTRD 2: 16 bytes apart.
        assert_eq!(sq_tail_doorbell(3, 2), 0x1000 + 6 * 16);
        assert_eq!(cq_head_doorbell(3, 2), 0x1000 + 7 * 16);
    }

    #[test]
    fn cap_fields() {
        let cap = Cap::new(1024, true, 20, 2, 0, 4);
        assert_eq!(cap.0 & 0xFFFF, 1023);
        assert_eq!(cap.max_queue_entries(), 1024);
        assert!(cap.cqr() && cap.nvm_command_set());
        assert_eq!((cap.to(), cap.dstrd(), cap.mpsmin(), cap.mpsmax()), (20, 2, 0, 4));
        assert_eq!((cap.0 >> 32) & 0xF, 2);
        assert_eq!((cap.0 >> 37) & 1, 1);
    }

    #[test]
    fn cc_aqa_csts() {
        let cc = Cc::weightlift().with_en(true);
        assert_eq!(cc.0, 1 | (6 << 16) | (4 << 20));
        assert!(cc.en());
        assert_eq!((cc.iosqes(), cc.iocqes(), cc.mps(), cc.css(), cc.shn()), (6, 4, 0, 0, 0));
        assert!(!cc.with_en(false).en());
        let aqa = Aqa::new(32, 64).unwrap();
        assert_eq!(aqa.0, 31 | (63 << 16));
        assert_eq!((aqa.sq_entries(), aqa.cq_entries()), (32, 64));
        assert!(Aqa::new(1, 2).is_none() && Aqa::new(2, 4097).is_none());
        let csts = Csts(Csts::RDY | Csts::CFS | (2 << 2));
        assert!(csts.rdy() && csts.cfs());
        assert_eq!(csts.shst(), 2);
        assert_eq!(Version::V2_0.to_string(), "2.0.0");
    }
}
