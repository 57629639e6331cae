//! Which pages of a file are in the page cache, from `mincore(2)` on a mapping of the file that is never read.

use std::fs::File;

/// A per-page residency bitmap of one file.
#[derive(Clone, Debug)]
pub struct Residency {
    page: u64,
    len: u64,
    resident: Vec<bool>,
}

impl Residency {
    /// Probes `file` (`len` bytes). Returns `None` when the probe is not possible (empty file, mapping refused).
    pub fn probe(file: &File, len: u64) -> Option<Residency> {
        if len == 0 {
            return None;
        }
        let page = rustix::param::page_size() as u64;
        // SAFETY: the mapping is only handed to mincore and never read or written, so a concurrent change or
        // truncation of the file cannot be observed through it; it is unmapped when `map` drops.
        let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map(file) }.ok()?;
        let pages = len.div_ceil(page) as usize;
        let mut vec = vec![0u8; pages];
        // SAFETY: `map` is a live mapping of `len` bytes starting at a page boundary, and `vec` holds one byte for
        // each of its pages, as mincore requires.
        let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len as usize, vec.as_mut_ptr()) };
        if rc != 0 {
            return None;
        }
        Some(Residency { page, len, resident: vec.into_iter().map(|b| b & 1 == 1).collect() })
    }

    /// Fraction of the pages overlapping `[offset, offset + len)` that are resident.
    pub fn fraction(&self, offset: u64, len: u64) -> f64 {
        if len == 0 {
            return 1.0;
        }
        let first = (offset / self.page) as usize;
        let last = (offset + len).div_ceil(self.page) as usize;
        let range = self.resident.get(first..last.min(self.resident.len())).unwrap_or(&[]);
        if range.is_empty() {
            return 0.0;
        }
        range.iter().filter(|&&r| r).count() as f64 / range.len() as f64
    }

    /// Resident bytes of the whole file.
    pub fn resident_bytes(&self) -> u64 {
        let pages = self.resident.iter().filter(|&&r| r).count() as u64;
        let tail_short =
            if self.resident.last() == Some(&true) { self.resident.len() as u64 * self.page - self.len } else { 0 };
        pages * self.page - tail_short
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_file_just_read_is_resident() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![3u8; 1 << 20]).unwrap();
        let mut f = File::open(&path).unwrap();
        let mut sink = Vec::new();
        f.read_to_end(&mut sink).unwrap();
        let r = Residency::probe(&f, 1 << 20).unwrap();
        assert!(r.fraction(0, 1 << 20) > 0.99);
        assert_eq!(r.resident_bytes(), 1 << 20);
    }
}
