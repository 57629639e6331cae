//! What can go wrong with an object, each case one line naming the URL (and the byte range where one was read).

use std::ops::Range;

/// An object-storage failure.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RemoteError {
    /// The URL cannot name an object (bad syntax, a scheme without a client, a bucket without a key).
    #[error("{url}: not an object URL weightlift can read: {reason}")]
    BadUrl { url: String, reason: String },
    /// No such object, or no such bucket.
    #[error("{url}: no such object (or no such bucket)")]
    NotFound { url: String },
    /// The store refused the credentials or the access.
    #[error("{url}: access denied ({message}); check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...)")]
    Denied { url: String, message: String },
    /// The object was replaced after it was opened: its bytes would mix two versions.
    #[error("{url}: the object changed while it was being read (ETag {was} at open, {now} now); load it again")]
    Changed { url: String, was: String, now: String },
    /// The server answered a ranged GET with the whole object.
    #[error("{url}: the server does not serve byte ranges (it answered a ranged GET with the whole object)")]
    NoRange { url: String },
    /// A ranged GET failed for good (after its retries).
    #[error("{url}: bytes {}..{} failed after {retries} retries: {message}", range.start, range.end)]
    Request { url: String, range: Range<u64>, retries: u32, message: String },
    /// The read was stopped (its load was cancelled or failed elsewhere) before it completed.
    #[error("{url}: the read was stopped")]
    Stopped { url: String },
    /// Anything else the store reported.
    #[error("{url}: {message}")]
    Other { url: String, message: String },
}

impl RemoteError {
    /// What a local file's error of the same meaning would be: `NotFound` for a missing object or bucket,
    /// `PermissionDenied` for refused credentials, `InvalidInput` for a URL that names no object. The fronts map
    /// errors to their statuses and exceptions by it, as they map local files' errors.
    pub fn io_kind(&self) -> std::io::ErrorKind {
        match self {
            RemoteError::NotFound { .. } => std::io::ErrorKind::NotFound,
            RemoteError::Denied { .. } => std::io::ErrorKind::PermissionDenied,
            RemoteError::BadUrl { .. } => std::io::ErrorKind::InvalidInput,
            _ => std::io::ErrorKind::Other,
        }
    }

    /// The error as an `io::Error` (for the storage engine's completions), keeping this one as its source.
    pub fn into_io(self) -> std::io::Error {
        std::io::Error::new(self.io_kind(), self)
    }
}
