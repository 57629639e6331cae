//! Completion queue entries (16 bytes) and the status field they carry.

use std::fmt;

use super::bytes::{le_u32, put};

/// Size of a completion queue entry (CC.IOCQES = 4).
pub const CQE_BYTES: usize = 16;

/// Status Code Type (SCT), status field bits 10:8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum StatusCodeType {
    /// Generic command status: codes any command may return.
    Generic = 0,
    /// Command-specific status: meaning depends on the opcode.
    CommandSpecific = 1,
    /// Media and data integrity errors.
    MediaAndDataIntegrity = 2,
    /// Path-related status (multipath, fabrics).
    PathRelated = 3,
    /// Vendor-specific status.
    VendorSpecific = 7,
}

/// The 15-bit status field of a completion (DW3 bits 31:17): SC in bits 7:0, SCT in 10:8, CRD in 12:11, More in
/// bit 13, DNR in bit 14.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status(u16);

impl Status {
    /// Successful Completion (generic status 0x00).
    pub const SUCCESS: Status = Status::new(StatusCodeType::Generic, 0x00);
    /// Invalid Command Opcode (generic status 0x01).
    pub const INVALID_OPCODE: Status = Status::new(StatusCodeType::Generic, 0x01);
    /// Invalid Field in Command (generic status 0x02).
    pub const INVALID_FIELD: Status = Status::new(StatusCodeType::Generic, 0x02);
    /// Command ID Conflict (generic status 0x03).
    pub const COMMAND_ID_CONFLICT: Status = Status::new(StatusCodeType::Generic, 0x03);
    /// Data Transfer Error (generic status 0x04).
    pub const DATA_TRANSFER_ERROR: Status = Status::new(StatusCodeType::Generic, 0x04);
    /// Internal Error (generic status 0x06).
    pub const INTERNAL_ERROR: Status = Status::new(StatusCodeType::Generic, 0x06);
    /// Command Aborted due to SQ Deletion (generic status 0x08).
    pub const ABORTED_SQ_DELETION: Status = Status::new(StatusCodeType::Generic, 0x08);
    /// Invalid Namespace or Format (generic status 0x0B).
    pub const INVALID_NAMESPACE: Status = Status::new(StatusCodeType::Generic, 0x0B);
    /// PRP Offset Invalid (generic status 0x13).
    pub const PRP_OFFSET_INVALID: Status = Status::new(StatusCodeType::Generic, 0x13);
    /// Namespace is Write Protected (generic status 0x20).
    pub const NAMESPACE_WRITE_PROTECTED: Status = Status::new(StatusCodeType::Generic, 0x20);
    /// LBA Out of Range (generic status 0x80).
    pub const LBA_OUT_OF_RANGE: Status = Status::new(StatusCodeType::Generic, 0x80);
    /// Capacity Exceeded (generic status 0x81).
    pub const CAPACITY_EXCEEDED: Status = Status::new(StatusCodeType::Generic, 0x81);
    /// Completion Queue Invalid (command-specific status 0x00).
    pub const COMPLETION_QUEUE_INVALID: Status = Status::new(StatusCodeType::CommandSpecific, 0x00);
    /// Invalid Queue Identifier (command-specific status 0x01).
    pub const INVALID_QUEUE_IDENTIFIER: Status = Status::new(StatusCodeType::CommandSpecific, 0x01);
    /// Invalid Queue Size (command-specific status 0x02).
    pub const INVALID_QUEUE_SIZE: Status = Status::new(StatusCodeType::CommandSpecific, 0x02);
    /// Invalid Queue Deletion (command-specific status 0x0C).
    pub const INVALID_QUEUE_DELETION: Status = Status::new(StatusCodeType::CommandSpecific, 0x0C);
    /// Write Fault (media and data integrity status 0x80).
    pub const WRITE_FAULT: Status = Status::new(StatusCodeType::MediaAndDataIntegrity, 0x80);
    /// Unrecovered Read Error (media and data integrity status 0x81).
    pub const UNRECOVERED_READ_ERROR: Status = Status::new(StatusCodeType::MediaAndDataIntegrity, 0x81);

    /// Status Code `sc` of type `sct`, with CRD, More and DNR clear.
    pub const fn new(sct: StatusCodeType, sc: u8) -> Status {
        Status(((sct as u16) << 8) | sc as u16)
    }

    /// From the 15-bit field (bit 15 is ignored).
    pub const fn from_raw(raw: u16) -> Status {
        Status(raw & 0x7FFF)
    }

    /// The 15-bit field as it sits in DW3 bits 31:17.
    pub const fn raw(self) -> u16 {
        self.0
    }

    /// Status Code.
    pub const fn sc(self) -> u8 {
        (self.0 & 0xFF) as u8
    }

    /// Status Code Type, as the raw 3-bit value.
    pub const fn sct(self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }

    /// Do Not Retry.
    pub const fn dnr(self) -> bool {
        self.0 & (1 << 14) != 0
    }

    /// The same status with Do Not Retry set.
    pub const fn with_dnr(self) -> Status {
        Status(self.0 | (1 << 14))
    }

    /// Whether SCT and SC say success (CRD, More and DNR do not matter).
    pub const fn is_success(self) -> bool {
        self.0 & 0x7FF == 0
    }

    /// Whether SCT and SC equal those of `other`.
    pub const fn same_code(self, other: Status) -> bool {
        self.0 & 0x7FF == other.0 & 0x7FF
    }

