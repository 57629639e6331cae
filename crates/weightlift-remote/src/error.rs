//! What can go wrong with an object, each case one line naming the URL (and the byte range where one was read).

use std::ops::Range;

/// An object-storage failure. Every variant names `url`, the object's URL as the caller gave it; `message` is what
/// the store (or its client) said.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RemoteError {
    /// The URL cannot name an object (bad syntax, a scheme without a client, a bucket without a key).
    #[error("{url}: not an object URL weightlift can read: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No such object, or no such bucket.
    #[error("{url}: no such object (or no such bucket)")]
    NotFound {
        /// The object's URL.
        url: String,
    },
    /// The store refused the credentials or the access.
    #[error("{url}: access denied ({message}); check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...)")]
    Denied {
        /// The object's URL.
        url: String,
        /// The store's reason.
        message: String,
    },
    /// The credentials configured cannot be used (an AWS profile that assumes a role, say): what to do instead.
    #[error("{url}: {message}")]
    Credentials {
        /// The object's URL.
        url: String,
        /// What is wrong, and what to do instead.
        message: String,
    },
    /// The object was replaced after it was opened: its bytes would mix two versions.
    #[error("{url}: the object changed while it was being read (ETag {was} at open, {now} now); load it again")]
    Changed {
        /// The object's URL.
        url: String,
        /// The ETag pinned when the object was opened (where the store gives none, its length: "a N-byte object").
        was: String,
        /// What a later response showed: its ETag, its length, or "a newer version" where the store refused the
        /// `If-Match` condition.
        now: String,
    },
    /// The server answered a ranged GET with the whole object.
    #[error("{url}: the server does not serve byte ranges (it answered a ranged GET with the whole object)")]
    NoRange {
        /// The object's URL.
        url: String,
    },
    /// A ranged GET failed for good (after its retries).
    #[error("{url}: bytes {}..{} failed after {retries} retries: {message}", range.start, range.end)]
    Request {
        /// The object's URL.
        url: String,
        /// The bytes asked for (`0..0` for the HEAD request that opens the object).
        range: Range<u64>,
        /// How many times the request was sent again before giving up.
        retries: u32,
        /// The last failure.
        message: String,
    },
    /// The read was stopped (its load was cancelled or failed elsewhere) before it completed.
    #[error("{url}: the read was stopped")]
    Stopped {
        /// The object's URL.
        url: String,
    },
    /// Anything else the store reported.
    #[error("{url}: {message}")]
    Other {
        /// The object's URL.
        url: String,
        /// What the store reported.
        message: String,
    },
}

impl RemoteError {
    /// What a local file's error of the same meaning would be: `NotFound` for a missing object or bucket,
    /// `PermissionDenied` for refused credentials, `InvalidInput` for a URL that names no object. The fronts map
    /// errors to their statuses and exceptions by it, as they map local files' errors.
    pub fn io_kind(&self) -> std::io::ErrorKind {
        match self {
            RemoteError::NotFound { .. } => std::io::ErrorKind::NotFound,
            RemoteError::Denied { .. } | RemoteError::Credentials { .. } => std::io::ErrorKind::PermissionDenied,
            RemoteError::BadUrl { .. } => std::io::ErrorKind::InvalidInput,
            _ => std::io::ErrorKind::Other,
        }
    }

    /// The error as an `io::Error` (for the storage engine's completions), keeping this one as its source.
    pub fn into_io(self) -> std::io::Error {
        std::io::Error::new(self.io_kind(), self)
    }
}
