//! The one way every writer of weightlift opens its output (packs, unpacked files, manifests, generated
//! checkpoints, `save_file`): refused when it would replace an input or something that is not a regular file, then
//! written into a temporary file beside it, fsynced, renamed over it and the folder fsynced, so a crash or a kill
//! at any point leaves either the old file or the new one, never a mix, and the new file keeps the old one's mode
//! (and, where allowed, its owner), as `cp` or an editor writing over a file keeps them.
//!
//! The temporary file is unnamed (`O_TMPFILE` in the target's folder: it must be on the same filesystem for the
//! rename to be atomic) until the write is complete: only then is it linked under a temporary name and renamed over
//! the target. A writer killed while it writes, even by SIGKILL, leaves nothing behind: the kernel frees an
//! unnamed file with its last descriptor. Two writers of one target never share a file: the last rename wins and
//! both leave a whole file.
//!
//! The temporary name, `NAME.weightlift-tmp-PID-NONCE`, lives only between the link and the rename, or for the
//! whole write where the filesystem has no `O_TMPFILE` (see `open_unnamed` for when). A writer killed while it has a
//! name leaves it behind, so every write first removes the temporary files of earlier writes to the same target
//! whose writer is gone. "Gone" is decided by a lock, not by the PID (which the system reuses): a writer holds an
//! exclusive `flock` on its temporary file from the moment it exists (named or not) until after the rename, and
//! the kernel drops that lock when the writer dies, however it dies. A temporary file whose lock can be taken has
//! no writer. A writer stopped by a signal it can catch removes its own temporary files first ([`remove_pending`]).

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::FlockOperation;

use crate::error::{ErrorKind, FormatError};
use crate::regular::{self, Access, NodeKind};

const MARKER: &str = ".weightlift-tmp-";

/// The temporary files of this process's writes in progress, for [`remove_pending`].
static PENDING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn pending() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    PENDING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes the temporary files of every write in progress in this process and returns them: what a program does
/// on SIGINT or SIGTERM before it exits, so that an interrupted write leaves nothing behind. The writes themselves
/// then fail (or their renames do); the targets keep their old contents.
pub fn remove_pending() -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for tmp in pending().drain(..) {
        if fs::remove_file(&tmp).is_ok() {
            removed.push(tmp);
        }
    }
    removed
}

/// `NAME.weightlift-tmp-`: what every temporary file of a write to `path` starts with.
fn temp_prefix(path: &Path) -> OsString {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(MARKER);
    name
}

/// A fresh temporary name: the PID says who wrote it (for people); the nonce keeps names unique when a PID comes
/// back, so a new file never takes the name of a stale one.
fn temp_path(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let nonce = nanos ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_right(17);
    let mut name = temp_prefix(path);
    name.push(format!("{}-{nonce:x}", std::process::id()));
    path.with_file_name(name)
}

