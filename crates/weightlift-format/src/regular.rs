//! Opening a path only if it names a regular file, without blocking on anything else.
//!
//! `open(2)` of a FIFO for reading waits for a writer, a read from a character device may wait forever, and a
//! socket cannot be opened at all; a checkpoint path naming one of them must fail at once, naming what it is. So
//! the path is `stat`ed first (nothing is opened when it already names something else), then opened with
//! `O_NONBLOCK` (an open that cannot block even if the path was swapped in between), checked again with `fstat` on
//! the descriptor (the check that counts: it concerns the very object opened), and only then is `O_NONBLOCK`
//! cleared, since io_uring would return `EAGAIN` for reads of uncached pages of a non-blocking descriptor.

use std::fmt;
use std::fs::File;
use std::io;
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags};

/// What a path names when it is not a regular file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// A directory.
    Directory,
    /// A named pipe.
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// Anything else.
    Other,
}

impl NodeKind {
    pub(crate) fn of(file_type: FileType) -> Option<NodeKind> {
        match file_type {
            FileType::RegularFile => None,
            FileType::Directory => Some(NodeKind::Directory),
            FileType::Fifo => Some(NodeKind::Fifo),
            FileType::Socket => Some(NodeKind::Socket),
            FileType::CharacterDevice => Some(NodeKind::CharDevice),
            FileType::BlockDevice => Some(NodeKind::BlockDevice),
            FileType::Symlink | FileType::Unknown => Some(NodeKind::Other),
        }
    }

    /// Why this kind of file is refused, as the end of a sentence that starts with the path.
    pub fn refusal(self) -> &'static str {
        match self {
            NodeKind::Directory => "is a directory, not a regular file",
            // Said of reads and of writes alike (save_file to a device node is refused with the same words).
            NodeKind::Fifo => "is a FIFO (named pipe), not a regular file",
            NodeKind::Socket => "is a socket, not a regular file",
            NodeKind::CharDevice => "is a character device, not a regular file",
            NodeKind::BlockDevice => {
                "is a block device: checkpoints load from regular files, block devices only through LBA reads"
            }
            NodeKind::Other => "is not a regular file",
        }
    }
}

impl fmt::Display for NodeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeKind::Directory => "directory",
            NodeKind::Fifo => "FIFO",
            NodeKind::Socket => "socket",
            NodeKind::CharDevice => "character device",
            NodeKind::BlockDevice => "block device",
            NodeKind::Other => "non-regular file",
        })
    }
}

/// How to open: read or write access, `O_CREAT`, `O_DIRECT`, and whether block devices are accepted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// Open for writing as well as reading.
    pub write: bool,
    /// Create the file if missing (`O_CREAT`).
    pub create: bool,
    /// Bypass the page cache (`O_DIRECT`).
    pub direct: bool,
    /// Block devices are refused unless the caller reads them by LBA.
    pub block_devices: bool,
}

impl Access {
    /// Read-only.
    pub const READ: Access = Access { write: false, create: false, direct: false, block_devices: false };
    /// Write-only, creating the file if it is missing (never truncating).
    pub const WRITE_CREATE: Access = Access { write: true, create: true, direct: false, block_devices: false };

    /// The same access with `O_DIRECT`.
    pub fn direct(self) -> Access {
        Access { direct: true, ..self }
    }

    fn flags(self) -> OFlags {
        let mut flags = OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
        flags |= if self.write { OFlags::WRONLY } else { OFlags::RDONLY };
        if self.create {
            flags |= OFlags::CREATE;
        }
        if self.direct {
            flags |= OFlags::DIRECT;
        }
        flags
    }

    fn refuses(self, kind: NodeKind) -> bool {
        !(kind == NodeKind::BlockDevice && self.block_devices)
    }
}

/// Why [`open`] failed.
#[derive(Debug)]
pub enum OpenError {
    /// The system refused (missing, permission, ...). A directory is reported here as `IsADirectory`, as the
    /// standard library reports it, so callers keep mapping it to their "is a directory" error.
    Io(io::Error),
    /// The path names something that is not a regular file.
    NotAFile(NodeKind),
}

fn refused(st: &rustix::fs::Stat, access: Access) -> Option<NodeKind> {
    NodeKind::of(FileType::from_raw_mode(st.st_mode)).filter(|&kind| access.refuses(kind))
}

