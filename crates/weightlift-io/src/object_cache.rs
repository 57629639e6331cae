//! Local copies of objects (`remote_cache_dir`): the copy of `s3://bucket/a/b.safetensors` is
//! `DIR/s3/bucket/a/b.safetensors`, beside a sidecar `b.safetensors.weightlift-etag` naming the ETag and length it
//! was fetched at and the inode of the copy it describes.
//!
//! - [`lookup`]: an object opened (one HEAD) whose copy is complete and names the same ETag and length is read from
//!   the copy. An object without an ETag never is: its length alone does not tell one version from another.
//! - [`CacheFill`]: otherwise the load writes the copy as its bytes arrive: each ranged GET's body is written at its
//!   offset into an unnamed temporary file (`O_TMPFILE`, through [`weightlift_format::output::Output`], the writer
//!   of `save_file`) right after it landed in its staging slot, on a thread of the network runtime's blocking pool
//!   (a write to disk must not hold up the threads serving sockets); at the end of a successful load what no GET
//!   covered is written from the header bytes parsing fetched, and what they do not hold either is fetched (same
//!   pinned ETag); then the file is fsynced and renamed over the old copy, and the sidecar is written the same way.
//!   A load that fails or is cancelled drops the unnamed file: nothing is published, nothing is left.
//!
//! The cache never fails a load: each of its failures is a warning, and the load goes on without it.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use weightlift_format::output::{self, Output};
use weightlift_remote::Object;

/// The sidecar's suffix. Keys ending with it are not cached: their copy would be another copy's sidecar.
const SIDECAR: &str = ".weightlift-etag";

/// Bytes fetched at once when filling what the load's GETs did not cover.
const FILL_BYTES: usize = 8 << 20;

/// Where the copy of `url` lives under `dir`: `DIR/SCHEME/HOST-OR-BUCKET/KEY` (a query string is left out). `None`
/// for a URL whose host or key would step outside that folder (`..`, a separator in the host) or whose key ends
/// as a sidecar does.
pub fn cache_path(dir: &Path, url: &str) -> Option<PathBuf> {
    let (scheme, rest) = url.split_once("://")?;
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (host, key) = rest.split_once('/')?;
    // Credentials in the URL (`user:password@host`) are not written into a folder's name.
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    let mut path = dir.join(scheme.to_ascii_lowercase());
    path.push(plain_name(host)?);
    let mut parts = 0;
    for part in key.split('/').filter(|p| !p.is_empty() && *p != ".") {
        path.push(plain_name(part)?);
        parts += 1;
    }
    (parts > 0 && !key.ends_with('/') && !key.ends_with(SIDECAR)).then_some(path)
}

/// `part` when it is one normal path component (not `..`, no separator, no NUL).
fn plain_name(part: &str) -> Option<&str> {
    let mut components = Path::new(part).components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(_)), None) if !part.contains(['/', '\0']) => Some(part),
        _ => None,
    }
}

fn sidecar_of(copy: &Path) -> PathBuf {
    let mut name = copy.as_os_str().to_os_string();
    name.push(SIDECAR);
    PathBuf::from(name)
}

/// What a sidecar says: the ETag and length the copy was fetched at, and the copy's inode.
#[derive(Debug, PartialEq, Eq)]
struct Stamp {
    etag: String,
    len: u64,
    ino: u64,
}

impl Stamp {
    fn text(&self) -> String {
        format!("etag {}\nlen {}\ninode {}\n", self.etag, self.len, self.ino)
    }

    fn parse(text: &str) -> Option<Stamp> {
        let mut lines = text.lines();
        let etag = lines.next()?.strip_prefix("etag ")?.to_string();
        let len = lines.next()?.strip_prefix("len ")?.parse().ok()?;
        let ino = lines.next()?.strip_prefix("inode ")?.parse().ok()?;
        Some(Stamp { etag, len, ino })
    }
}

/// The copy of `object` under `dir` and its inode, if its sidecar names the object's ETag and length. The caller
/// opens it and checks the inode ([`is_the_copy`]): a copy replaced in between is not taken.
pub fn lookup(dir: &Path, object: &Object) -> Option<(PathBuf, u64)> {
    let etag = object.etag()?;
    let copy = cache_path(dir, object.url())?;
    let stamp = Stamp::parse(&std::fs::read_to_string(sidecar_of(&copy)).ok()?)?;
    if stamp.etag != etag || stamp.len != object.len() {
        tracing::debug!(url = object.url(), copy = %copy.display(), "the local copy is stale; fetching the object");
        return None;
    }
    Some((copy, stamp.ino))
}