fn dir_of(path: &Path) -> &Path {
    path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

fn same_inode(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// Removes the temporary files that earlier writes to `path` left behind and whose writer is gone (see the module
/// documentation); a live writer's file is left alone. Returns the files removed. Best effort: a file that cannot
/// be examined is left where it is.
pub fn remove_stale_temps(path: &Path) -> Vec<PathBuf> {
    let prefix = temp_prefix(path);
    let Ok(entries) = fs::read_dir(dir_of(path)) else { return Vec::new() };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(suffix) = name.as_encoded_bytes().strip_prefix(prefix.as_encoded_bytes()) else { continue };
        let Some(pid) = writer_pid(suffix) else { continue };
        let candidate = entry.path();
        if remove_if_unlocked(&candidate, pid) {
            removed.push(candidate);
        }
    }
    removed
}

/// The PID in a temporary name's suffix: `PID-NONCE` (locked while written), or `PID` alone (written by versions
/// that held no lock, so only a dead PID tells such a file is stale). `None` for names that are not ours.
fn writer_pid(suffix: &[u8]) -> Option<(i32, bool)> {
    let text = std::str::from_utf8(suffix).ok()?;
    let (pid, locked) = match text.split_once('-') {
        Some((pid, nonce)) if !nonce.is_empty() && nonce.bytes().all(|b| b.is_ascii_hexdigit()) => (pid, true),
        Some(_) => return None,
        None => (text, false),
    };
    Some((pid.parse().ok()?, locked))
}

fn remove_if_unlocked(candidate: &Path, (pid, locked): (i32, bool)) -> bool {
    if !locked {
        let alive = rustix::process::Pid::from_raw(pid)
            .is_some_and(|p| rustix::process::test_kill_process(p) != Err(rustix::io::Errno::SRCH));
        if alive {
            return false;
        }
    }
    // Never blocks: a FIFO or device planted under a temporary name is refused, not opened.
    let Ok(file) = regular::open(candidate, Access::READ) else { return false };
    if rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
        return false; // its writer is alive
    }
    // The name must still be the file we locked (not, say, a symlink to it): only then is removing it safe.
    let still_ours = match (fs::symlink_metadata(candidate), file.metadata()) {
        (Ok(named), Ok(locked)) => same_inode(&named, &locked),
        _ => false,
    };
    still_ours && fs::remove_file(candidate).is_ok()
}

/// Refuses `target` when it exists and is not a regular file (a device node, a FIFO, a folder: the rename would
/// replace it) or when it is the same file as one of `inputs` (by device and inode, so through any link or name):
/// the write would destroy what it reads. Returns the existing target's metadata, if any.
pub fn check_target(target: &Path, inputs: &[&Path]) -> Result<Option<fs::Metadata>, FormatError> {
    let existing = match fs::metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FormatError::new(target, ErrorKind::Open(e))),
    };
    if !existing.is_file() {
        let st = rustix::fs::stat(target).map_err(|e| FormatError::new(target, ErrorKind::Open(e.into())))?;
        let node = NodeKind::of(rustix::fs::FileType::from_raw_mode(st.st_mode)).unwrap_or(NodeKind::Other);
        return Err(FormatError::new(target, ErrorKind::OutputNotAFile { node }));
    }
    for input in inputs {
        if fs::metadata(input).is_ok_and(|m| same_inode(&m, &existing)) {
            return Err(FormatError::new(target, ErrorKind::OutputIsInput { input: input.to_path_buf() }));
        }
    }
    Ok(Some(existing))
}

/// An output being written: a locked temporary file beside its target (unnamed where the filesystem allows),
/// renamed over the target by [`Output::commit`], removed if dropped before.
#[derive(Debug)]
pub struct Output {
    target: PathBuf,
    /// The temporary file's name: `None` while it has none (`O_TMPFILE`).
    tmp: Option<PathBuf>,
    file: File,
    /// The permission bits, owner and group the target had (a private file stays private), or `None` for a new
    /// file.
    replaced: Option<Replaced>,
    removed_stale: Vec<PathBuf>,
    committed: bool,
}

impl Output {
    /// Starts writing `target` after checking it ([`check_target`] against `inputs`) and removing stale temporary
    /// files of earlier writes to it.
    pub fn create(target: &Path, inputs: &[&Path]) -> Result<Output, FormatError> {
        Output::create_with(target, inputs, true)
    }

    /// `try_unnamed` false (tests only) takes the named temporary file that filesystems without `O_TMPFILE` get.
    fn create_with(target: &Path, inputs: &[&Path], try_unnamed: bool) -> Result<Output, FormatError> {
        let replaced = check_target(target, inputs)?.map(|m| Replaced {
            mode: m.permissions().mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
        });
        let removed_stale = remove_stale_temps(target);
        let mode = replaced.map_or(0o666, |r| r.mode);
        let unnamed = if try_unnamed { open_unnamed(target, mode)? } else { None };
        let (tmp, file) = match unnamed {
            Some(file) => (None, file),
            None => create_locked_temp(target, mode).map(|(tmp, file)| (Some(tmp), file))?,
        };
        Ok(Output { target: target.to_path_buf(), tmp, file, replaced, removed_stale, committed: false })
    }

