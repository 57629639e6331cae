//! Durable whole-file writes (`save_file`): the storage engine's face of [`weightlift_format::output`], the one
//! way every writer of weightlift opens its output. The new contents go to a locked temporary file beside the
//! target, are fsynced, renamed over the target (whose mode they keep), and the folder is fsynced, so a crash or a
//! kill at any point leaves either the old file or the new one, never a mix; the temporary files of killed earlier
//! writes to the same target are removed first. A target that is not a regular file is refused, never replaced.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;

use weightlift_format::output::Output;
pub use weightlift_format::output::remove_stale_temps;
use weightlift_format::{ErrorKind, FormatError};

use crate::error::IoError;

fn io_error(e: FormatError) -> IoError {
    let FormatError { path, kind } = e;
    match kind {
        ErrorKind::Open(cause) => IoError::Open { path, cause },
        ErrorKind::OutputNotAFile { node } => IoError::NotAFile { path, node },
        ErrorKind::Write(cause) => IoError::Write { path, offset: 0, len: 0, cause },
        other => IoError::Write { path, offset: 0, len: 0, cause: io::Error::other(other.to_string()) },
    }
}

/// Writes `path` with the bytes `fill` produces, atomically and durably (see the module documentation).
pub fn write_atomically(path: &Path, fill: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>) -> Result<(), IoError> {
    let out = Output::create(path, &[]).map_err(io_error)?;
    if !out.removed_stale().is_empty() {
        tracing::info!(removed = ?out.removed_stale(), "removed temporary files of interrupted writes");
    }
    let err = |cause: io::Error| IoError::Write { path: path.to_path_buf(), offset: 0, len: 0, cause };
    let mut w = BufWriter::with_capacity(8 << 20, out.file().try_clone().map_err(err)?);
    fill(&mut w).map_err(err)?;
    w.into_inner().map_err(|e| err(e.into_error()))?;
    out.commit().map_err(io_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_atomically_keeps_the_mode_and_leaves_the_old_file_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomically(&path, |w| w.write_all(b"first")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let failed = write_atomically(&path, |w| {
            w.write_all(b"half of the second")?;
            Err(io::Error::other("killed midway"))
        });
        assert!(matches!(failed, Err(IoError::Write { .. })), "{failed:?}");
        assert_eq!(fs::read(&path).unwrap(), b"first");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "temporary file left behind");
        write_atomically(&path, |w| w.write_all(b"second")).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600, "a private file became readable");
    }

    #[test]
    fn a_device_is_refused_not_replaced() {
        let r = write_atomically(Path::new("/dev/null"), |w| w.write_all(b"x"));
        assert!(matches!(r, Err(IoError::NotAFile { .. })), "{r:?}");
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(&fs::metadata("/dev/null").unwrap().file_type()));
    }
}
