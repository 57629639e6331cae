//! Bounded reads from a file or object being parsed: every read is checked against its length first, so a header
//! cannot make the parser read (or allocate for) bytes the input does not have.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use weightlift_remote::{Head, Location, Object};

use crate::error::{ErrorKind, FormatError};
use crate::index::HeaderBytes;
use crate::regular::{self, Access, OpenError};

pub(crate) struct Input {
    pub path: PathBuf,
    src: Src,
    pub len: u64,
}

/// Where an input's bytes come from: a local file, or an object whose first bytes one GET fetched.
enum Src {
    File(File),
    Object(Head),
}

impl Input {
    /// Opens a local path, or the object a URL names (`s3://`, `gs://`, `az://`, `http(s)://`): where a path
    /// enters the format readers.
    pub fn open(path: &Path) -> Result<Input, FormatError> {
        let location = Location::new(path).map_err(|e| FormatError::new(path, ErrorKind::Remote(e)))?;
        Input::open_at(&location)
    }

    /// Opens a location: a local file, or an object (one GET of its first bytes, which pins its length and ETag
    /// and holds its header).
    pub fn open_at(location: &Location) -> Result<Input, FormatError> {
        let path = location.as_path();
        if let Location::Object(url) = location {
            let head = Head::open(url).map_err(|e| FormatError::new(path, ErrorKind::Remote(e)))?;
            let len = head.object().len();
            return Ok(Input { path: path.to_path_buf(), src: Src::Object(head), len });
        }
        let file = regular::open(path, Access::READ).map_err(|e| match e {
            OpenError::Io(e) => FormatError::new(path, ErrorKind::Open(e)),
            OpenError::NotAFile(node) => FormatError::new(path, ErrorKind::NotAFile { node }),
        })?;
        let meta = file.metadata().map_err(|e| FormatError::new(path, ErrorKind::Open(e)))?;
        Ok(Input { path: path.to_path_buf(), src: Src::File(file), len: meta.len() })
    }

    /// The ETag an object was pinned to when opened (`None` for a local file).
    pub fn etag(&self) -> Option<String> {
        self.object().and_then(|o| o.etag().map(str::to_string))
    }

    /// The object this input is, as opened (`None` for a local file): a load reads it without opening it again.
    pub fn object(&self) -> Option<Arc<Object>> {
        match &self.src {
            Src::Object(head) => Some(head.object().clone()),
            Src::File(_) => None,
        }
    }

    /// An object's bytes `0..data_start` when the request that opened it for parsing fetched them all (`None` for a
    /// local file).
    pub fn header_bytes(&self, data_start: u64) -> Option<HeaderBytes> {
        match &self.src {
            Src::Object(head) if data_start > 0 => head.prefix(data_start).map(|b| HeaderBytes(b.into())),
            _ => None,
        }
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
        match &self.src {
            Src::File(file) => file.read_exact_at(buf, offset).map_err(|e| {
                // The file shrank after we measured it.
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    self.err(truncated())
                } else {
                    self.err(ErrorKind::Read { offset, cause: e })
                }
            }),
            Src::Object(head) => head.read_at(offset, buf).map_err(|e| self.err(ErrorKind::Remote(e))),
        }
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
}

/// An [`Input`] read in order (for parsers that stream, as GGUF's does): each `read` is a bounded `read_at`.
pub(crate) struct Sequential {
    pub input: Input,
    pub pos: u64,
}

impl io::Read for Sequential {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (buf.len() as u64).min(self.input.len.saturating_sub(self.pos)) as usize;
        match &self.input.src {
            Src::File(file) => {
                let n = file.read_at(&mut buf[..n], self.pos)?;
                self.pos += n as u64;
                Ok(n)
            }
            Src::Object(head) => {
                head.read_at(self.pos, &mut buf[..n]).map_err(weightlift_remote::RemoteError::into_io)?;
                self.pos += n as u64;
                Ok(n)
            }
        }
    }
}