    /// The temporary files of interrupted earlier writes that [`Output::create`] removed (for the caller's log).
    pub fn removed_stale(&self) -> &[PathBuf] {
        &self.removed_stale
    }

    /// The temporary file to write into.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The temporary file's name, while it has one (none while an unnamed file is written).
    pub fn temp_path(&self) -> Option<&Path> {
        self.tmp.as_deref()
    }

    /// The path the file takes on `commit`.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Makes the written bytes the target: fsync, the old file's owner and mode, a name for an unnamed file,
    /// rename, fsync of the folder.
    pub fn commit(mut self) -> Result<(), FormatError> {
        let err = |e: io::Error| FormatError::new(&self.target, ErrorKind::Write(e));
        self.file.sync_all().map_err(err)?;
        if let Some(r) = self.replaced {
            let ours = self.file.metadata().map_err(err)?;
            if (ours.uid(), ours.gid()) != (r.uid, r.gid) {
                // Best effort, as editors do: only root may give a file away, and a group must be one's own.
                let _ = std::os::unix::fs::fchown(&self.file, Some(r.uid), Some(r.gid));
            }
            // After the owner: a change of owner clears the set-user-ID and set-group-ID bits.
            self.file.set_permissions(fs::Permissions::from_mode(r.mode)).map_err(err)?;
        }
        let tmp = match &self.tmp {
            Some(tmp) => tmp.clone(),
            None => {
                // linkat cannot replace a file, so the complete file gets a temporary name first, then the rename.
                let tmp = link_unnamed(&self.file, &self.target)?;
                self.tmp = Some(tmp.clone());
                tmp
            }
        };
        // The lock (on `file`) is held through the rename: until then a cleaner must not take the file for stale.
        fs::rename(&tmp, &self.target).map_err(err)?;
        self.committed = true;
        File::open(dir_of(&self.target)).and_then(|d| d.sync_all()).map_err(err)
    }
}

#[derive(Clone, Copy, Debug)]
struct Replaced {
    mode: u32,
    uid: u32,
    gid: u32,
}

impl Drop for Output {
    fn drop(&mut self) {
        if let Some(tmp) = &self.tmp {
            if !self.committed {
                let _ = fs::remove_file(tmp);
            }
            pending().retain(|p| p != tmp);
        }
    }
}

/// An unnamed temporary file (`O_TMPFILE`) in `path`'s folder with `mode`, locked, or `None` where the filesystem
/// or kernel has none (`EOPNOTSUPP` from a filesystem without it, `EISDIR` from a kernel older than 3.11, which
/// reads the flag as `O_DIRECTORY`, `EINVAL` from some network and FUSE filesystems) or where this process could
/// not give it a name later (no `/proc`, and `AT_EMPTY_PATH` needs a privilege on older kernels): the write then
/// takes a named temporary file, which a SIGKILL leaves behind until the next write to `path` removes it.
fn open_unnamed(path: &Path, mode: u32) -> Result<Option<File>, FormatError> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC;
    let file = match rustix::fs::open(dir_of(path), flags, Mode::from_raw_mode(mode)) {
        Ok(fd) => File::from(fd),
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR | rustix::io::Errno::INVAL) => return Ok(None),
        Err(e) => return Err(FormatError::new(path, ErrorKind::Open(e.into()))), // the name the user gave
    };
    if !Path::new("/proc/self/fd").is_dir() {
        return Ok(None);
    }
    // No one else can reach the file yet: the lock is free, and held from here through the rename.
    rustix::fs::flock(&file, FlockOperation::LockExclusive)
        .map_err(|e| FormatError::new(path, ErrorKind::Open(e.into())))?;
    Ok(Some(file))
}

