//! The on-disk cache of compiled kernels: `kernels/` under `WEIGHTLIFT_CACHE`, else `$XDG_CACHE_HOME/weightlift`,
//! else `~/.cache/weightlift`. A shared folder anyone may have written into: what is found there is read only if it
//! is a regular file (a FIFO or a device under a cache name would block the reader or feed it anything), not
//! through a symlink, and no larger than [`MAX_ENTRY`]; anything else is a miss, compiled again. Entries are
//! written atomically (see [`weightlift_io::durable`]), so a reader never sees part of one. Needs no GPU.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// No kernel of weightlift compiles to more than a few hundred KiB; a larger file is not ours.
pub(crate) const MAX_ENTRY: u64 = 16 << 20;

/// The cache folder, or `None` where no variable names one.
pub(crate) fn dir() -> Option<PathBuf> {
    let base = std::env::var_os("WEIGHTLIFT_CACHE").map(PathBuf::from).or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("weightlift"))
    })?;
    Some(base.join("kernels"))
}

/// The bytes of the entry `file`, or `None` for a miss: absent, unreadable, not a regular file, a symlink or larger
/// than `MAX_ENTRY` (the last three said in a warning: someone put them there). Never blocks on what it finds.
pub(crate) fn read(file: &Path) -> Option<Vec<u8>> {
    // O_NONBLOCK: opening a FIFO for reading would wait for a writer. O_NOFOLLOW: an entry is a file, not a link.
    let opened = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW).open(file);
    let f = match opened {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return refuse(file, "is a symlink"),
        Err(_) => return None, // a plain miss
    };
    let meta = f.metadata().ok()?;
    if !meta.is_file() {
        return refuse(file, "is not a regular file");
    }
    if meta.len() > MAX_ENTRY {
        return refuse(file, "is larger than any kernel");
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The cap again: the file may grow while it is read.
    f.take(MAX_ENTRY + 1).read_to_end(&mut bytes).ok()?;
    if bytes.len() as u64 > MAX_ENTRY {
        return refuse(file, "is larger than any kernel");
    }
    Some(bytes)
}

fn refuse(file: &Path, why: &str) -> Option<Vec<u8>> {
    tracing::warn!("kernel cache entry {} {why}: ignored, the kernel is compiled again", file.display());
    None
}

/// Writes `bytes` as the entry `file`, atomically. A cache that cannot be written only costs the next process a
/// compilation, so a failure is only logged; something other than a regular file at `file` is never replaced.
pub(crate) fn store(file: &Path, bytes: &[u8]) {
    let write = || -> Result<(), String> {
        let dir = file.parent().ok_or("no folder")?;
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        weightlift_io::durable::write_atomically(file, |w| w.write_all(bytes)).map_err(|e| e.to_string())
    };
    if let Err(e) = write() {
        tracing::debug!("kernel cache not written ({}): {e}", file.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Runs `read` in a thread and fails the test (rather than hanging it) if it blocks.
    fn read_within(file: &Path, limit: Duration) -> Option<Vec<u8>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let owned = file.to_path_buf();
        std::thread::spawn(move || {
            let _ = tx.send(read(&owned));
        });
        rx.recv_timeout(limit).unwrap_or_else(|_| panic!("reading {} blocked", file.display()))
    }

    #[test]
    fn a_fifo_device_or_symlink_in_the_cache_is_a_miss_and_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("k-fifo.ptx");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let real = dir.path().join("real.ptx");
        std::fs::write(&real, b"some ptx").unwrap();
        let link = dir.path().join("k-link.ptx");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let t0 = Instant::now();
        for refused in [fifo.as_path(), Path::new("/dev/zero"), Path::new("/dev/null"), dir.path(), &link] {
            assert_eq!(read_within(refused, Duration::from_secs(5)), None, "{}", refused.display());
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(read(&real).as_deref(), Some(&b"some ptx"[..]));
        assert_eq!(read(&dir.path().join("absent.ptx")), None);
    }

    #[test]
    fn an_entry_larger_than_any_kernel_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.ptx");
        std::fs::File::create(&big).unwrap().set_len(MAX_ENTRY + 1).unwrap();
        assert_eq!(read(&big), None);
        std::fs::File::create(&big).unwrap().set_len(MAX_ENTRY).unwrap();
        assert_eq!(read(&big).map(|b| b.len() as u64), Some(MAX_ENTRY));
    }

    #[test]
    fn entries_are_written_whole_and_nothing_else_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kernels").join("k-1.ptx");
        store(&file, b"first");
        store(&file, b"second");
        assert_eq!(read(&file).as_deref(), Some(&b"second"[..]));
        let names: Vec<_> =
            std::fs::read_dir(file.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["k-1.ptx"], "a temporary file was left");
        // A FIFO under an entry's name: the store neither blocks on it nor replaces it.
        let fifo = dir.path().join("kernels").join("k-2.ptx");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || {
            store(&f, b"ptx");
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(5)).expect("storing over a FIFO blocked");
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    }
}
