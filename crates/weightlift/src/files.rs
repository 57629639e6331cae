//! Input files kept open by an engine between loads: opening probes O_DIRECT with a read, so a reload of the same
//! checkpoint reuses the descriptors. A file is reopened when it changed (device, inode, length or modification
//! time differ) and closed when the engine is dropped.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use weightlift_format::SourceFile;
use weightlift_io::{IoError, OpenFile};
use weightlift_remote::Location;

use crate::error::{Error, Result};

/// Files kept at most; past this the cache starts over (a process loading thousands of distinct files gains
/// nothing from keeping them all open).
const MAX_FILES: usize = 512;

/// What identifies a file's contents well enough to reuse its descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

fn identity(path: &Path) -> Result<Identity> {
    let m = std::fs::metadata(path).map_err(|cause| Error::Io(IoError::Open { path: path.to_path_buf(), cause }))?;
    Ok(Identity {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    })
}

#[derive(Debug, Default)]
pub(crate) struct FileCache {
    open: Mutex<HashMap<PathBuf, (Identity, Arc<OpenFile>)>>,
}

impl FileCache {
    /// `location`, opened (reusing the descriptors of an unchanged file). An object is opened afresh each time
    /// (one GET of its first byte), at the version its server has now.
    pub fn open(&self, location: &Location, want_direct: bool) -> Result<Arc<OpenFile>> {
        match location {
            Location::Object(url) => Ok(Arc::new(OpenFile::open_object(url, None)?)),
            Location::Local(path) => self.open_as(path, want_direct, false),
        }
    }

    /// As [`FileCache::open`], accepting a block device too (reads by LBA mean the device itself).
    pub fn open_device(&self, path: &Path, want_direct: bool) -> Result<Arc<OpenFile>> {
        self.open_as(path, want_direct, true)
    }

    fn open_as(&self, path: &Path, want_direct: bool, devices: bool) -> Result<Arc<OpenFile>> {
        let id = identity(path)?;
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((known, f)) = open.get(path)
            && *known == id
        {
            return Ok(f.clone());
        }
        let f = Arc::new(if devices {
            OpenFile::open_device(path, want_direct)?
        } else {
            OpenFile::open(path, want_direct)?
        });
        if open.len() >= MAX_FILES {
            open.clear();
        }
        open.insert(path.to_path_buf(), (id, f.clone()));
        Ok(f)
    }

    /// Files as an index describes them, refusing any whose length changed since the index was read. An object is
    /// read as parsing opened it (no request to open it again: every GET asks for the ETag it was parsed at, so a
    /// replaced object fails the load). With `copies` (`remote_cache_dir` and, per file, whether this load writes a
    /// new local copy), an object is read from its valid local copy, or its copy is written as the load reads it
    /// where the flag says so.
    pub fn open_index(
        &self,
        files: &[SourceFile],
        want_direct: bool,
        copies: Option<(&Path, &[bool])>,
    ) -> Result<Vec<Arc<OpenFile>>> {
        files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let object = match &f.object {
                    Some(o) => Some(o.clone()),
                    // An index made by hand names an object by its URL only: opened here, at the ETag it names.
                    None => match Location::new(&f.path).map_err(weightlift_io::IoError::Remote)? {
                        Location::Object(url) => {
                            let opened = OpenFile::open_object(&url, f.etag.as_deref())?;
                            opened.object().cloned()
                        }
                        Location::Local(path) => {
                            let file = self.open_as(&path, want_direct, false)?;
                            return check_len(f, file);
                        }
                    },
                };
                let Some(object) = object else {
                    return Err(Error::InvalidArgument("an object without its client".into()));
                };
                let file = match copies {
                    Some((dir, fill)) => {
                        let fill = fill.get(i).copied().unwrap_or(false);
                        let header = f.header.as_ref();
                        Arc::new(OpenFile::open_object_cached(object, header, dir, fill, want_direct)?)
                    }
                    None => Arc::new(OpenFile::of_object(object)),
                };
                check_len(f, file)
            })
            .collect()
    }

    /// Closes every cached file.
    pub fn clear(&self) {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// `file` as opened for `f`, refused where its length is no longer the one the index was read at.
fn check_len(f: &SourceFile, file: Arc<OpenFile>) -> Result<Arc<OpenFile>> {
    if file.len != f.len {
        return Err(Error::Io(IoError::PastEnd { path: f.path.clone(), offset: 0, len: f.len, file_len: file.len }));
    }
    Ok(file)
}
