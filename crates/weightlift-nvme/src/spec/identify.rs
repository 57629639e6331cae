//! The Identify Controller and Identify Namespace data structures (4096 bytes each), with the fields a host needs.

use super::bytes::{le_u16, le_u32, le_u64, put};
use crate::error::NvmeError;

/// Size of an Identify data structure.
pub const IDENTIFY_BYTES: usize = 4096;

/// Controller or Namespace Structure values (Identify CDW10 bits 7:0).
pub mod cns {
    /// Identify Namespace data structure for NSID.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller data structure.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NAMESPACES: u8 = 0x02;
}

/// Identify Controller, the fields weightlift reads or a controller must report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdentifyController {
    /// PCI Vendor ID (bytes 1:0).
    pub vid: u16,
    /// Subsystem Vendor ID (3:2).
    pub ssvid: u16,
    /// Serial Number, ASCII (23:4).
    pub serial: String,
    /// Model Number, ASCII (63:24).
    pub model: String,
    /// Firmware Revision, ASCII (71:64).
    pub firmware: String,
    /// Maximum Data Transfer Size (byte 77): 2 ^ MDTS minimum pages; 0 means no limit.
    pub mdts: u8,
    /// Controller ID (79:78).
    pub cntlid: u16,
    /// Version (83:80).
    pub ver: u32,
    /// Controller Type (byte 111): 1 for an I/O controller.
    pub cntrltype: u8,
    /// Submission Queue Entry Size (byte 512): required log2 size in bits 3:0, maximum in bits 7:4.
    pub sqes: u8,
    /// Completion Queue Entry Size (byte 513).
    pub cqes: u8,
    /// Maximum Outstanding Commands (515:514).
    pub maxcmd: u16,
    /// Number of Namespaces (519:516).
    pub nn: u32,
    /// Optional NVM Command Support (521:520).
    pub oncs: u16,
    /// Volatile Write Cache (byte 525).
    pub vwc: u8,
}

fn ascii(b: &[u8], at: usize, len: usize) -> String {
    let s = b.get(at..at + len).unwrap_or(&[]);
    s.iter()
        .map(|&c| if c.is_ascii_graphic() || c == b' ' { c as char } else { '?' })
        .collect::<String>()
        .trim_end()
        .to_string()
}

fn put_ascii(b: &mut [u8], at: usize, len: usize, s: &str) {
    // The spec pads these fields with spaces, not NULs.
    let mut field = vec![b' '; len];
    for (d, c) in field.iter_mut().zip(s.bytes().filter(u8::is_ascii)) {
        *d = c;
    }
    put(b, at, &field);
}

fn check_len(b: &[u8], what: &'static str) -> Result<(), NvmeError> {
    if b.len() < IDENTIFY_BYTES {
        return Err(NvmeError::invalid(what, format!("{} bytes where {IDENTIFY_BYTES} are required", b.len())));
    }
    Ok(())
}

impl IdentifyController {
    /// The 4096-byte Identify Controller page, these fields at their offsets and the rest zero.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_BYTES];
        put(&mut b, 0, &self.vid.to_le_bytes());
        put(&mut b, 2, &self.ssvid.to_le_bytes());
        put_ascii(&mut b, 4, 20, &self.serial);
        put_ascii(&mut b, 24, 40, &self.model);
        put_ascii(&mut b, 64, 8, &self.firmware);
        b[77] = self.mdts;
        put(&mut b, 78, &self.cntlid.to_le_bytes());
        put(&mut b, 80, &self.ver.to_le_bytes());
        b[111] = self.cntrltype;
        b[512] = self.sqes;
        b[513] = self.cqes;
        put(&mut b, 514, &self.maxcmd.to_le_bytes());
        put(&mut b, 516, &self.nn.to_le_bytes());
        put(&mut b, 520, &self.oncs.to_le_bytes());
        b[525] = self.vwc;
        b
    }

    /// Reads the fields from an Identify Controller page; [`NvmeError::Invalid`] if `b` is shorter than 4096 bytes.
    pub fn from_bytes(b: &[u8]) -> Result<IdentifyController, NvmeError> {
        check_len(b, "identify controller data")?;
        Ok(IdentifyController {
            vid: le_u16(b, 0),
            ssvid: le_u16(b, 2),
            serial: ascii(b, 4, 20),
            model: ascii(b, 24, 40),
            firmware: ascii(b, 64, 8),
            mdts: b[77],
            cntlid: le_u16(b, 78),
            ver: le_u32(b, 80),
            cntrltype: b[111],
            sqes: b[512],
            cqes: b[513],
            maxcmd: le_u16(b, 514),
            nn: le_u32(b, 516),
            oncs: le_u16(b, 520),
            vwc: b[525],
        })
    }

    /// The largest transfer in bytes for minimum page size `min_page`, or `None` for no limit.
    pub fn max_transfer(&self, min_page: usize) -> Option<u64> {
        if self.mdts == 0 {
            return None;
        }
        (min_page as u64).checked_shl(u32::from(self.mdts)).or(Some(u64::MAX))
    }
}

/// One LBA Format (4 bytes): metadata size bits 15:0, LBA data size (log2) bits 23:16, relative performance 25:24.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LbaFormat {
    /// Metadata Size: bytes of metadata per block (weightlift reads only formats without).
    pub ms: u16,
    /// LBA Data Size: a block is 2 ^ `lbads` bytes (9 for 512, 12 for 4096).
    pub lbads: u8,
    /// Relative Performance (0 best to 3 degraded).
    pub rp: u8,
}

impl LbaFormat {
    fn to_u32(self) -> u32 {
        u32::from(self.ms) | (u32::from(self.lbads) << 16) | (u32::from(self.rp & 3) << 24)
    }
    fn from_u32(v: u32) -> LbaFormat {
        LbaFormat { ms: v as u16, lbads: (v >> 16) as u8, rp: ((v >> 24) & 3) as u8 }
    }
}

