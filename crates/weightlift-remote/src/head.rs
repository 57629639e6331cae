//! The first bytes of an object, fetched by the GET that opens it, and a window of read-ahead behind them: header
//! parsers ask for a few bytes at a time, and each must not be a round trip.

use std::sync::{Arc, Mutex};

use crate::error::RemoteError;
use crate::location::ObjectUrl;
use crate::object::Object;

/// An object opened for parsing its header.
#[derive(Debug)]
pub struct Head {
    object: Arc<Object>,
    /// The window's start, its bytes, and the size of the next window fetched.
    window: Mutex<(u64, Vec<u8>, u64)>,
}

impl Head {
    /// Bytes the opening GET asks for: the whole header of a safetensors file of a large model or of a shard (tens
    /// to hundreds of KiB), at ~3 ms of a cloud GET's ~90 MB/s; a longer header (a GGUF vocabulary) takes more GETs
    /// of growing windows.
    pub const FIRST: u64 = 256 << 10;
    /// The largest window a miss fetches.
    const LARGEST: u64 = 16 << 20;

    /// Opens `url` with one GET of its first [`Head::FIRST`] bytes.
    pub fn open(url: &ObjectUrl) -> Result<Head, RemoteError> {
        let (object, bytes) = Object::open_with(url, Self::FIRST)?;
        Ok(Head { object: Arc::new(object), window: Mutex::new((0, bytes, Self::FIRST * 4)) })
    }

    /// The whole of a small object (a model's `config.json`, a shard index) with the one GET that opens it where
    /// it fits in [`Head::FIRST`] bytes, else with one more GET of the rest: opening the object and then reading it
    /// took two round trips for every such file. An object longer than `limit` bytes is refused, naming its
    /// length, after its first bytes only.
    pub fn fetch(url: &ObjectUrl, limit: u64) -> Result<Vec<u8>, RemoteError> {
        let head = Head::open(url)?;
        let len = head.object.len();
        if len > limit {
            return Err(RemoteError::Other {
                url: url.as_str().to_string(),
                message: format!("{len} bytes: more than the {limit} a small object read whole may have"),
            });
        }
        let mut bytes = std::mem::take(&mut head.window.lock().unwrap_or_else(|p| p.into_inner()).1);
        let have = bytes.len();
        if (have as u64) < len {
            bytes.resize(len as usize, 0);
            head.object.read_at(have as u64, &mut bytes[have..])?;
        }
        bytes.truncate(len as usize);
        Ok(bytes)
    }

    /// The object the header is read from.
    pub fn object(&self) -> &Arc<Object> {
        &self.object
    }

    /// The object's bytes `0..len` when the window still holds them (as the first GET left it), without a request.
    pub fn prefix(&self, len: u64) -> Option<Vec<u8>> {
        let window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let (start, bytes, _) = &*window;
        if *start != 0 {
            return None;
        }
        bytes.get(..usize::try_from(len).ok()?).map(<[u8]>::to_vec)
    }

    /// Fills `buf` from `offset`: from the window when it holds the bytes, else with a GET of a window (each one
    /// four times the last, up to 16 MiB, and at least `buf`'s length) that becomes the window.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let (start, bytes, next) = &*window;
        let end = offset.saturating_add(buf.len() as u64);
        if offset >= *start && end <= start + bytes.len() as u64 {
            let from = (offset - start) as usize;
            buf.copy_from_slice(&bytes[from..from + buf.len()]);
            return Ok(());
        }
        let next = *next;
        let len = (buf.len() as u64).max(next).min(self.object.len().saturating_sub(offset));
        if len < buf.len() as u64 {
            return self.object.read_at(offset, buf);
        }
        let mut fresh = vec![0u8; len as usize];
        self.object.read_at(offset, &mut fresh)?;
        buf.copy_from_slice(&fresh[..buf.len()]);
        *window = (offset, fresh, (next * 4).min(Self::LARGEST));
        Ok(())
    }
}
