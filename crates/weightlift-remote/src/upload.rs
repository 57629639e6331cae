//! Writing a local file as an object: `weightlift upload`, and what fills a bucket for tests and benchmarks, through
//! the same clients that read it.

use crate::client::{Client, runtime, store_for};
use crate::error::RemoteError;
use crate::location::ObjectUrl;
use crate::object::{one_line, status_in};

/// Writes the local file `path` as the object `url` (in parts of 16 MiB, several in flight), and returns its
/// length: `weightlift upload`, and what fills a bucket for tests and benchmarks, through the same clients that read
/// it.
pub fn upload(path: &std::path::Path, url: &str) -> Result<u64, RemoteError> {
    upload_with_progress(path, url, &|_| {})
}

/// [`upload`], calling `progress` with the bytes read from the file so far after each part is handed over.
pub fn upload_with_progress(
    path: &std::path::Path,
    url: &str,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<u64, RemoteError> {
    use std::io::Read;
    use tokio::io::AsyncWriteExt;
    let parsed = ObjectUrl::parse(url)?;
    let Client { store, path: location, .. } = store_for(&parsed)?;
    let fail = |message: String| RemoteError::Other { url: url.to_string(), message };
    let mut file = std::fs::File::open(path).map_err(|e| fail(format!("{}: {e}", path.display())))?;
    // The runtime's block_on (not this module's block_on, which needs a 'static future) so that `progress` may
    // borrow; upload runs on a caller's thread, never on a runtime thread.
    runtime()?.block_on(async move {
        let mut writer = object_store::buffered::BufWriter::with_capacity(store, location, 16 << 20);
        let mut total = 0u64;
        loop {
            let mut chunk = vec![0u8; 16 << 20];
            // A blocking read, on the caller's thread (block_on polls this future there): the file is read one part
            // ahead of the parts in flight.
            let n = file.read(&mut chunk).map_err(|e| fail(e.to_string()))?;
            if n == 0 {
                break;
            }
            chunk.truncate(n);
            total += n as u64;
            if let Err(e) = writer.put(chunk.into()).await {
                let _ = writer.abort().await;
                return Err(write_failed(url, e));
            }
            progress(total);
        }
        if let Err(e) = writer.shutdown().await {
            // The last part (or the only PUT, for a small file) is sent here; its store error comes wrapped.
            return Err(match e.into_inner().map(|inner| inner.downcast::<object_store::Error>()) {
                Some(Ok(store)) => write_failed(url, *store),
                Some(Err(other)) => fail(one_line(&*other)),
                None => fail("the upload stopped".into()),
            });
        }
        Ok(total)
    })
}

/// A failed PUT in the words of a failed GET: access denied with its status, else the store's message.
fn write_failed(url: &str, e: object_store::Error) -> RemoteError {
    let url = url.to_string();
    match e {
        object_store::Error::PermissionDenied { source, .. } | object_store::Error::Unauthenticated { source, .. } => {
            let message = one_line(&*source);
            let message = status_in(&message).map_or(message, |s| format!("HTTP {s}"));
            RemoteError::Denied { url, message }
        }
        e => RemoteError::Other { url, message: one_line(&e) },
    }
}
