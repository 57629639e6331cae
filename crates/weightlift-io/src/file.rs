//! Inputs: local files opened twice where the filesystem allows it (one buffered descriptor and one O_DIRECT
//! descriptor, with the alignment O_DIRECT needs there), and objects of a store, read by ranged GETs.

use std::fs::File;
use std::io;
use std::io::Seek;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, StatxFlags};
use weightlift_format::HeaderBytes;
use weightlift_format::regular::{self, OpenError};
pub use weightlift_format::regular::{Access, NodeKind};
use weightlift_remote::{Object, ObjectUrl};

use crate::error::IoError;
use crate::object_cache::{self, CacheFill};

/// Alignment assumed when the kernel cannot tell (no `STATX_DIOALIGN`, not a block device).
pub const FALLBACK_BLOCK: u64 = 4096;

/// Where an input's buffered reads go.
#[derive(Debug)]
pub enum Source {
    /// A local file's buffered descriptor.
    Local(File),
    /// An object (`path` is its URL), pinned to the ETag it had when opened.
    Object(Arc<Object>),
}

/// An object's local copy (`remote_cache_dir`, see [`crate::object_cache`]), where a load has one.
#[derive(Debug)]
pub enum LocalCopy {
    /// The input is the object's valid local copy: the object itself was only opened (a HEAD).
    Read(Arc<Object>),
    /// The object's bytes are also written into a new local copy as they arrive.
    Written(Arc<CacheFill>),
}

/// One input file, or object.
#[derive(Debug)]
pub struct OpenFile {
    /// The file's path, or the object's URL.
    pub path: PathBuf,
    /// Where its buffered reads go: a local descriptor or the object.
    pub source: Source,
    /// The O_DIRECT descriptor, when the filesystem accepts O_DIRECT reads.
    pub direct: Option<File>,
    /// Why there is no O_DIRECT descriptor.
    pub direct_refused: Option<String>,
    /// The input's length in bytes when it was opened.
    pub len: u64,
    /// Offset and length alignment for O_DIRECT reads (the logical block size).
    pub block: u64,
    /// Memory alignment for O_DIRECT buffers.
    pub mem_align: u64,
    /// The object this input is, or is being written as, a local copy of.
    pub copy: Option<LocalCopy>,
}

impl OpenFile {
    /// Opens the regular file `path` for reading, probing O_DIRECT unless `want_direct` is false. Anything else
    /// (FIFO, socket, device, directory) is refused at once, without blocking.
    pub fn open(path: &Path, want_direct: bool) -> Result<OpenFile, IoError> {
        Self::open_as(path, want_direct, Access::READ)
    }

    /// As [`OpenFile::open`], but a block device is accepted too: for reads by LBA and for probes, where the caller
    /// means the device itself. Its length is the device's size.
    pub fn open_device(path: &Path, want_direct: bool) -> Result<OpenFile, IoError> {
        Self::open_as(path, want_direct, Access { block_devices: true, ..Access::READ })
    }

