//! Submission queue entries (64 bytes), the opcodes weightlift uses, and the typed commands a controller decodes
//! from them.

use std::fmt;

use super::bytes::{le_u32, le_u64, put};
use super::status::Status;

/// Size of a submission queue entry (CC.IOSQES = 6).
pub const SQE_BYTES: usize = 64;

/// Feature Identifier of "Number of Queues" (Get/Set Features).
pub const FEATURE_NUMBER_OF_QUEUES: u8 = 0x07;

/// NVM command set I/O opcodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum IoOpcode {
    /// Commit volatile write cache contents to the medium.
    Flush = 0x00,
    /// Write logical blocks from host (or device) memory.
    Write = 0x01,
    /// Read logical blocks into memory.
    Read = 0x02,
}

impl IoOpcode {
    /// The opcode with value `v`, if it is one of these.
    pub fn from_u8(v: u8) -> Option<IoOpcode> {
        Some(match v {
            0x00 => IoOpcode::Flush,
            0x01 => IoOpcode::Write,
            0x02 => IoOpcode::Read,
            _ => return None,
        })
    }
}

impl fmt::Display for IoOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoOpcode::Flush => "flush",
            IoOpcode::Write => "write",
            IoOpcode::Read => "read",
        })
    }
}

/// Admin command opcodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AdminOpcode {
    /// Delete I/O Submission Queue.
    DeleteIoSq = 0x00,
    /// Create I/O Submission Queue.
    CreateIoSq = 0x01,
    /// Delete I/O Completion Queue.
    DeleteIoCq = 0x04,
    /// Create I/O Completion Queue.
    CreateIoCq = 0x05,
    /// Identify (controller or namespace data structures).
    Identify = 0x06,
    /// Set Features.
    SetFeatures = 0x09,
    /// Get Features.
    GetFeatures = 0x0A,
}

impl AdminOpcode {
    /// The opcode with value `v`, if it is one of these.
    pub fn from_u8(v: u8) -> Option<AdminOpcode> {
        Some(match v {
            0x00 => AdminOpcode::DeleteIoSq,
            0x01 => AdminOpcode::CreateIoSq,
            0x04 => AdminOpcode::DeleteIoCq,
            0x05 => AdminOpcode::CreateIoCq,
            0x06 => AdminOpcode::Identify,
            0x09 => AdminOpcode::SetFeatures,
            0x0A => AdminOpcode::GetFeatures,
            _ => return None,
        })
    }

    /// The command's name as the specification spells it ("Create I/O Completion Queue").
    pub fn name(self) -> &'static str {
        match self {
            AdminOpcode::DeleteIoSq => "Delete I/O Submission Queue",
            AdminOpcode::CreateIoSq => "Create I/O Submission Queue",
            AdminOpcode::DeleteIoCq => "Delete I/O Completion Queue",
            AdminOpcode::CreateIoCq => "Create I/O Completion Queue",
            AdminOpcode::Identify => "Identify",
            AdminOpcode::SetFeatures => "Set Features",
            AdminOpcode::GetFeatures => "Get Features",
        }
    }
}

/// A submission queue entry, field by field. Bytes 0-3 CDW0 (opcode 7:0, FUSE 9:8, PSDT 15:14, CID 31:16),
/// 4-7 NSID, 8-15 CDW2-3, 16-23 MPTR, 24-31 PRP1, 32-39 PRP2, 40-63 CDW10-15.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubmissionEntry {
    /// Opcode, CDW0 bits 7:0 (an [`IoOpcode`] or [`AdminOpcode`] value).
    pub opcode: u8,
    /// Fused operation, CDW0 bits 9:8.
    pub fuse: u8,
    /// PRP or SGL for Data Transfer, CDW0 bits 15:14 (0: PRPs).
    pub psdt: u8,
    /// Command Identifier, CDW0 bits 31:16: unique among the queue's commands in flight, echoed in the completion.
    pub cid: u16,
    /// Namespace Identifier (0 where the command concerns none).
    pub nsid: u32,
    /// Command Dword 2 (command-specific).
    pub cdw2: u32,
    /// Command Dword 3 (command-specific).
    pub cdw3: u32,
    /// Metadata Pointer (unused by weightlift: namespaces without metadata).
    pub mptr: u64,
    /// PRP Entry 1: bus address of the data (or its first page).
    pub prp1: u64,
    /// PRP Entry 2: the second page, or the bus address of a PRP list (see [`crate::prp`]).
    pub prp2: u64,
    /// Command Dword 10 (for Read and Write: the starting LBA's low 32 bits).
    pub cdw10: u32,
    /// Command Dword 11 (for Read and Write: the starting LBA's high 32 bits).
    pub cdw11: u32,
    /// Command Dword 12 (for Read and Write: the number of blocks, 0's based, in bits 15:0).
    pub cdw12: u32,
    /// Command Dword 13 (command-specific).
    pub cdw13: u32,
    /// Command Dword 14 (command-specific).
    pub cdw14: u32,
    /// Command Dword 15 (command-specific).
    pub cdw15: u32,
}