/// Whether `file` is the copy [`lookup`] found (its inode) and is whole (`len` bytes).
pub fn is_the_copy(file: &File, ino: u64, len: u64) -> bool {
    file.metadata().is_ok_and(|m| m.ino() == ino && m.len() == len)
}

/// A local copy being written as a load reads its object (see the module documentation).
#[derive(Debug)]
pub struct CacheFill {
    object: Arc<Object>,
    root: PathBuf,
    copy: PathBuf,
    etag: String,
    /// The temporary file; `None` once published or dropped. A lock for reading while GETs write into it (each
    /// its own range, from any network thread at once).
    out: RwLock<Option<Output>>,
    /// A write failed: the copy is abandoned.
    failed: AtomicBool,
    /// Byte ranges written so far, in completion order.
    covered: Mutex<Vec<Range<u64>>>,
    /// The object's first bytes as parsing fetched them (its header), written at publication where no GET covered
    /// them, instead of fetching them again.
    header: Option<Arc<[u8]>>,
    published: AtomicBool,
}

impl CacheFill {
    /// Starts a copy of `object` under `dir`, or says why not (a warning, never an error: the load goes on).
    /// `header`: the object's bytes from offset 0, of the version `object` is pinned to, where the caller has them.
    pub fn start(dir: &Path, object: &Arc<Object>, header: Option<Arc<[u8]>>) -> Option<CacheFill> {
        let warn = |why: String| tracing::warn!(url = object.url(), "not caching the object locally: {why}");
        let Some(etag) = object.etag() else {
            warn("it has no ETag, which a later load could check the copy against".into());
            return None;
        };
        let Some(copy) = cache_path(dir, object.url()) else {
            warn(format!("its URL does not name a file under {}", dir.display()));
            return None;
        };
        let started = std::fs::create_dir_all(copy.parent().unwrap_or(dir))
            .map_err(|e| e.to_string())
            .and_then(|()| Output::create(&copy, &[]).map_err(|e| e.to_string()))
            .and_then(|out| out.file().set_len(object.len()).map(|()| out).map_err(|e| e.to_string()));
        let fill = CacheFill {
            object: object.clone(),
            root: dir.to_path_buf(),
            copy,
            etag: etag.to_string(),
            out: RwLock::new(None),
            failed: AtomicBool::new(false),
            covered: Mutex::new(Vec::new()),
            header: header.filter(|h| h.len() as u64 <= object.len()),
            published: AtomicBool::new(false),
        };
        match started {
            Ok(out) => {
                *fill.out.write().unwrap_or_else(|p| p.into_inner()) = Some(out);
                Some(fill)
            }
            Err(e) => {
                warn(format!("{}: {e}", fill.copy.display()));
                None // dropped: the folders it made go
            }
        }
    }

    /// Writes `bytes`, the object's bytes at `offset`, into the copy: a buffered write (a copy into the page cache,
    /// which may wait on the disk), made before their staging slot is handed back, on a blocking thread (see
    /// `weightlift_remote::run_blocking`), never on a thread serving sockets.
    pub fn write(&self, offset: u64, bytes: &[u8]) {
        let out = self.out.read().unwrap_or_else(|p| p.into_inner());
        let Some(o) = out.as_ref().filter(|_| !self.failed.load(Ordering::Relaxed)) else { return };
        match o.file().write_all_at(bytes, offset) {
            Ok(()) => lock(&self.covered).push(offset..offset + bytes.len() as u64),
            Err(e) => {
                if !self.failed.swap(true, Ordering::Relaxed) {
                    let copy = self.copy.display();
                    tracing::warn!(url = self.object.url(), "not caching the object locally: {copy}: {e}");
                }
            }
        }
    }

    /// Whether the copy was published.
    pub fn published(&self) -> bool {
        self.published.load(Ordering::Relaxed)
    }

    /// The copy's path.
    pub fn path(&self) -> &Path {
        &self.copy
    }

    /// Completes the copy after a successful load: fetches what no GET covered, then publishes it. Returns whether
    /// it was published (a failure is a warning).
    pub fn publish(&self) -> bool {
        let Some(out) = self.out.write().unwrap_or_else(|p| p.into_inner()).take() else { return false };
        if self.failed.load(Ordering::Relaxed) {
            return false; // dropped: the failure was told when it happened
        }
        match self.complete(out) {
            Ok(()) => {
                self.published.store(true, Ordering::Relaxed);
                tracing::debug!(url = self.object.url(), copy = %self.copy.display(), "local copy written");
                true
            }
            Err(e) => {
                tracing::warn!(url = self.object.url(), "not caching the object locally: {}: {e}", self.copy.display());
                false
            }
        }
    }