/// Opens `path` as [`Access`] says if it names a regular file (or an accepted block device), never blocking.
pub fn open(path: &Path, access: Access) -> Result<File, OpenError> {
    let refuse = |kind: NodeKind| match kind {
        NodeKind::Directory => OpenError::Io(io::Error::new(io::ErrorKind::IsADirectory, "is a directory")),
        kind => OpenError::NotAFile(kind),
    };
    // Following symlinks, as open does. A failed stat falls through to open, whose error is the one to report.
    if let Some(kind) = rustix::fs::stat(path).ok().and_then(|st| refused(&st, access)) {
        return Err(refuse(kind));
    }
    let fd = match rustix::fs::open(path, access.flags(), Mode::from_raw_mode(0o666)) {
        Ok(fd) => fd,
        // ENXIO: a socket, or a FIFO opened for writing with no reader; name it if it still is one.
        Err(e) if e == rustix::io::Errno::NXIO => {
            let kind = rustix::fs::stat(path).ok().and_then(|st| NodeKind::of(FileType::from_raw_mode(st.st_mode)));
            return Err(kind.map_or_else(|| OpenError::Io(e.into()), refuse));
        }
        Err(e) => return Err(OpenError::Io(e.into())),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| OpenError::Io(e.into()))?;
    if let Some(kind) = refused(&st, access) {
        return Err(refuse(kind));
    }
    let flags = rustix::fs::fcntl_getfl(&fd).map_err(|e| OpenError::Io(e.into()))?;
    rustix::fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK).map_err(|e| OpenError::Io(e.into()))?;
    Ok(File::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::time::{Duration, Instant};

    fn kind_of(result: Result<File, OpenError>) -> Option<NodeKind> {
        match result {
            Err(OpenError::NotAFile(kind)) => Some(kind),
            Err(OpenError::Io(e)) if e.kind() == io::ErrorKind::IsADirectory => Some(NodeKind::Directory),
            Err(OpenError::Io(e)) => panic!("unexpected I/O error: {e}"),
            Ok(_) => None,
        }
    }

    #[test]
    fn refuses_each_kind_of_non_regular_file_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, Mode::from_raw_mode(0o600)).unwrap();
        let sock = dir.path().join("sock");
        let _listener = UnixListener::bind(&sock).unwrap();
        let t0 = Instant::now();
        for access in [Access::READ, Access::WRITE_CREATE, Access::READ.direct()] {
            assert_eq!(kind_of(open(&fifo, access)), Some(NodeKind::Fifo));
            assert_eq!(kind_of(open(&sock, access)), Some(NodeKind::Socket));
            assert_eq!(kind_of(open(Path::new("/dev/null"), access)), Some(NodeKind::CharDevice));
            assert_eq!(kind_of(open(dir.path(), access)), Some(NodeKind::Directory));
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "an open blocked");
    }

    #[test]
    fn a_regular_file_opens_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"bytes").unwrap();
        let file = open(&path, Access::READ).unwrap();
        assert!(!rustix::fs::fcntl_getfl(&file).unwrap().contains(OFlags::NONBLOCK));
        assert_eq!(
            std::fs::read_to_string(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file))).unwrap(),
            "bytes"
        );
        let created = dir.path().join("new");
        drop(open(&created, Access::WRITE_CREATE).unwrap());
        assert!(created.is_file());
        match open(&dir.path().join("missing"), Access::READ) {
            Err(OpenError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn block_devices_are_refused_unless_asked_for() {
        let Some(dev) =
            ["/dev/loop0", "/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/ram0"].into_iter().map(Path::new).find(|p| {
                rustix::fs::stat(*p).is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::BlockDevice)
            })
        else {
            println!("skipped: no block device node found to open");
            return;
        };
        assert_eq!(kind_of(open(dev, Access::READ)), Some(NodeKind::BlockDevice));
        let lba = Access { block_devices: true, ..Access::READ };
        match open(dev, lba) {
            Ok(_) => {}
            Err(OpenError::Io(e)) => println!("{}: allowed but not openable here: {e}", dev.display()),
            Err(OpenError::NotAFile(k)) => {
                panic!("{}: refused as {k} though block devices were allowed", dev.display())
            }
        }
    }
}
