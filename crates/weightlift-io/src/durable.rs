//! Durable whole-file writes: the new contents go to a temporary file beside the target, are fsynced, renamed over
//! the target, and the directory is fsynced, so a crash or a kill at any point leaves either the old file or the new
//! one, never a mix.
//!
//! The temporary file is `NAME.weightlift-tmp-PID-NONCE` in the target's directory (it must be on the same
//! filesystem for the rename to be atomic). A writer killed before the rename leaves it behind, so every write first
//! removes the temporary files of earlier writes to the same target whose writer is gone. "Gone" is decided by a
//! lock, not by the PID (which the system reuses): a writer holds an exclusive `flock` on its temporary file from
//! the moment it exists until after the rename, and the kernel drops that lock when the writer dies, however it
//! dies. A temporary file whose lock can be taken has no writer.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::FlockOperation;
use weightlift_format::regular::{self, Access};

use crate::error::IoError;

const MARKER: &str = ".weightlift-tmp-";

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

/// Creates a temporary file for `path` and locks it. A cleaner may take the lock in the instant between the file's
/// creation and our lock and remove it as stale; the name then no longer leads to our file, and we start again.
fn create_locked_temp(path: &Path) -> Result<(PathBuf, File), IoError> {
    let mut attempts = 0;
    loop {
        let tmp = temp_path(path);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|cause| IoError::Open { path: tmp.clone(), cause })?;
        rustix::fs::flock(&file, FlockOperation::LockExclusive)
            .map_err(|e| IoError::Open { path: tmp.clone(), cause: e.into() })?;
        let ours = match (fs::symlink_metadata(&tmp), file.metadata()) {
            (Ok(named), Ok(locked)) => same_inode(&named, &locked),
            _ => false,
        };
        if ours {
            return Ok((tmp, file));
        }
        attempts += 1;
        if attempts == 3 {
            let cause = io::Error::other("removed by another process three times while being created");
            return Err(IoError::Open { path: tmp, cause });
        }
    }
}

/// Writes `path` with the bytes `fill` produces, atomically and durably, after removing stale temporary files of
/// earlier writes to `path` (see the module documentation).
pub fn write_atomically(path: &Path, fill: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>) -> Result<(), IoError> {
    let removed = remove_stale_temps(path);
    if !removed.is_empty() {
        tracing::info!(?removed, "removed temporary files of interrupted writes");
    }
    let (tmp, file) = create_locked_temp(path)?;
    let err = |cause: io::Error| IoError::Write { path: path.to_path_buf(), offset: 0, len: 0, cause };
    let result = (|| {
        let mut out = BufWriter::with_capacity(8 << 20, file.try_clone()?);
        fill(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        // The lock (on `file`) is held through the rename: until then a cleaner must not take the file for stale.
        fs::rename(&tmp, path)?;
        File::open(dir_of(path))?.sync_all()
    })();
    drop(file);
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn replaces_atomically_and_leaves_the_old_file_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomically(&path, |w| w.write_all(b"first")).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"first");
        let failed = write_atomically(&path, |w| {
            w.write_all(b"half of the second")?;
            Err(io::Error::other("killed midway"))
        });
        assert!(failed.is_err());
        assert_eq!(fs::read(&path).unwrap(), b"first");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "temporary file left behind");
        write_atomically(&path, |w| w.write_all(b"second")).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
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

        write_atomically(&path, |w| w.write_all(b"new")).unwrap();
        let mut left: Vec<String> =
            fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        let mut expected = vec![
            "m.safetensors".to_string(),
            format!("m.safetensors{MARKER}{}", std::process::id()),
            format!("m.safetensors{MARKER}7-abc"),
            format!("m.safetensors{MARKER}9-9"),
            format!("m.safetensors{MARKER}notes"),
            format!("other{MARKER}1-1"),
        ];
        expected.sort();
        assert_eq!(left, expected);
        drop(holder);
        assert_eq!(remove_stale_temps(&path), vec![live]);
    }
}