/// Identify Namespace, the fields weightlift reads or a controller must report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdentifyNamespace {
    /// Namespace Size in logical blocks (bytes 7:0).
    pub nsze: u64,
    /// Namespace Capacity (15:8).
    pub ncap: u64,
    /// Namespace Utilization (23:16).
    pub nuse: u64,
    /// Namespace Features (byte 24).
    pub nsfeat: u8,
    /// Formatted LBA Size (byte 26): the format in use is bits 3:0 (bits 6:5 extend it past 16 formats).
    pub flbas: u8,
    /// LBA Formats (bytes 128..192); byte 25 (NLBAF) is their count, 0's based.
    pub lbaf: Vec<LbaFormat>,
}

impl IdentifyNamespace {
    /// A namespace of `nsze` blocks of 2 ^ `lbads` bytes, in format 0.
    pub fn simple(nsze: u64, lbads: u8) -> IdentifyNamespace {
        IdentifyNamespace {
            nsze,
            ncap: nsze,
            nuse: nsze,
            nsfeat: 0,
            flbas: 0,
            lbaf: vec![LbaFormat { ms: 0, lbads, rp: 0 }],
        }
    }

    /// The 4096-byte Identify Namespace page, these fields at their offsets (at most 16 formats) and the rest zero.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_BYTES];
        put(&mut b, 0, &self.nsze.to_le_bytes());
        put(&mut b, 8, &self.ncap.to_le_bytes());
        put(&mut b, 16, &self.nuse.to_le_bytes());
        b[24] = self.nsfeat;
        b[25] = self.lbaf.len().clamp(1, 16) as u8 - 1;
        b[26] = self.flbas;
        for (i, f) in self.lbaf.iter().take(16).enumerate() {
            put(&mut b, 128 + 4 * i, &f.to_u32().to_le_bytes());
        }
        b
    }

    /// Reads the fields from an Identify Namespace page; [`NvmeError::Invalid`] if `b` is shorter than 4096 bytes.
    pub fn from_bytes(b: &[u8]) -> Result<IdentifyNamespace, NvmeError> {
        check_len(b, "identify namespace data")?;
        let nlbaf = usize::from(b[25]).min(15) + 1;
        Ok(IdentifyNamespace {
            nsze: le_u64(b, 0),
            ncap: le_u64(b, 8),
            nuse: le_u64(b, 16),
            nsfeat: b[24],
            flbas: b[26],
            lbaf: (0..nlbaf).map(|i| LbaFormat::from_u32(le_u32(b, 128 + 4 * i))).collect(),
        })
    }

    /// The LBA format in use.
    pub fn current_format(&self) -> Result<LbaFormat, NvmeError> {
        let idx = usize::from(self.flbas & 0xF) | (usize::from((self.flbas >> 5) & 0x3) << 4);
        self.lbaf.get(idx).copied().ok_or_else(|| {
            NvmeError::invalid("namespace format", format!("FLBAS selects format {idx} of {}", self.lbaf.len()))
        })
    }

    /// Logical block size in bytes; weightlift accepts 512 B to 64 KiB blocks without metadata.
    pub fn lba_size(&self) -> Result<u32, NvmeError> {
        let f = self.current_format()?;
        if !(9..=16).contains(&f.lbads) || f.ms != 0 {
            return Err(NvmeError::invalid(
                "namespace format",
                format!("LBADS {} with {} bytes of metadata per block is not supported", f.lbads, f.ms),
            ));
        }
        Ok(1 << f.lbads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_layout() {
        let c = IdentifyController {
            vid: 0x1b36,
            ssvid: 0x1af4,
            serial: "WL0001".into(),
            model: "weightlift soft NVMe".into(),
            firmware: "1.0".into(),
            mdts: 5,
            cntlid: 1,
            ver: 0x0002_0000,
            cntrltype: 1,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: 1024,
            nn: 1,
            oncs: 0,
            vwc: 1,
        };
        let b = c.to_bytes();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[0..2], &[0x36, 0x1b]);
        assert_eq!(&b[4..10], b"WL0001");
        assert_eq!(b[23], b' ', "serial is space padded");
        assert_eq!(b[77], 5);
        assert_eq!(b[512], 0x66);
        assert_eq!(b[513], 0x44);
        assert_eq!(&b[516..520], &[1, 0, 0, 0]);
        assert_eq!(IdentifyController::from_bytes(&b).unwrap(), c);
        assert_eq!(c.max_transfer(4096), Some(128 << 10));
        assert!(IdentifyController::from_bytes(&b[..100]).is_err());
    }

    #[test]
    fn namespace_layout() {
        let n = IdentifyNamespace::simple(1000, 12);
        let b = n.to_bytes();
        assert_eq!(&b[0..8], &1000u64.to_le_bytes());
        assert_eq!(&b[8..16], &1000u64.to_le_bytes());
        assert_eq!(b[25], 0, "NLBAF is 0's based");
        assert_eq!(b[26], 0);
        // LBAF0: LBADS in bits 23:16.
        assert_eq!(&b[128..132], &[0, 0, 12, 0]);
        let back = IdentifyNamespace::from_bytes(&b).unwrap();
        assert_eq!(back, n);
        assert_eq!(back.lba_size().unwrap(), 4096);
        assert_eq!(IdentifyNamespace::simple(1, 9).lba_size().unwrap(), 512);
        assert!(IdentifyNamespace::simple(1, 8).lba_size().is_err());
        let mut bad = n.clone();
        bad.flbas = 3;
        assert!(bad.lba_size().is_err());
    }
}
