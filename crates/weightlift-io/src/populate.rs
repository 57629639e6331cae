//! Cold ranges brought into the page cache in 2 MiB folios before they are read (`cache_pages = huge`).
//!
//! A cold load's buffered reads come from several lanes at scattered offsets of one descriptor, so the kernel's
//! readahead sees random reads and fills the page cache with 4 KiB folios. Reading those again (the next process,
//! a server restart) is slower than reading 2 MiB folios (docs/performance.md, "Cold loads that leave 2 MiB folios").
//! A fault in a mapping advised `MADV_HUGEPAGE` makes the kernel read the file in PMD-sized folios whatever the
//! access pattern, so each lane first populates its cold range through such a mapping (`MADV_POPULATE_READ`: the
//! disk reads happen there, in whole 2 MiB folios around the range, with the kernel's readahead beyond), then
//! reads it as before, from the page cache.
//!
//! That takes a kernel and filesystem that cache files in large folios (measured: Linux 6.18, ext4; XFS has them
//! for longer, ext4 only in recent kernels). Elsewhere the kernel caches the populated range in small folios
//! without saying so: the load costs about what it did (the disk reads move from the read to the populate) and
//! gains nothing. Only a refused advice is reported (`populate_refusal`).
//!
//! The mapping is a raw one (no safe slice of it exists) and is only advised, never read through: a file
//! truncated meanwhile makes the advice fail with an error (no SIGBUS), and the read that follows reports what is
//! wrong. A refused advice leaves the load as it was.
//!
//! Hand-written on memmap2's advice calls: no crate populates a file's page cache in large folios.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use memmap2::{Advice, MmapOptions, MmapRaw, UncheckedAdvice};

use crate::file::OpenFile;

/// Populated ranges are widened to this (the PMD folio size on x86-64 and 4 KiB-page arm64).
const FOLIO: u64 = 2 << 20;

/// One load's mappings of its input files, made by the first lane that populates a range of each.
pub(crate) struct ColdMaps {
    maps: Vec<OnceLock<Option<MmapRaw>>>,
    /// Set once a refusal says the kernel will refuse every range (no mapping, or the advice unknown).
    off: AtomicBool,
    refusal: Mutex<Option<String>>,
}

impl ColdMaps {
    pub(crate) fn new(files: usize) -> ColdMaps {
        ColdMaps {
            maps: (0..files).map(|_| OnceLock::new()).collect(),
            off: AtomicBool::new(false),
            refusal: Mutex::new(None),
        }
    }

    /// Why the kernel refused to populate a range through the mapping, the first time it did.
    pub(crate) fn refusal(&self) -> Option<String> {
        self.refusal.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn refuse(&self, why: String, for_good: bool) {
        let mut r = self.refusal.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_none() {
            tracing::debug!("cache_pages=huge: {why}; cold ranges are read as they are");
            *r = Some(why);
        }
        if for_good {
            self.off.store(true, Ordering::Relaxed);
        }
    }

    /// Brings `offset..offset + len` of input `idx` into the page cache through its huge-page mapping, widened to
    /// whole 2 MiB folios (neighbouring ranges may share one); false where the kernel refused (the read that
    /// follows does the work then).
    pub(crate) fn populate(&self, idx: usize, file: &OpenFile, offset: u64, len: u64) -> bool {
        if self.off.load(Ordering::Relaxed) || len == 0 {
            return false;
        }
        let Some(slot) = self.maps.get(idx) else { return false };
        let map = slot.get_or_init(|| match map_file(file) {
            Ok(m) => m,
            Err(why) => {
                self.refuse(format!("{}: {why}", file.path.display()), false);
                None
            }
        });
        let Some(map) = map else { return false };
        let map_len = map.len() as u64;
        let start = offset / FOLIO * FOLIO;
        let end = offset.saturating_add(len).div_ceil(FOLIO).saturating_mul(FOLIO).min(map_len);
        if start >= end {
            return false;
        }
        let (at, n) = (start as usize, (end - start) as usize);
        match map.advise_range(Advice::PopulateRead, at, n) {
            Ok(()) => {
                // The folios stay in the page cache; only this process's mapping of them goes, so that a load
                // does not hold (and count in its RSS) the whole checkpoint mapped until it ends.
                // SAFETY: MADV_DONTNEED on a shared file mapping drops page-table entries only (the file's data is
                // unchanged), and nothing reads through this mapping.
                let _ = unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, at, n) };
                true
            }
            Err(e) => {
                // EINVAL: a kernel before 5.14 (no MADV_POPULATE_READ). Anything else (EFAULT past a truncated
                // end, ENOMEM, EINTR) concerns this range: the read reports it if it is real.
                let for_good = e.raw_os_error() == Some(libc::EINVAL);
                self.refuse(format!("MADV_POPULATE_READ on {}: {e}", file.path.display()), for_good);
                false
            }
        }
    }
}

/// A read-only shared mapping of the whole of `file`, advised `MADV_HUGEPAGE`; None where populating does not
/// apply (an object, not a regular file such as a block device read by LBA, or an empty one).
fn map_file(file: &OpenFile) -> Result<Option<MmapRaw>, String> {
    let Some(local) = file.local() else { return Ok(None) };
    let meta = local.metadata().map_err(|e| format!("metadata: {e}"))?;
    if !meta.is_file() || file.len == 0 {
        return Ok(None);
    }
    let len = usize::try_from(file.len).map_err(|_| "too large to map".to_string())?;
    let map = MmapOptions::new().len(len).map_raw_read_only(local).map_err(|e| format!("mmap: {e}"))?;
    map.advise(Advice::HugePage).map_err(|e| format!("MADV_HUGEPAGE: {e}"))?;
    Ok(Some(map))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn populates_ranges_inside_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        let len = 5 * FOLIO + 12_345;
        let mut f = std::fs::File::create(&path).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        f.write_all(&data).unwrap();
        drop(f);
        let file = OpenFile::open(&path, false).unwrap();
        let maps = ColdMaps::new(1);
        // A range inside a folio, one across two, and the last one, which stops at the end of the file.
        assert!(maps.populate(0, &file, 2 * FOLIO + 100, 10));
        assert!(maps.populate(0, &file, FOLIO - 4096, 8192));
        assert!(maps.populate(0, &file, 5 * FOLIO, 12_345));
        assert!(!maps.populate(0, &file, 0, 0), "nothing to populate");
        assert!(!maps.populate(1, &file, 0, 10), "no such input");
        assert!(maps.refusal().is_none(), "{:?}", maps.refusal());
        assert_eq!(std::fs::read(&path).unwrap(), data, "populating changes nothing in the file");
        // Nothing of the file stays mapped in this process after populating.
        let map = maps.maps[0].get().unwrap().as_ref().unwrap();
        let head = format!("{:x}-", map.as_ptr() as usize);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let (_, entry) = smaps.split_once(&format!("\n{head}")).expect("the mapping in /proc/self/smaps");
        let rss = entry.lines().find(|l| l.starts_with("Rss:")).unwrap();
        assert_eq!(rss.split_whitespace().nth(1), Some("0"), "{rss}");
    }

    #[test]
    fn files_populating_does_not_apply_to_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.bin");
        std::fs::File::create(&path).unwrap();
        let file = OpenFile::open(&path, false).unwrap();
        let maps = ColdMaps::new(1);
        assert!(!maps.populate(0, &file, 0, 4096));
        assert_eq!(maps.refusal(), None, "an empty file is not a refusal");
    }
}