    /// The specification's name for this status, where weightlift knows it.
    pub fn name(self) -> Option<&'static str> {
        Some(match (self.sct(), self.sc()) {
            (0, 0x00) => "Successful Completion",
            (0, 0x01) => "Invalid Command Opcode",
            (0, 0x02) => "Invalid Field in Command",
            (0, 0x03) => "Command ID Conflict",
            (0, 0x04) => "Data Transfer Error",
            (0, 0x05) => "Commands Aborted due to Power Loss Notification",
            (0, 0x06) => "Internal Error",
            (0, 0x07) => "Command Abort Requested",
            (0, 0x08) => "Command Aborted due to SQ Deletion",
            (0, 0x0B) => "Invalid Namespace or Format",
            (0, 0x13) => "PRP Offset Invalid",
            (0, 0x20) => "Namespace is Write Protected",
            (0, 0x80) => "LBA Out of Range",
            (0, 0x81) => "Capacity Exceeded",
            (0, 0x82) => "Namespace Not Ready",
            (1, 0x00) => "Completion Queue Invalid",
            (1, 0x01) => "Invalid Queue Identifier",
            (1, 0x02) => "Invalid Queue Size",
            (1, 0x0C) => "Invalid Queue Deletion",
            (2, 0x80) => "Write Fault",
            (2, 0x81) => "Unrecovered Read Error",
            (2, 0x86) => "Access Denied",
            _ => return None,
        })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name().unwrap_or("unknown status");
        write!(f, "{name} (SCT {:#x}, SC {:#04x}{})", self.sct(), self.sc(), if self.dnr() { ", DNR" } else { "" })
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A 16-byte completion queue entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompletionEntry {
    /// DW0: command specific (Set Features returns the allocated queue counts here).
    pub dw0: u32,
    /// DW1: command specific (reserved for the commands weightlift issues).
    pub dw1: u32,
    /// DW2 bits 15:0: where the controller's SQ head stands.
    pub sq_head: u16,
    /// DW2 bits 31:16: the submission queue the command came from.
    pub sq_id: u16,
    /// DW3 bits 15:0: the command's identifier, as submitted.
    pub cid: u16,
    /// DW3 bit 16: the phase tag, inverted by the controller on every pass through the queue.
    pub phase: bool,
    /// DW3 bits 31:17: how the command ended.
    pub status: Status,
}

impl CompletionEntry {
    /// The entry as its four dwords, in order.
    pub fn to_dwords(&self) -> [u32; 4] {
        [
            self.dw0,
            self.dw1,
            u32::from(self.sq_head) | (u32::from(self.sq_id) << 16),
            Self::dw3(self.cid, self.phase, self.status),
        ]
    }

    /// The entry the four dwords `d` encode.
    pub fn from_dwords(d: [u32; 4]) -> CompletionEntry {
        CompletionEntry {
            dw0: d[0],
            dw1: d[1],
            sq_head: d[2] as u16,
            sq_id: (d[2] >> 16) as u16,
            cid: d[3] as u16,
            phase: (d[3] >> 16) & 1 == 1,
            status: Status::from_raw((d[3] >> 17) as u16),
        }
    }

    /// DW3 from its fields: the word that a host polls for the phase tag.
    pub fn dw3(cid: u16, phase: bool, status: Status) -> u32 {
        u32::from(cid) | (u32::from(phase) << 16) | (u32::from(status.raw()) << 17)
    }

    /// The entry's 16 bytes as a controller posts them (little-endian dwords).
    pub fn to_bytes(&self) -> [u8; CQE_BYTES] {
        let mut b = [0u8; CQE_BYTES];
        for (i, d) in self.to_dwords().iter().enumerate() {
            put(&mut b, i * 4, &d.to_le_bytes());
        }
        b
    }

    /// The entry encoded in the 16 bytes `b`.
    pub fn from_bytes(b: &[u8; CQE_BYTES]) -> CompletionEntry {
        CompletionEntry::from_dwords([le_u32(b, 0), le_u32(b, 4), le_u32(b, 8), le_u32(b, 12)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_layout_matches_the_spec() {
        let c = CompletionEntry {
            dw0: 0x1122_3344,
            dw1: 0,
            sq_head: 0x0102,
            sq_id: 0x0304,
            cid: 0xBEEF,
            phase: true,
            status: Status::LBA_OUT_OF_RANGE,
        };
        let b = c.to_bytes();
        assert_eq!(&b[0..4], &[0x44, 0x33, 0x22, 0x11]);
        // DW2: SQ head in bits 15:0, SQ identifier in bits 31:16.
        assert_eq!(&b[8..12], &[0x02, 0x01, 0x04, 0x03]);
        // DW3: CID bits 15:0, phase bit 16, status bits 31:17 (SC 0x80 at bits 24:17, SCT 0 at 27:25).
        let dw3 = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
        assert_eq!(dw3 & 0xFFFF, 0xBEEF);
        assert_eq!((dw3 >> 16) & 1, 1);
        assert_eq!((dw3 >> 17) & 0xFF, 0x80);
        assert_eq!((dw3 >> 25) & 0x7, 0);
        assert_eq!(CompletionEntry::from_bytes(&b), c);
    }

    #[test]
    fn status_fields() {
        let s = Status::UNRECOVERED_READ_ERROR;
        assert_eq!((s.sct(), s.sc()), (2, 0x81));
        let dw3 = CompletionEntry::dw3(7, false, s.with_dnr());
        assert_eq!(dw3 >> 31, 1, "DNR is the top bit of DW3");
        assert_eq!((dw3 >> 25) & 7, 2);
        let back = CompletionEntry::from_dwords([0, 0, 0, dw3]).status;
        assert!(back.dnr() && back.same_code(s) && !back.is_success());
        assert!(Status::SUCCESS.is_success());
        assert_eq!(Status::INVALID_QUEUE_IDENTIFIER.to_string(), "Invalid Queue Identifier (SCT 0x1, SC 0x01)");
        assert_eq!(Status::from_raw(0x7FF).name(), None);
    }
}
