//! Little-endian fields of the specification's byte layouts, read and written without panicking: a field outside
//! the buffer reads as zero and is not written (the layouts' lengths are checked where they are decoded).

pub(crate) fn le_u16(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    if let Some(s) = b.get(at..at + 2) {
        a.copy_from_slice(s);
    }
    u16::from_le_bytes(a)
}

pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

pub(crate) fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(s) = b.get_mut(at..at + bytes.len()) {
        s.copy_from_slice(bytes);
    }
}
