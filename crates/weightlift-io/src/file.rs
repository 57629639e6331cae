//! Input files opened twice where the filesystem allows it: one buffered descriptor and one O_DIRECT descriptor,
//! with the alignment O_DIRECT needs there.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, StatxFlags};

use crate::error::IoError;

/// Alignment assumed when the kernel cannot tell (no `STATX_DIOALIGN`, not a block device).
pub const FALLBACK_BLOCK: u64 = 4096;

/// One input file.
#[derive(Debug)]
pub struct OpenFile {
    pub path: PathBuf,
    pub buffered: File,
    /// The O_DIRECT descriptor, when the filesystem accepts O_DIRECT reads.
    pub direct: Option<File>,
    /// Why there is no O_DIRECT descriptor.
    pub direct_refused: Option<String>,
    pub len: u64,
    /// Offset and length alignment for O_DIRECT reads (the logical block size).
    pub block: u64,
    /// Memory alignment for O_DIRECT buffers.
    pub mem_align: u64,
}

impl OpenFile {
    /// Opens `path` for reading, probing O_DIRECT unless `want_direct` is false.
    pub fn open(path: &Path, want_direct: bool) -> Result<OpenFile, IoError> {
        let open_err = |cause| IoError::Open { path: path.to_path_buf(), cause };
        let buffered = File::open(path).map_err(open_err)?;
        let meta = buffered.metadata().map_err(open_err)?;
        if meta.is_dir() {
            return Err(open_err(io::Error::new(io::ErrorKind::IsADirectory, "is a directory")));
        }
        let len = meta.len();
        let mut f = OpenFile {
            path: path.to_path_buf(),
            buffered,
            direct: None,
            direct_refused: None,
            len,
            block: FALLBACK_BLOCK,
            mem_align: FALLBACK_BLOCK,
        };
        if !want_direct {
            f.direct_refused = Some("O_DIRECT not requested".into());
            return Ok(f);
        }
        match dio_alignment(&f.buffered) {
            Some((0, _)) => {
                f.direct_refused = Some("filesystem does not support O_DIRECT (statx)".into());
                return Ok(f);
            }
            Some((offset_align, mem_align)) => {
                f.block = u64::from(offset_align).max(512);
                f.mem_align = u64::from(mem_align).max(1);
            }
            None => {
                if let Ok(b) = rustix::fs::ioctl_blksszget(&f.buffered) {
                    f.block = u64::from(b).max(512);
                    f.mem_align = f.block;
                }
            }
        }
        match OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
            Ok(direct) => match probe_direct_read(&direct, f.block, len) {
                Ok(()) => f.direct = Some(direct),
                Err(e) => f.direct_refused = Some(format!("O_DIRECT read refused: {e}")),
            },
            Err(e) => f.direct_refused = Some(format!("O_DIRECT open refused: {e}")),
        }
        if f.block > 1 << 20 || !f.block.is_power_of_two() || f.mem_align > 1 << 20 || !f.mem_align.is_power_of_two() {
            f.direct_refused = Some(format!("unusual O_DIRECT alignment ({} bytes)", f.block));
            f.direct = None;
        }
        Ok(f)
    }

    pub fn supports_direct(&self) -> bool {
        self.direct.is_some()
    }
}

/// `(offset alignment, memory alignment)` for O_DIRECT from `statx(STATX_DIOALIGN)` (Linux 6.1+); `None` when the
/// kernel or filesystem does not report it.
fn dio_alignment(file: &File) -> Option<(u32, u32)> {
    let st = rustix::fs::statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN).ok()?;
    if st.stx_mask & StatxFlags::DIOALIGN.bits() == 0 {
        return None;
    }
    Some((st.stx_dio_offset_align, st.stx_dio_mem_align))
}

/// Some filesystems accept the O_DIRECT open and refuse the read; one aligned read of the first block tells.
fn probe_direct_read(direct: &File, block: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let mut buf = memmap2::MmapMut::map_anon(block.max(4096) as usize)?;
    loop {
        match direct.read_at(&mut buf[..block as usize], 0) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map(|_| ()),
        }
    }
}

/// Opens several files; `want_direct` says whether O_DIRECT descriptors are wanted at all.
pub fn open_all(paths: &[PathBuf], want_direct: bool) -> Result<Vec<OpenFile>, IoError> {
    paths.iter().map(|p| OpenFile::open(p, want_direct)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_with_a_sane_block_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 10_000]).unwrap();
        let f = OpenFile::open(&path, true).unwrap();
        assert_eq!(f.len, 10_000);
        assert!(f.block.is_power_of_two() && f.block >= 512);
        assert!(f.direct.is_some() || f.direct_refused.is_some());
        let missing = OpenFile::open(&dir.path().join("missing"), true).unwrap_err();
        assert!(matches!(missing, IoError::Open { .. }));
        assert!(missing.to_string().contains("missing"));
    }
}