impl SubmissionEntry {
    /// Command Dword 0 as encoded: opcode, FUSE, PSDT and CID in their bits.
    pub fn cdw0(&self) -> u32 {
        u32::from(self.opcode)
            | (u32::from(self.fuse & 0x3) << 8)
            | (u32::from(self.psdt & 0x3) << 14)
            | (u32::from(self.cid) << 16)
    }

    /// The entry as its sixteen dwords, in order.
    pub fn to_dwords(&self) -> [u32; 16] {
        [
            self.cdw0(),
            self.nsid,
            self.cdw2,
            self.cdw3,
            self.mptr as u32,
            (self.mptr >> 32) as u32,
            self.prp1 as u32,
            (self.prp1 >> 32) as u32,
            self.prp2 as u32,
            (self.prp2 >> 32) as u32,
            self.cdw10,
            self.cdw11,
            self.cdw12,
            self.cdw13,
            self.cdw14,
            self.cdw15,
        ]
    }

    /// The entry the sixteen dwords `d` encode (the inverse of [`SubmissionEntry::to_dwords`]).
    pub fn from_dwords(d: [u32; 16]) -> SubmissionEntry {
        let q = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
        SubmissionEntry {
            opcode: d[0] as u8,
            fuse: ((d[0] >> 8) & 0x3) as u8,
            psdt: ((d[0] >> 14) & 0x3) as u8,
            cid: (d[0] >> 16) as u16,
            nsid: d[1],
            cdw2: d[2],
            cdw3: d[3],
            mptr: q(d[4], d[5]),
            prp1: q(d[6], d[7]),
            prp2: q(d[8], d[9]),
            cdw10: d[10],
            cdw11: d[11],
            cdw12: d[12],
            cdw13: d[13],
            cdw14: d[14],
            cdw15: d[15],
        }
    }

    /// The entry's 64 bytes as a controller reads them from the queue (little-endian dwords).
    pub fn to_bytes(&self) -> [u8; SQE_BYTES] {
        let mut b = [0u8; SQE_BYTES];
        for (i, d) in self.to_dwords().iter().enumerate() {
            put(&mut b, i * 4, &d.to_le_bytes());
        }
        b
    }

    /// The entry encoded in the 64 bytes `b` (the inverse of [`SubmissionEntry::to_bytes`]).
    pub fn from_bytes(b: &[u8; SQE_BYTES]) -> SubmissionEntry {
        let mut d = [0u32; 16];
        for (i, w) in d.iter_mut().enumerate() {
            *w = le_u32(b, i * 4);
        }
        let e = SubmissionEntry::from_dwords(d);
        debug_assert_eq!(e.prp1, le_u64(b, 24));
        e
    }

    /// Read or Write of `nlb` blocks (1..=65536) from `slba`; the PRPs describe the data buffer.
    pub fn rw(op: IoOpcode, cid: u16, nsid: u32, slba: u64, nlb: u32, prp1: u64, prp2: u64) -> Option<Self> {
        if !matches!(op, IoOpcode::Read | IoOpcode::Write) || nlb == 0 || nlb > 1 << 16 {
            return None;
        }
        Some(SubmissionEntry {
            opcode: op as u8,
            cid,
            nsid,
            prp1,
            prp2,
            cdw10: slba as u32,
            cdw11: (slba >> 32) as u32,
            // NLB is 0's based.
            cdw12: nlb - 1,
            ..Default::default()
        })
    }

    /// Flush of namespace `nsid`.
    pub fn flush(cid: u16, nsid: u32) -> SubmissionEntry {
        SubmissionEntry { opcode: IoOpcode::Flush as u8, cid, nsid, ..Default::default() }
    }

