//! Where a checkpoint file is: a local path, or an object named by a URL. A path given by a user becomes a
//! [`Location`] once, where it enters; the layers below are handed the typed value (and, for an object, the
//! [`crate::Object`] that was opened), never the string to look at again.

use std::fmt;
use std::path::{Path, PathBuf};

use url::Url;

use crate::error::RemoteError;

/// URL schemes read as objects. `file://` is not among them: local paths go to the file engine.
const SCHEMES: [&str; 9] = ["s3", "s3a", "gs", "az", "abfs", "abfss", "azure", "http", "https"];

/// Whether `location` names an object to fetch rather than a local path (`scheme://` with a scheme weightlift reads
/// objects from, and something after it).
pub fn is_url(location: &str) -> bool {
    location
        .split_once("://")
        .is_some_and(|(scheme, rest)| !rest.is_empty() && SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme)))
}

/// An object's URL, parsed.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ObjectUrl {
    url: Url,
    /// The URL as the caller wrote it (what messages name), also as a path for the layers that name inputs by path.
    text: PathBuf,
}

impl ObjectUrl {
    /// Parses `text`, which [`is_url`] accepts.
    pub fn parse(text: &str) -> Result<ObjectUrl, RemoteError> {
        let url = Url::parse(text).map_err(|e| RemoteError::BadUrl { url: text.to_string(), reason: e.to_string() })?;
        Ok(ObjectUrl { url, text: PathBuf::from(text) })
    }

    /// The URL as given.
    pub fn as_str(&self) -> &str {
        self.text.to_str().unwrap_or_default()
    }

    /// The parsed URL.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Whether the URL carries a query string (a presigned URL's signature, say), which every request keeps.
    pub fn has_query(&self) -> bool {
        self.url.query().is_some()
    }
}

impl fmt::Debug for ObjectUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectUrl({})", self.as_str())
    }
}

impl fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A local file, or an object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// A path on this machine.
    Local(PathBuf),
    /// An object of a store or an HTTP server.
    Object(ObjectUrl),
}

impl Location {
    /// What `path` names: an object where it is a URL of a scheme objects are read from ([`is_url`]), else a local
    /// path. A URL that does not parse is an error naming it.
    pub fn new(path: impl AsRef<Path>) -> Result<Location, RemoteError> {
        let path = path.as_ref();
        match path.to_str().filter(|p| is_url(p)) {
            Some(url) => ObjectUrl::parse(url).map(Location::Object),
            None => Ok(Location::Local(path.to_path_buf())),
        }
    }

    /// The location as a path: a local path as it is, a URL as its text (for messages and for inputs named by path).
    pub fn as_path(&self) -> &Path {
        match self {
            Location::Local(p) => p,
            Location::Object(u) => &u.text,
        }
    }

    /// The object's URL, where this is one.
    pub fn object(&self) -> Option<&ObjectUrl> {
        match self {
            Location::Object(u) => Some(u),
            Location::Local(_) => None,
        }
    }

    /// The extension of the file's name (for an object, of its URL's path: a query string is not part of it).
    pub fn extension(&self) -> Option<&str> {
        match self {
            Location::Local(p) => p.extension()?.to_str(),
            Location::Object(u) => Path::new(u.url.path()).extension()?.to_str(),
        }
    }

    /// The file `name` beside this one (a shard named by an index): in the same folder, or the same bucket
    /// "folder" (the URL's last path segment replaced; a query string is not carried over, since a presigned URL's
    /// signature is for its own object only).
    pub fn sibling(&self, name: &str) -> Result<Location, RemoteError> {
        match self {
            Location::Local(p) => Ok(Location::Local(p.parent().unwrap_or(Path::new(".")).join(name))),
            Location::Object(u) => {
                let mut url = u.url.clone();
                url.set_query(None);
                url.set_fragment(None);
                let joined = url.join(name).map_err(|e| RemoteError::BadUrl {
                    url: format!("{} + {name}", u.as_str()),
                    reason: e.to_string(),
                })?;
                Ok(Location::Object(ObjectUrl { text: PathBuf::from(joined.as_str()), url: joined }))
            }
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_path().display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_paths_are_told_apart() {
        for url in ["s3://b/k", "S3://b/k.safetensors", "gs://b/x", "az://c/x", "http://127.0.0.1:9/a", "https://h/a"] {
            assert!(is_url(url), "{url}");
            assert!(matches!(Location::new(url), Ok(Location::Object(_))), "{url}");
        }
        for path in ["/tmp/a", "a.safetensors", "file:///tmp/a", "s3:/b/k", "s3://", "ftp://h/a", "C://x"] {
            assert!(!is_url(path), "{path}");
            assert_eq!(Location::new(path).unwrap(), Location::Local(path.into()), "{path}");
        }
        assert!(Location::new("http://[::1/a").is_err(), "a URL that does not parse is refused");
    }

    #[test]
    fn siblings_stay_in_their_folder() {
        let local = Location::new("/m/llama/model.safetensors.index.json").unwrap();
        assert_eq!(local.sibling("a.safetensors").unwrap().as_path(), Path::new("/m/llama/a.safetensors"));
        let object = Location::new("s3://bucket/llama/model.safetensors.index.json").unwrap();
        assert_eq!(object.sibling("a.safetensors").unwrap().as_path(), Path::new("s3://bucket/llama/a.safetensors"));
        let signed = Location::new("https://h/b/llama/index.json?X-Amz-Signature=abc&X-Amz-Expires=60").unwrap();
        assert!(signed.object().unwrap().has_query());
        let shard = signed.sibling("a.safetensors").unwrap();
        assert_eq!(shard.as_path(), Path::new("https://h/b/llama/a.safetensors"));
        assert!(!shard.object().unwrap().has_query());
        assert_eq!(signed.extension(), Some("json"), "the query is not part of the name");
    }
}
