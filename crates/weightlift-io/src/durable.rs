//! Durable whole-file writes: the new contents go to a temporary file beside the target, are fsynced, renamed over
//! the target, and the directory is fsynced, so a crash or a kill at any point leaves either the old file or the new
//! one, never a mix.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};

use crate::error::IoError;

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".weightlift-tmp-{}", std::process::id()));
    path.with_file_name(name)
}

/// Writes `path` with the bytes `fill` produces, atomically and durably.
pub fn write_atomically(path: &Path, fill: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>) -> Result<(), IoError> {
    let tmp = temp_path(path);
    let err = |cause: io::Error| IoError::Write { path: path.to_path_buf(), offset: 0, len: 0, cause };
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|cause| IoError::Open { path: tmp.clone(), cause })?;
    let result = (|| {
        let mut out = BufWriter::with_capacity(8 << 20, file);
        fill(&mut out)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        File::open(dir)?.sync_all()
    })();
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
}