    /// Identify with Controller or Namespace Structure `cns` into the 4 KiB page at `prp1`.
    pub fn identify(cid: u16, cns: u8, nsid: u32, prp1: u64) -> SubmissionEntry {
        SubmissionEntry {
            opcode: AdminOpcode::Identify as u8,
            cid,
            nsid,
            prp1,
            cdw10: u32::from(cns),
            ..Default::default()
        }
    }

    /// Create I/O Completion Queue `qid` of `entries` (2..=65536) contiguous entries at `prp1`, interrupts off.
    pub fn create_io_cq(cid: u16, qid: u16, entries: u32, prp1: u64) -> SubmissionEntry {
        SubmissionEntry {
            opcode: AdminOpcode::CreateIoCq as u8,
            cid,
            prp1,
            cdw10: u32::from(qid) | (entries.saturating_sub(1).min(0xFFFF) << 16),
            // PC (physically contiguous) set, IEN clear.
            cdw11: 1,
            ..Default::default()
        }
    }

    /// Create I/O Submission Queue `qid` of `entries` contiguous entries at `prp1`, completing into `cqid`.
    pub fn create_io_sq(cid: u16, qid: u16, entries: u32, cqid: u16, prp1: u64) -> SubmissionEntry {
        SubmissionEntry {
            opcode: AdminOpcode::CreateIoSq as u8,
            cid,
            prp1,
            cdw10: u32::from(qid) | (entries.saturating_sub(1).min(0xFFFF) << 16),
            cdw11: 1 | (u32::from(cqid) << 16),
            ..Default::default()
        }
    }

    /// Delete I/O Submission Queue `qid`.
    pub fn delete_io_sq(cid: u16, qid: u16) -> SubmissionEntry {
        SubmissionEntry { opcode: AdminOpcode::DeleteIoSq as u8, cid, cdw10: u32::from(qid), ..Default::default() }
    }

    /// Delete I/O Completion Queue `qid` (its submission queues first).
    pub fn delete_io_cq(cid: u16, qid: u16) -> SubmissionEntry {
        SubmissionEntry { opcode: AdminOpcode::DeleteIoCq as u8, cid, cdw10: u32::from(qid), ..Default::default() }
    }

    /// Get Features of Feature Identifier `fid` (current value).
    pub fn get_features(cid: u16, fid: u8) -> SubmissionEntry {
        SubmissionEntry { opcode: AdminOpcode::GetFeatures as u8, cid, cdw10: u32::from(fid), ..Default::default() }
    }

    /// Set Features: Feature Identifier `fid` to the value `cdw11` carries.
    pub fn set_features(cid: u16, fid: u8, cdw11: u32) -> SubmissionEntry {
        SubmissionEntry {
            opcode: AdminOpcode::SetFeatures as u8,
            cid,
            cdw10: u32::from(fid),
            cdw11,
            ..Default::default()
        }
    }
}

/// An I/O command as a controller understands it. The fields are the entry's, decoded: `nsid` the namespace,
/// `slba` the first logical block, `nlb` the number of blocks (1-based here), `prp1`/`prp2` the data's PRP entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // the fields: as above
pub enum IoCommand {
    /// Read `nlb` blocks from `slba` into the memory the PRPs describe.
    Read { nsid: u32, slba: u64, nlb: u32, prp1: u64, prp2: u64 },
    /// Write `nlb` blocks at `slba` from the memory the PRPs describe.
    Write { nsid: u32, slba: u64, nlb: u32, prp1: u64, prp2: u64 },
    /// Flush the namespace's volatile write cache.
    Flush { nsid: u32 },
}

/// Decodes an I/O command; the error is the status a controller returns for it.
pub fn parse_io(e: &SubmissionEntry) -> Result<IoCommand, Status> {
    let op = IoOpcode::from_u8(e.opcode).ok_or(Status::INVALID_OPCODE)?;
    if e.fuse != 0 || e.psdt != 0 {
        // Fused operations and SGLs are not supported (Identify Controller says so: FUSES = 0, SGLS = 0).
        return Err(Status::INVALID_FIELD);
    }
    let slba = u64::from(e.cdw10) | (u64::from(e.cdw11) << 32);
    let nlb = (e.cdw12 & 0xFFFF) + 1;
    Ok(match op {
        IoOpcode::Read => IoCommand::Read { nsid: e.nsid, slba, nlb, prp1: e.prp1, prp2: e.prp2 },
        IoOpcode::Write => IoCommand::Write { nsid: e.nsid, slba, nlb, prp1: e.prp1, prp2: e.prp2 },
        IoOpcode::Flush => IoCommand::Flush { nsid: e.nsid },
    })
}

