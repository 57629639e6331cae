//! What identifies a kept file's bytes: device, inode, length, modification and change times, read with `fstat`
//! from the descriptor the client opened (so paths in other mount namespaces, renames and races between a path's
//! lookup and its reading do not matter). The change time is there because `utimensat` can set a forged
//! modification time back after an in-place rewrite, but not the change time, which the kernel sets.
//!
//! An object's bytes are identified by its URL, its ETag and its length ([`ObjectStamp`]): the keeper fetches it
//! asking for that ETag (each ranged GET is conditional on it), so what it keeps under a stamp is that version or
//! nothing. An object without an ETag is never kept: its length alone does not tell one version from another.

use std::os::fd::AsFd;

use serde::{Deserialize, Serialize};

/// A file's identity as the keeper keys it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stamp {
    /// The file system's device number.
    pub dev: u64,
    /// The inode.
    pub ino: u64,
    /// The length in bytes.
    pub len: u64,
    /// Modification time, in nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Status change time, in nanoseconds since the epoch.
    pub ctime_ns: i64,
}

impl Stamp {
    /// The identity of the open file `fd`.
    pub fn of(fd: impl AsFd) -> std::io::Result<Stamp> {
        let st = rustix::fs::fstat(fd)?;
        // i64 nanoseconds reach the year 2262 (and JSON has no 128-bit integers).
        let ns = |s: i64, n: u64| s.saturating_mul(1_000_000_000).saturating_add(n as i64);
        Ok(Stamp {
            dev: st.st_dev,
            ino: st.st_ino,
            len: st.st_size.max(0) as u64,
            mtime_ns: ns(st.st_mtime as i64, st.st_mtime_nsec as u64),
            ctime_ns: ns(st.st_ctime as i64, st.st_ctime_nsec as u64),
        })
    }

    /// Whether `other` is the same file (device and inode), whatever its contents now.
    pub fn same_file(&self, other: &Stamp) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }

    /// Whether the descriptor names a regular file.
    pub fn is_regular(fd: impl AsFd) -> std::io::Result<bool> {
        let st = rustix::fs::fstat(fd)?;
        Ok(rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile)
    }
}

/// An object's identity as the keeper keys it: the URL the load names it by, the ETag the load opened it at, and
/// its length.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ObjectStamp {
    /// The object's URL, as the load names it (`s3://bucket/key`, `gs://…`, `https://…`).
    pub url: String,
    /// Its ETag when the load opened it.
    pub etag: String,
    /// Its length in bytes.
    pub len: u64,
}

impl ObjectStamp {
    /// The URL without what should not be shown (user and password, a query string that may hold a signature).
    pub fn display_url(&self) -> String {
        display_url(&self.url)
    }
}

/// `url` without its user, password, query string and fragment (for status and messages: a presigned URL's query
/// holds its signature).
pub fn display_url(url: &str) -> String {
    let cut = url.split(['?', '#']).next().unwrap_or_default();
    match cut.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let slash = if rest.contains('/') { "/" } else { "" };
            format!("{scheme}://{host}{slash}{path}")
        }
        None => cut.to_string(),
    }
}

/// What a kept entry is: a local file or an object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Key {
    /// A local file, by its [`Stamp`].
    File(Stamp),
    /// An object, by its [`ObjectStamp`].
    Object(ObjectStamp),
}

impl Key {
    /// The length of the bytes it names.
    pub fn len(&self) -> u64 {
        match self {
            Key::File(s) => s.len,
            Key::Object(o) => o.len,
        }
    }

    /// Whether it names no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `other` names the same source (the same file, the same URL), whatever its contents now.
    pub fn same_source(&self, other: &Key) -> bool {
        match (self, other) {
            (Key::File(a), Key::File(b)) => a.same_file(b),
            (Key::Object(a), Key::Object(b)) => a.url == b.url,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_credentials_or_signatures() {
        assert_eq!(display_url("s3://bucket/a/b.safetensors"), "s3://bucket/a/b.safetensors");
        assert_eq!(display_url("https://u:p@host:8080/x/y?X-Amz-Signature=abc#f"), "https://host:8080/x/y");
        assert_eq!(display_url("https://host"), "https://host");
        assert_eq!(display_url("gs://b/k?generation=3"), "gs://b/k");
    }

    #[test]
    fn an_object_changed_under_its_url_is_the_same_source() {
        let a = Key::Object(ObjectStamp { url: "s3://b/k".into(), etag: "\"1\"".into(), len: 5 });
        let b = Key::Object(ObjectStamp { url: "s3://b/k".into(), etag: "\"2\"".into(), len: 5 });
        let c = Key::Object(ObjectStamp { url: "s3://b/j".into(), etag: "\"1\"".into(), len: 5 });
        assert!(a.same_source(&b) && a != b);
        assert!(!a.same_source(&c));
        let f = Key::File(Stamp { dev: 1, ino: 2, len: 5, mtime_ns: 0, ctime_ns: 0 });
        assert!(!a.same_source(&f) && !f.same_source(&a));
    }
}
