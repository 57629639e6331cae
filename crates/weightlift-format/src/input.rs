//! Bounded reads from a file being parsed: every read is checked against the file length first, so a header
//! cannot make the parser read (or allocate for) bytes the file does not have.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{ErrorKind, FormatError};
use crate::regular::{self, Access, OpenError};

pub(crate) struct Input {
    pub path: PathBuf,
    file: File,
    pub len: u64,
}

impl Input {
    pub fn open(path: &Path) -> Result<Input, FormatError> {
        let file = regular::open(path, Access::READ).map_err(|e| match e {
            OpenError::Io(e) => FormatError::new(path, ErrorKind::Open(e)),
            OpenError::NotAFile(node) => FormatError::new(path, ErrorKind::NotAFile { node }),
        })?;
        let meta = file.metadata().map_err(|e| FormatError::new(path, ErrorKind::Open(e)))?;
        Ok(Input { path: path.to_path_buf(), file, len: meta.len() })
    }

    pub fn err(&self, kind: ErrorKind) -> FormatError {
        FormatError::new(&self.path, kind)
    }

    /// Fills `buf` from `offset`, or fails with `Truncated` naming `what` if the file is too short.
    pub fn read_at(&self, offset: u64, buf: &mut [u8], what: &'static str) -> Result<(), FormatError> {
        let end = offset.saturating_add(buf.len() as u64);
        let truncated = || ErrorKind::Truncated { what, offset, end, file_len: self.len };
        if end > self.len {
            return Err(self.err(truncated()));
        }
        self.file.read_exact_at(buf, offset).map_err(|e| {
            // The file shrank after we measured it.
            if e.kind() == io::ErrorKind::UnexpectedEof {
                self.err(truncated())
            } else {
                self.err(ErrorKind::Read { offset, cause: e })
            }
        })
    }

    /// Reads `len` bytes at `offset` into a new buffer; the length is checked against the file before allocating.
    pub fn read_vec(&self, offset: u64, len: u64, what: &'static str) -> Result<Vec<u8>, FormatError> {
        let end = offset.saturating_add(len);
        if end > self.len {
            return Err(self.err(ErrorKind::Truncated { what, offset, end, file_len: self.len }));
        }
        let mut buf = vec![0u8; len as usize];
        self.read_at(offset, &mut buf, what)?;
        Ok(buf)
    }

    /// Reads up to `max` bytes at the start of the file (fewer if the file is shorter).
    pub fn prefix(&self, max: u64) -> Result<Vec<u8>, FormatError> {
        self.read_vec(0, self.len.min(max), "file start")
    }

    pub fn into_file(self) -> File {
        self.file
    }
}