/// Gives the complete unnamed `file` a fresh temporary name beside `target` (listed for [`remove_pending`] until
/// the rename) and returns it. Through `/proc/self/fd`, which needs no privilege; `AT_EMPTY_PATH` where `/proc` went
/// away since the file was opened.
fn link_unnamed(file: &File, target: &Path) -> Result<PathBuf, FormatError> {
    use rustix::fs::{AtFlags, CWD};
    use std::os::fd::AsRawFd;
    let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let mut last = io::Error::other("no free temporary name");
    for _ in 0..3 {
        let tmp = temp_path(target);
        pending().push(tmp.clone());
        let linked = match rustix::fs::linkat(CWD, &proc_path, CWD, &tmp, AtFlags::SYMLINK_FOLLOW) {
            Err(rustix::io::Errno::NOENT) => rustix::fs::linkat(file, "", CWD, &tmp, AtFlags::EMPTY_PATH),
            other => other,
        };
        match linked {
            Ok(()) => return Ok(tmp),
            Err(e) => {
                pending().retain(|p| p != &tmp);
                last = e.into();
                if last.kind() != io::ErrorKind::AlreadyExists {
                    break;
                }
            }
        }
    }
    Err(FormatError::new(target, ErrorKind::Write(last)))
}

/// Creates a named temporary file for `path` (with `mode`, the target's, so a private file's bytes are never
/// readable by others, even while written) and locks it. A cleaner may take the lock in the instant between the
/// file's creation and our lock and remove it as stale; the name then no longer leads to our file, and we start
/// again.
fn create_locked_temp(path: &Path, mode: u32) -> Result<(PathBuf, File), FormatError> {
    for _ in 0..3 {
        let tmp = temp_path(path);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(|e| FormatError::new(path, ErrorKind::Open(e)))?; // the name the user gave (a missing folder)
        pending().push(tmp.clone());
        rustix::fs::flock(&file, FlockOperation::LockExclusive)
            .map_err(|e| FormatError::new(&tmp, ErrorKind::Open(e.into())))?;
        let ours = match (fs::symlink_metadata(&tmp), file.metadata()) {
            (Ok(named), Ok(locked)) => same_inode(&named, &locked),
            _ => false,
        };
        if ours {
            return Ok((tmp, file));
        }
        pending().retain(|p| p != &tmp);
    }
    let cause = io::Error::other("removed by another process three times while being created");
    Err(FormatError::new(path, ErrorKind::Open(cause)))
}