    fn complete(&self, out: Output) -> Result<(), String> {
        let gaps = gaps(&lock(&self.covered), self.object.len());
        let header = self.header.as_deref().unwrap_or_default();
        let mut buf = Vec::new();
        for gap in gaps {
            let mut at = gap.start;
            if let Some(known) = header.get(at as usize..gap.end.min(header.len() as u64) as usize) {
                out.file().write_all_at(known, at).map_err(|e| e.to_string())?;
                at += known.len() as u64;
            }
            while at < gap.end {
                let n = (gap.end - at).min(FILL_BYTES as u64) as usize;
                buf.resize(n, 0);
                self.object.read_at(at, &mut buf).map_err(|e| e.to_string())?;
                out.file().write_all_at(&buf, at).map_err(|e| e.to_string())?;
                at += n as u64;
            }
        }
        let ino = out.file().metadata().map_err(|e| e.to_string())?.ino();
        // The old sidecar names the old copy's inode: between the rename and the new sidecar no copy is valid.
        out.commit().map_err(|e| e.to_string())?;
        let stamp = Stamp { etag: self.etag.clone(), len: self.object.len(), ino };
        output::write_with(&sidecar_of(&self.copy), &[], |w| std::io::Write::write_all(w, stamp.text().as_bytes()))
            .map_err(|e| e.to_string())
    }
}

impl CacheFill {
    /// Gives the copy up (its load failed): the unnamed file goes with its descriptor, and the folders made for it
    /// go if nothing else is in them. Writes still arriving from the failed load's GETs find no file.
    pub fn abandon(&self) {
        if self.published() {
            return;
        }
        drop(self.out.write().unwrap_or_else(|p| p.into_inner()).take());
        let mut dir = self.copy.parent();
        while let Some(d) = dir.filter(|d| d.starts_with(&self.root) && *d != self.root) {
            if std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }
}

impl Drop for CacheFill {
    fn drop(&mut self) {
        self.abandon();
    }
}

/// The parts of `0..len` that `covered` leaves out, in order.
fn gaps(covered: &[Range<u64>], len: u64) -> Vec<Range<u64>> {
    let mut sorted = covered.to_vec();
    sorted.sort_by_key(|r| r.start);
    let mut out = Vec::new();
    let mut at = 0;
    for r in sorted {
        if r.start > at {
            out.push(at..r.start.min(len));
        }
        at = at.max(r.end);
    }
    if at < len {
        out.push(at..len);
    }
    out
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_map_inside_the_folder_or_not_at_all() {
        let dir = Path::new("/c");
        let p = |u: &str| cache_path(dir, u).map(|p| p.display().to_string());
        assert_eq!(p("s3://b/a/m.safetensors").as_deref(), Some("/c/s3/b/a/m.safetensors"));
        assert_eq!(p("S3://b//a/./m?x=1").as_deref(), Some("/c/s3/b/a/m"));
        assert_eq!(p("http://127.0.0.1:80/m").as_deref(), Some("/c/http/127.0.0.1:80/m"));
        assert_eq!(p("https://user:secret@h/m").as_deref(), Some("/c/https/h/m"));
        for hostile in ["s3://b/../../etc/passwd", "s3://../x", "s3://b/a/..", "s3://b/", "s3://b", "s3://./x"] {
            assert_eq!(p(hostile), None, "{hostile}");
        }
        assert_eq!(p("s3://b/m.safetensors.weightlift-etag"), None);
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // lists of byte ranges, one of them
    fn gaps_are_what_no_range_covers() {
        assert_eq!(gaps(&[], 10), vec![0..10]);
        assert_eq!(gaps(&[4..6, 0..2, 5..8], 10), vec![2..4, 8..10]);
        assert_eq!(gaps(&[0..10], 10), Vec::<Range<u64>>::new());
    }

    #[test]
    fn stamps_round_trip() {
        let s = Stamp { etag: "\"abc-1\"".into(), len: 12, ino: 99 };
        assert_eq!(Stamp::parse(&s.text()), Some(s));
        assert_eq!(Stamp::parse("etag x\nlen y\ninode 1\n"), None);
    }
}