/// An admin command as a controller understands it. The fields are the entry's, decoded: `qid` a queue's id, `cqid`
/// the completion queue a submission queue posts to, `entries` a queue's size (1-based here), `prp1`/`prp2` PRP
/// entries (a queue's memory, or the Identify page), `contiguous` and `interrupts` the PC and IEN flags, `cns` the
/// Controller or Namespace Structure Identify returns, `fid` a Feature Identifier and `cdw11` its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // the fields: as above
pub enum AdminCommand {
    /// Identify: the `cns` structure (of namespace `nsid` where it is one) into the page at `prp1`.
    Identify { cns: u8, nsid: u32, prp1: u64, prp2: u64 },
    /// Create I/O Completion Queue `qid`.
    CreateIoCq { qid: u16, entries: u32, prp1: u64, contiguous: bool, interrupts: bool },
    /// Create I/O Submission Queue `qid`, completing into `cqid`.
    CreateIoSq { qid: u16, entries: u32, cqid: u16, prp1: u64, contiguous: bool },
    /// Delete I/O Submission Queue `qid`.
    DeleteIoSq { qid: u16 },
    /// Delete I/O Completion Queue `qid`.
    DeleteIoCq { qid: u16 },
    /// Get Features `fid`.
    GetFeatures { fid: u8 },
    /// Set Features `fid` to `cdw11`.
    SetFeatures { fid: u8, cdw11: u32 },
}