/// Writes `target` with the bytes `fill` writes into its temporary file (see [`Output`]).
pub fn write_with(
    target: &Path,
    inputs: &[&Path],
    fill: impl FnOnce(&mut io::BufWriter<File>) -> io::Result<()>,
) -> Result<(), FormatError> {
    let out = Output::create(target, inputs)?;
    let err = |e: io::Error| FormatError::new(target, ErrorKind::Write(e));
    let mut w = io::BufWriter::with_capacity(8 << 20, out.file().try_clone().map_err(err)?);
    fill(&mut w).map_err(err)?;
    w.into_inner().map_err(|e| err(e.into_error()))?;
    out.commit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_atomically_and_leaves_the_old_file_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_with(&path, &[], |w| w.write_all(b"first")).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"first");
        let failed = write_with(&path, &[], |w| {
            w.write_all(b"half of the second")?;
            Err(io::Error::other("killed midway"))
        });
        assert!(failed.is_err());
        assert_eq!(fs::read(&path).unwrap(), b"first");
        assert_eq!(names(dir.path()), ["f"], "temporary file left behind");
        write_with(&path, &[], |w| w.write_all(b"second")).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
    }

    #[test]
    fn an_input_is_never_replaced_by_any_name() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("a.safetensors");
        fs::write(&input, b"the checkpoint").unwrap();
        let hard = dir.path().join("hard");
        fs::hard_link(&input, &hard).unwrap();
        let soft = dir.path().join("soft");
        std::os::unix::fs::symlink(&input, &soft).unwrap();
        let dotted = dir.path().join(".").join("a.safetensors");
        for target in [&input, &hard, &soft, &dotted] {
            let e = Output::create(target, &[&input]).expect_err("wrote over its input");
            assert!(matches!(e.kind, ErrorKind::OutputIsInput { .. }), "{e}");
            assert!(e.to_string().contains("a.safetensors"), "{e}");
        }
        assert_eq!(fs::read(&input).unwrap(), b"the checkpoint");
        assert_eq!(names(dir.path()), ["a.safetensors", "hard", "soft"]);
    }

    #[test]
    fn a_device_fifo_or_folder_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
        for (target, node) in [
            (Path::new("/dev/null"), NodeKind::CharDevice),
            (fifo.as_path(), NodeKind::Fifo),
            (dir.path(), NodeKind::Directory),
        ] {
            match Output::create(target, &[]) {
                Err(FormatError { kind: ErrorKind::OutputNotAFile { node: found }, .. }) => assert_eq!(found, node),
                other => panic!("{}: {other:?}", target.display()),
            }
        }
        use std::os::unix::fs::FileTypeExt;
        assert!(Path::new("/dev/null").metadata().unwrap().file_type().is_char_device());
        assert!(fs::metadata(&fifo).unwrap().file_type().is_fifo());
    }

    /// Whether `dir`'s filesystem takes `O_TMPFILE` here; if not, says so (the named fallback is tested anyway).
    fn unnamed_temps_work(dir: &Path) -> bool {
        let out = Output::create(&dir.join("probe"), &[]).unwrap();
        let unnamed = out.temp_path().is_none();
        if !unnamed {
            eprintln!("skipped: {} takes no O_TMPFILE here; only the named temporary file is tested", dir.display());
        }
        unnamed
    }

    #[test]
    fn the_temporary_file_is_invisible_while_written() {
        let dir = tempfile::tempdir().unwrap();
        if !unnamed_temps_work(dir.path()) {
            return;
        }
        let path = dir.path().join("big");
        fs::write(&path, b"old").unwrap();
        let out = Output::create(&path, &[]).unwrap();
        use std::os::unix::fs::FileExt;
        out.file().write_all_at(&[7u8; 1 << 20], 0).unwrap();
        assert_eq!(names(dir.path()), ["big"], "the file being written has a name");
        assert!(pending().iter().all(|p| !p.starts_with(dir.path())), "nothing to remove on a signal");
        out.commit().unwrap();
        assert_eq!(names(dir.path()), ["big"]);
        assert_eq!(fs::read(&path).unwrap(), [7u8; 1 << 20]);
        // Dropped before its commit, it leaves nothing either, and the old file stays.
        let out = Output::create(&path, &[]).unwrap();
        out.file().write_all_at(b"never committed", 0).unwrap();
        drop(out);
        assert_eq!(names(dir.path()), ["big"]);
        assert_eq!(fs::read(&path).unwrap(), [7u8; 1 << 20]);
    }

    #[test]
    fn the_mode_of_the_replaced_file_is_kept() {
        for unnamed in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("private");
            let write = |bytes: &[u8]| {
                let out = Output::create_with(&path, &[], unnamed).unwrap();
                out.file().write_all(bytes).unwrap();
                out.commit().unwrap();
            };
            // A new file gets the mode any new file gets (0o666 less the umask).
            write(b"new");
            let plain = dir.path().join("plain");
            File::create(&plain).unwrap();
            let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode(&path), mode(&plain), "unnamed: {unnamed}");
            for m in [0o600, 0o640, 0o755] {
                fs::set_permissions(&path, fs::Permissions::from_mode(m)).unwrap();
                write(b"newer");
                assert_eq!(mode(&path), m, "unnamed: {unnamed}");
            }
            // Where this process may give files away (root), the owner is kept too.
            let before = fs::metadata(&path).unwrap();
            if std::os::unix::fs::chown(&path, Some(12345), Some(12345)).is_ok() {
                write(b"newest");
                let after = fs::metadata(&path).unwrap();
                assert_eq!((after.uid(), after.gid()), (12345, 12345), "unnamed: {unnamed}");
                assert_eq!(
                    after.permissions().mode() & 0o7777,
                    before.permissions().mode() & 0o7777,
                    "unnamed: {unnamed}"
                );
                assert_eq!(fs::read(&path).unwrap(), b"newest");
            }
        }
    }

    #[test]
    fn two_writers_of_one_target_each_write_their_own_file() {
        for unnamed in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("out");
            let a = Output::create_with(&path, &[], unnamed).unwrap();
            let b = Output::create_with(&path, &[], unnamed).unwrap();
            if !unnamed {
                assert_ne!(a.temp_path(), b.temp_path());
            }
            use std::os::unix::fs::FileExt;
            a.file().write_all_at(b"from a", 0).unwrap();
            b.file().write_all_at(b"from b", 0).unwrap();
            a.commit().unwrap();
            assert_eq!(fs::read(&path).unwrap(), b"from a");
            b.commit().unwrap();
            assert_eq!(fs::read(&path).unwrap(), b"from b");
            assert_eq!(names(dir.path()), ["out"]);
        }
    }

    // `remove_pending` itself removes every write's file in the process, other tests' too: the CLI's tests send
    // the signals (`cli.rs::an_interrupted_pack_or_unpack_leaves_nothing_behind`).
    #[test]
    fn writes_in_progress_are_listed_for_removal_until_they_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        fs::write(&path, b"old").unwrap();
        let out = Output::create_with(&path, &[], false).unwrap();
        let tmp = out.temp_path().unwrap().to_path_buf();
        assert!(pending().contains(&tmp));
        fs::remove_file(&tmp).unwrap(); // what remove_pending does to it
        assert!(out.commit().is_err(), "a write whose temporary file was removed must not succeed");
        assert!(!pending().contains(&tmp));
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["big"]);
    }

    #[test]
    fn only_our_names_with_a_pid_are_candidates() {
        assert_eq!(writer_pid(b"123-9f0a"), Some((123, true)));
        assert_eq!(writer_pid(b"123"), Some((123, false)));
        for other in [&b"123-"[..], b"123-xyz", b"abc", b"", b"12-3-4", b"-5"] {
            assert_eq!(writer_pid(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    #[test]
    fn stale_temps_go_and_locked_or_foreign_files_stay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let named = |suffix: &str| dir.path().join(format!("m.safetensors{MARKER}{suffix}"));
        // Unlocked, new-style: stale whatever its PID (ours here: a PID proves nothing).
        fs::write(named(&format!("{}-1f", std::process::id())), b"partial").unwrap();
        // Old-style name of a PID that cannot exist: stale. Old-style name of a live PID (ours): kept.
        fs::write(named("2147483646"), b"partial").unwrap();
        fs::write(named(&std::process::id().to_string()), b"partial").unwrap();
        // Locked by a writer (another open file description of this process): kept.
        let live = named("7-abc");
        fs::write(&live, b"being written").unwrap();
        let holder = File::open(&live).unwrap();
        rustix::fs::flock(&holder, FlockOperation::LockExclusive).unwrap();
        // Not ours: another target's temporary file, and a name without a PID.
        fs::write(dir.path().join(format!("other{MARKER}1-1")), b"x").unwrap();
        fs::write(named("notes"), b"x").unwrap();
        // A FIFO under a temporary name is neither opened (which would block) nor removed.
        rustix::fs::mkfifoat(rustix::fs::CWD, named("9-9"), rustix::fs::Mode::from_raw_mode(0o600)).unwrap();

        write_with(&path, &[], |w| w.write_all(b"new")).unwrap();
        let mut expected = vec![
            "m.safetensors".to_string(),
            format!("m.safetensors{MARKER}{}", std::process::id()),
            format!("m.safetensors{MARKER}7-abc"),
            format!("m.safetensors{MARKER}9-9"),
            format!("m.safetensors{MARKER}notes"),
            format!("other{MARKER}1-1"),
        ];
        expected.sort();
        assert_eq!(names(dir.path()), expected);
        drop(holder);
        assert_eq!(remove_stale_temps(&path), vec![live]);
    }
}