    fn open_as(path: &Path, want_direct: bool, access: Access) -> Result<OpenFile, IoError> {
        let open_err = |cause| IoError::Open { path: path.to_path_buf(), cause };
        let buffered = open_checked(path, access)?;
        let meta = buffered.metadata().map_err(open_err)?;
        // A block device's size is not in its inode: it is where its end is.
        let len = if meta.file_type().is_block_device() {
            (&buffered).seek(io::SeekFrom::End(0)).map_err(open_err)?
        } else {
            meta.len()
        };
        let mut f = OpenFile {
            path: path.to_path_buf(),
            source: Source::Local(buffered),
            direct: None,
            direct_refused: None,
            len,
            block: FALLBACK_BLOCK,
            mem_align: FALLBACK_BLOCK,
            copy: None,
        };
        if !want_direct {
            f.direct_refused = Some("O_DIRECT not requested".into());
            return Ok(f);
        }
        let Source::Local(buffered) = &f.source else { return Ok(f) };
        match dio_alignment(buffered) {
            Some((0, _)) => {
                f.direct_refused = Some("filesystem does not support O_DIRECT (statx)".into());
                return Ok(f);
            }
            Some((offset_align, mem_align)) => {
                f.block = u64::from(offset_align).max(512);
                f.mem_align = u64::from(mem_align).max(1);
            }
            None => {
                if let Ok(b) = rustix::fs::ioctl_blksszget(buffered) {
                    f.block = u64::from(b).max(512);
                    f.mem_align = f.block;
                }
            }
        }
        match open_checked(path, access.direct()) {
            Ok(direct) if !same_file(&direct, buffered) => {
                f.direct_refused = Some("the path named another file when opened again for O_DIRECT".into());
            }
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

    /// Opens the object `url` names (a GET of its first byte pins its length and ETag); `etag`, where given, is
    /// the one its header was parsed from, and an object that no longer has it is refused.
    pub fn open_object(url: &ObjectUrl, etag: Option<&str>) -> Result<OpenFile, IoError> {
        let object = Object::open(url).map_err(IoError::Remote)?;
        if let (Some(was), Some(now)) = (etag, object.etag())
            && was != now
        {
            let (was, now) = (was.to_string(), now.to_string());
            let url = url.to_string();
            return Err(IoError::Remote(weightlift_remote::RemoteError::Changed { url, was, now }));
        }
        Ok(OpenFile::of_object(Arc::new(object)))
    }

    /// The input an object opened already is (no request: its GETs ask for the ETag it was opened at).
    pub fn of_object(object: Arc<Object>) -> OpenFile {
        OpenFile {
            path: PathBuf::from(object.url()),
            len: object.len(),
            source: Source::Object(object),
            direct: None,
            direct_refused: Some("an object: read by ranged GETs".into()),
            block: FALLBACK_BLOCK,
            mem_align: FALLBACK_BLOCK,
            copy: None,
        }
    }

    /// As [`OpenFile::of_object`], with local copies under `cache_dir` (see [`crate::object_cache`]): the
    /// object's valid copy is opened instead (as a local file, probing O_DIRECT unless `want_direct` is false);
    /// failing that, where `fill` is true, the load writes a new copy as the object's bytes arrive, its first bytes
    /// from `header` where given (the object's bytes from offset 0 as parsing fetched them, at its ETag).
    pub fn open_object_cached(
        object: Arc<Object>,
        header: Option<&HeaderBytes>,
        cache_dir: &Path,
        fill: bool,
        want_direct: bool,
    ) -> Result<OpenFile, IoError> {
        let url = object.url().to_string();
        let mut f = OpenFile::of_object(object.clone());
        if let Some((copy, ino)) = object_cache::lookup(cache_dir, &object) {
            match OpenFile::open(&copy, want_direct) {
                Ok(mut local) if local.local().is_some_and(|l| object_cache::is_the_copy(l, ino, object.len())) => {
                    local.copy = Some(LocalCopy::Read(object));
                    return Ok(local);
                }
                Ok(_) => tracing::debug!(url, "the local copy was replaced while opened; fetching the object"),
                Err(e) => tracing::warn!(url, "the local copy cannot be read; fetching the object: {e}"),
            }
        }
        if fill {
            let header = header.map(|h| h.0.clone());
            f.copy = CacheFill::start(cache_dir, &object, header).map(|c| LocalCopy::Written(Arc::new(c)));
        }
        Ok(f)
    }

    /// The local copy this input's object bytes are written into, as they arrive.
    pub fn filling(&self) -> Option<&Arc<CacheFill>> {
        match &self.copy {
            Some(LocalCopy::Written(c)) => Some(c),
            _ => None,
        }
    }

    /// Whether O_DIRECT reads are possible (the input has an O_DIRECT descriptor).
    pub fn supports_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The buffered descriptor of a local file (`None` for an object).
    pub fn local(&self) -> Option<&File> {
        match &self.source {
            Source::Local(f) => Some(f),
            Source::Object(_) => None,
        }
    }

    /// The object this input reads (`None` for a local file).
    pub fn object(&self) -> Option<&Arc<Object>> {
        match &self.source {
            Source::Object(o) => Some(o),
            Source::Local(_) => None,
        }
    }

    /// The object whose bytes this input holds: the one it reads, or the one it is the valid local copy of
    /// (`remote_cache_dir`); `None` for any other local file.
    pub fn object_or_copy_of(&self) -> Option<&Arc<Object>> {
        match (&self.source, &self.copy) {
            (Source::Object(o), _) | (Source::Local(_), Some(LocalCopy::Read(o))) => Some(o),
            _ => None,
        }
    }
}

/// The logical block size a block device reports (`BLKSSZGET`).
pub fn logical_block_size(file: &File) -> io::Result<u32> {
    rustix::fs::ioctl_blksszget(file).map_err(io::Error::from)
}

/// Opens `path` only if it is a regular file, without ever blocking on a FIFO or device (see
/// [`weightlift_format::regular`]); anything else is an [`IoError::NotAFile`] naming what it is.
pub fn open_checked(path: &Path, access: Access) -> Result<File, IoError> {
    regular::open(path, access).map_err(|e| match e {
        OpenError::Io(cause) => IoError::Open { path: path.to_path_buf(), cause },
        OpenError::NotAFile(node) => IoError::NotAFile { path: path.to_path_buf(), node },
    })
}

/// Whether two descriptors refer to one file: a path opened twice may have been replaced in between.
pub(crate) fn same_file(a: &File, b: &File) -> bool {
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
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
pub fn open_all(paths: &[PathBuf], want_direct: bool) -> Result<Vec<Arc<OpenFile>>, IoError> {
    paths.iter().map(|p| OpenFile::open(p, want_direct).map(Arc::new)).collect()
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

    #[test]
    fn block_devices_open_only_when_meant() {
        let Some(dev) = ["/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/loop0"]
            .into_iter()
            .map(Path::new)
            .find(|p| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device()))
        else {
            println!("skipped: no block device node here");
            return;
        };
        let err = OpenFile::open(dev, true).unwrap_err();
        assert!(matches!(err, IoError::NotAFile { node: NodeKind::BlockDevice, .. }), "{err}");
        assert!(err.to_string().contains("LBA reads"), "{err}");
        match OpenFile::open_device(dev, true) {
            Ok(f) => {
                assert!(f.block.is_power_of_two() && f.block >= 512, "{}", f.block);
                if f.len == 0 {
                    println!("{}: a block device of size 0 (an unattached loop device?)", dev.display());
                }
            }
            Err(IoError::Open { cause, .. }) => println!("skipped: {} cannot be opened here: {cause}", dev.display()),
            Err(e) => panic!("{}: {e}", dev.display()),
        }
    }

    #[test]
    fn fifos_sockets_devices_and_directories_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
        let sock = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let paths = [fifo, sock, PathBuf::from("/dev/null"), dir.path().to_path_buf()];
        let expected = [Some(NodeKind::Fifo), Some(NodeKind::Socket), Some(NodeKind::CharDevice), None];
        let probe = paths.clone();
        // On another thread, so that a blocking open fails the test instead of hanging it.
        std::thread::spawn(move || {
            for path in &probe {
                for direct in [false, true] {
                    let _ = tx.send((path.clone(), OpenFile::open(path, direct).map(|_| ())));
                }
            }
        });
        for (path, kind) in paths.iter().zip(expected) {
            for _ in 0..2 {
                let (got, result) = rx.recv_timeout(std::time::Duration::from_secs(5)).expect("an open blocked");
                assert_eq!(&got, path);
                let err = result.expect_err("a non-regular file was opened");
                match (kind, &err) {
                    (Some(kind), IoError::NotAFile { node, .. }) => assert_eq!(*node, kind),
                    (None, IoError::Open { cause, .. }) => assert_eq!(cause.kind(), io::ErrorKind::IsADirectory),
                    _ => panic!("{}: {err}", path.display()),
                }
                assert!(err.to_string().starts_with(&*path.to_string_lossy()), "{err}");
            }
        }
    }
}