/// Decodes an admin command; the error is the status a controller returns for it.
pub fn parse_admin(e: &SubmissionEntry) -> Result<AdminCommand, Status> {
    let op = AdminOpcode::from_u8(e.opcode).ok_or(Status::INVALID_OPCODE)?;
    if e.fuse != 0 || e.psdt != 0 {
        return Err(Status::INVALID_FIELD);
    }
    let qid = e.cdw10 as u16;
    // Queue sizes are 0's based: a QSIZE of 0xFFFF asks for 65536 entries.
    let entries = (e.cdw10 >> 16) + 1;
    Ok(match op {
        AdminOpcode::Identify => {
            AdminCommand::Identify { cns: e.cdw10 as u8, nsid: e.nsid, prp1: e.prp1, prp2: e.prp2 }
        }
        AdminOpcode::CreateIoCq => AdminCommand::CreateIoCq {
            qid,
            entries,
            prp1: e.prp1,
            contiguous: e.cdw11 & 1 == 1,
            interrupts: e.cdw11 & 2 == 2,
        },
        AdminOpcode::CreateIoSq => AdminCommand::CreateIoSq {
            qid,
            entries,
            cqid: (e.cdw11 >> 16) as u16,
            prp1: e.prp1,
            contiguous: e.cdw11 & 1 == 1,
        },
        AdminOpcode::DeleteIoSq => AdminCommand::DeleteIoSq { qid },
        AdminOpcode::DeleteIoCq => AdminCommand::DeleteIoCq { qid },
        AdminOpcode::GetFeatures => AdminCommand::GetFeatures { fid: e.cdw10 as u8 },
        AdminOpcode::SetFeatures => AdminCommand::SetFeatures { fid: e.cdw10 as u8, cdw11: e.cdw11 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_entry_layout_matches_the_spec() {
        let e =
            SubmissionEntry::rw(IoOpcode::Read, 0xABCD, 1, 0x0000_0012_3456_789A, 8, 0x1000_2000, 0x3000_4000).unwrap();
        let b = e.to_bytes();
        // CDW0: opcode bits 7:0, CID bits 31:16.
        assert_eq!(b[0], 0x02);
        assert_eq!(b[1], 0x00);
        assert_eq!(&b[2..4], &[0xCD, 0xAB]);
        // NSID at bytes 4-7.
        assert_eq!(&b[4..8], &[1, 0, 0, 0]);
        // MPTR (16-23) unused.
        assert!(b[8..24].iter().all(|&x| x == 0));
        // PRP1 at 24-31, PRP2 at 32-39.
        assert_eq!(&b[24..32], &0x1000_2000u64.to_le_bytes());
        assert_eq!(&b[32..40], &0x3000_4000u64.to_le_bytes());
        // CDW10-11: starting LBA; CDW12 bits 15:0: NLB, 0's based.
        assert_eq!(&b[40..44], &0x3456_789Au32.to_le_bytes());
        assert_eq!(&b[44..48], &0x12u32.to_le_bytes());
        assert_eq!(&b[48..52], &7u32.to_le_bytes());
        assert!(b[52..64].iter().all(|&x| x == 0));
        assert_eq!(SubmissionEntry::from_bytes(&b), e);
        assert_eq!(
            parse_io(&e),
            Ok(IoCommand::Read { nsid: 1, slba: 0x12_3456_789A, nlb: 8, prp1: 0x1000_2000, prp2: 0x3000_4000 })
        );
    }

    #[test]
    fn opcodes_are_the_specs() {
        assert_eq!([IoOpcode::Flush as u8, IoOpcode::Write as u8, IoOpcode::Read as u8], [0x00, 0x01, 0x02]);
        let admin = [
            (AdminOpcode::DeleteIoSq, 0x00),
            (AdminOpcode::CreateIoSq, 0x01),
            (AdminOpcode::DeleteIoCq, 0x04),
            (AdminOpcode::CreateIoCq, 0x05),
            (AdminOpcode::Identify, 0x06),
            (AdminOpcode::SetFeatures, 0x09),
            (AdminOpcode::GetFeatures, 0x0A),
        ];
        for (op, v) in admin {
            assert_eq!(op as u8, v);
            assert_eq!(AdminOpcode::from_u8(v), Some(op));
        }
        assert_eq!(AdminOpcode::from_u8(0x7F), None);
    }

    #[test]
    fn admin_entries_round_trip() {
        let e = SubmissionEntry::create_io_sq(3, 5, 1024, 4, 0xdead_0000);
        let b = e.to_bytes();
        assert_eq!(b[0], 0x01);
        // CDW10: QID bits 15:0, QSIZE (0's based) bits 31:16; CDW11: PC bit 0, CQID bits 31:16.
        assert_eq!(&b[40..44], &(5u32 | (1023 << 16)).to_le_bytes());
        assert_eq!(&b[44..48], &(1u32 | (4 << 16)).to_le_bytes());
        assert_eq!(
            parse_admin(&e),
            Ok(AdminCommand::CreateIoSq { qid: 5, entries: 1024, cqid: 4, prp1: 0xdead_0000, contiguous: true })
        );
        let e = SubmissionEntry::create_io_cq(1, 5, 2, 0x1000);
        assert_eq!(
            parse_admin(&e),
            Ok(AdminCommand::CreateIoCq { qid: 5, entries: 2, prp1: 0x1000, contiguous: true, interrupts: false })
        );
        let e = SubmissionEntry::identify(9, 1, 0, 0x5000);
        assert_eq!(e.to_bytes()[40], 1);
        assert_eq!(parse_admin(&e), Ok(AdminCommand::Identify { cns: 1, nsid: 0, prp1: 0x5000, prp2: 0 }));
        let e = SubmissionEntry::set_features(2, FEATURE_NUMBER_OF_QUEUES, 0x0003_0003);
        assert_eq!(parse_admin(&e), Ok(AdminCommand::SetFeatures { fid: 7, cdw11: 0x0003_0003 }));
    }

    #[test]
    fn bad_entries_get_the_right_status() {
        let mut e = SubmissionEntry::flush(1, 1);
        e.opcode = 0x7F;
        assert_eq!(parse_io(&e), Err(Status::INVALID_OPCODE));
        let mut e = SubmissionEntry::flush(1, 1);
        e.psdt = 1;
        assert_eq!(parse_io(&e), Err(Status::INVALID_FIELD));
        assert!(SubmissionEntry::rw(IoOpcode::Read, 0, 1, 0, 0, 0, 0).is_none());
        assert!(SubmissionEntry::rw(IoOpcode::Read, 0, 1, 0, (1 << 16) + 1, 0, 0).is_none());
        assert!(SubmissionEntry::rw(IoOpcode::Flush, 0, 1, 0, 1, 0, 0).is_none());
    }
}
