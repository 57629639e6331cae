//! The load server: a resident process (`weightlift serve`) whose lanes' staging is set up once, reading
//! checkpoints into other processes' device memory.
//!
//! A process's first load onto a GPU sets up its lanes' staging (faulted in and pinned) while it runs, and that
//! made the first load of a fresh process 1.4-1.9× its second on the H100 machine (bench/results). The server
//! keeps that staging for every process on the machine: a client allocates its tensors' memory as usual, exports
//! the allocations through CUDA IPC, and sends the server the byte ranges to read into them over a Unix socket;
//! the server opens the allocations, reads through its own engine, and answers when the bytes are in place.
//!
//! ```text
//!   client (fresh process)                          server (weightlift serve)
//!   allocate blocks (torch / cuMemAlloc)
//!   export each allocation (cuIpcGetMemHandle) ──▶  check the files are the same (dev, inode, size, mtime)
//!   ranges + handles, one JSON line                  open the allocations (cuIpcOpenMemHandle)
//!                                                    read through its warm lanes into them
//!   tensors ready  ◀── one JSON line ────────────── close the allocations, answer with its report
//! ```
//!
//! The client falls back to its own data path, saying why in its report, whenever the server cannot serve a load:
//! no server listening, memory that cannot be exported (the stream-ordered pool's), a file the server sees
//! differently (another mount namespace), a server error or the server's exit. Only a cancellation is not
//! retried: the server is told (the client shuts its side of the socket), stops, and answers before the client
//! frees anything. The socket lives in a directory only its user can enter, and the server serves only processes
//! of its own user (`SO_PEERCRED`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use weightlift_cuda::ipc;
use weightlift_io::{IoEngine, IoReport, OpenFile};

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::path::{DeviceRead, GpuPath, LoadOpts, PathOutcome};
use crate::report::PathUsed;
use crate::tensor::RawDest;

/// Version of the socket protocol; a server refuses requests of another.
pub const PROTOCOL: u32 = 1;
/// Largest request line a server reads (a checkpoint of a million tensors needs a few tens of MB).
const MAX_REQUEST_BYTES: u64 = 256 << 20;
/// How often a server's accept loop looks at its stop flag.
const STOP_POLL_MS: i32 = 200;
/// How often a waiting client looks at its cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(50);

/// Where a server listens unless told otherwise: `$XDG_RUNTIME_DIR/weightlift/server.sock`, or
/// `/tmp/weightlift-UID/server.sock` without a runtime directory.
pub fn default_socket() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("weightlift").join("server.sock"),
        // SAFETY: getuid cannot fail.
        None => std::env::temp_dir().join(format!("weightlift-{}", unsafe { libc::getuid() })).join("server.sock"),
    }
}

/// A file as the client opened it: the server reads it only if it sees the same file.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
struct FileId {
    path: PathBuf,
    len: u64,
    dev: u64,
    ino: u64,
    mtime_ns: i128,
}

impl FileId {
    fn of_metadata(path: &Path, m: &std::fs::Metadata) -> FileId {
        FileId {
            path: path.to_path_buf(),
            len: m.len(),
            dev: m.dev(),
            ino: m.ino(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        }
    }

    fn of(f: &OpenFile) -> std::io::Result<FileId> {
        let path = std::path::absolute(&f.path)?;
        Ok(FileId::of_metadata(&path, &f.buffered.metadata()?))
    }

    /// `Err(why)` unless `path` is, for this process, the file the client described.
    fn check(&self) -> std::result::Result<(), String> {
        let here = std::fs::metadata(&self.path).map_err(|e| format!("{}: {e}", self.path.display()))?;
        let here = FileId::of_metadata(&self.path, &here);
        if here != *self {
            return Err(format!(
                "{} is another file for the server (device {}, inode {}, {} bytes, modified {} ns) than for the \
                 client (device {}, inode {}, {} bytes, modified {} ns)",
                self.path.display(),
                here.dev,
                here.ino,
                here.len,
                here.mtime_ns,
                self.dev,
                self.ino,
                self.len,
                self.mtime_ns
            ));
        }
        Ok(())
    }
}

/// A destination: an exported allocation (64 bytes, hex) and a range of it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
struct Dest {
    handle: String,
    offset: u64,
    len: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
struct Request {
    protocol: u32,
    device_uuid: String,
    files: Vec<FileId>,
    /// `(file, offset, len, destination, destination offset)`.
    extents: Vec<(u32, u64, u64, u32, u64)>,
    dests: Vec<Dest>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Reply {
    ok: bool,
    error: Option<String>,
    cancelled: bool,
    /// The server's report of the load.
    report: Option<Value>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> std::result::Result<[u8; ipc::HANDLE_BYTES], String> {
    if s.len() != 2 * ipc::HANDLE_BYTES || !s.is_ascii() {
        return Err(format!("a handle of {} characters, expected {} hex digits", s.len(), 2 * ipc::HANDLE_BYTES));
    }
    let mut out = [0u8; ipc::HANDLE_BYTES];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| format!("{s:?} is not hex"))?;
    }
    Ok(out)
}

/// The uid of the process at the other end of `stream`.
fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid out-parameters of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// A bound server. [`Server::run`] serves until its stop flag is set; dropping it removes its socket.
pub struct Server {
    engine: Arc<Engine>,
    listener: UnixListener,
    socket: PathBuf,
    /// The socket file's inode, to remove only our own.
    ino: u64,
    /// Each visible device's UUID and ordinal.
    devices: Vec<(String, u32)>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("socket", &self.socket).field("devices", &self.devices).finish()
    }
}

impl Server {
    /// Binds `socket` (its directory made, only for its user, if missing) for `engine`, whose `server` setting must
    /// be `off` (a server does not send its loads to a server). Fails if CUDA is unavailable, or if a server
    /// already listens there; a socket file nobody listens on is replaced.
    pub fn bind(engine: Arc<Engine>, socket: &Path) -> Result<Server> {
        if engine.settings().server.value != crate::settings::ServerMode::Off {
            return Err(Error::InvalidArgument("a load server's engine needs the setting server=off".into()));
        }
        let driver = weightlift_cuda::available().map_err(weightlift_cuda::CudaError::Unavailable)?;
        let socket = std::path::absolute(socket).map_err(|e| server_err(socket, "resolving the path", e))?;
        if let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|e| server_err(dir, "creating the socket's directory", e))?;
            }
        }
        match std::fs::symlink_metadata(&socket) {
            Ok(m) if m.file_type().is_socket() => {
                if UnixStream::connect(&socket).is_ok() {
                    return Err(Error::Server(format!("a load server already listens on {}", socket.display())));
                }
                std::fs::remove_file(&socket).map_err(|e| server_err(&socket, "removing a stale socket", e))?;
            }
            Ok(_) => {
                return Err(Error::Server(format!("{} exists and is not a socket", socket.display())));
            }
            Err(_) => {}
        }
        let listener = UnixListener::bind(&socket).map_err(|e| server_err(&socket, "binding", e))?;
        let meta = std::fs::metadata(&socket).map_err(|e| server_err(&socket, "reading back", e))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| server_err(&socket, "restricting to its user", e))?;
        let mut server = Server { engine, listener, socket, ino: meta.ino(), devices: Vec::new() };
        for n in 0..driver.devices {
            let gpu = server.engine.gpu(n)?;
            server.devices.push((ipc::uuid(&gpu)?, n));
        }
        Ok(server)
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The engine serving the loads (to prepare its devices).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// `(uuid, ordinal)` of each device served.
    pub fn devices(&self) -> &[(String, u32)] {
        &self.devices
    }

    /// Serves connections, each on a thread of its own, until `stop` is set (looked at every 200 ms).
    pub fn run(&self, stop: &AtomicBool) -> Result<()> {
        let fd = self.listener.as_raw_fd();
        while !stop.load(Ordering::Relaxed) {
            let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, STOP_POLL_MS) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(server_err(&self.socket, "waiting for connections", e));
            }
            if r == 0 {
                continue;
            }
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(socket = %self.socket.display(), "accepting a connection: {e}");
                    continue;
                }
            };
            let (engine, devices) = (self.engine.clone(), self.devices.clone());
            let spawned =
                std::thread::Builder::new().name("wl-serve".into()).spawn(move || serve_one(&engine, &devices, stream));
            if let Err(e) = spawned {
                tracing::warn!("starting a thread for a connection: {e}");
            }
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only the socket this server bound: another server may have replaced it since.
        if std::fs::symlink_metadata(&self.socket).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

fn server_err(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::Server(format!("{}: {what}: {e}", path.display()))
}

/// One connection: one request, one reply.
fn serve_one(engine: &Engine, devices: &[(String, u32)], stream: UnixStream) {
    let reply = match peer_uid(&stream) {
        // SAFETY: getuid cannot fail.
        Ok(uid) if uid == unsafe { libc::getuid() } => None,
        Ok(uid) => Some(refusal(format!("the server serves only its own user; the client runs as uid {uid}"))),
        Err(e) => Some(refusal(format!("reading the client's credentials: {e}"))),
    };
    let mut line = String::new();
    let reply = reply.unwrap_or_else(|| {
        let mut reader = BufReader::new((&stream).take(MAX_REQUEST_BYTES));
        match reader.read_line(&mut line) {
            Ok(_) if line.ends_with('\n') => match serde_json::from_str::<Request>(&line) {
                Ok(req) => execute(engine, devices, &stream, &req),
                Err(e) => refusal(format!("a malformed request: {e}")),
            },
            Ok(_) => refusal("the request ended before its end of line (or passed 256 MiB)".into()),
            Err(e) => refusal(format!("reading the request: {e}")),
        }
    });
    let mut text = serde_json::to_string(&reply).unwrap_or_else(|e| format!("{{\"ok\":false,\"error\":\"{e}\"}}"));
    text.push('\n');
    if let Err(e) = (&stream).write_all(text.as_bytes()) {
        tracing::debug!("answering a client: {e}");
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn refusal(why: String) -> Reply {
    tracing::info!("load server: {why}");
    Reply { ok: false, error: Some(why), cancelled: false, report: None }
}

/// Runs one request while a watcher thread turns the client's end of the connection (a cancellation, or its
/// exit) into the load's cancel flag.
fn execute(engine: &Engine, devices: &[(String, u32)], stream: &UnixStream, req: &Request) -> Reply {
    let cancel = AtomicBool::new(false);
    let done = AtomicBool::new(false);
    let watcher = match stream.try_clone() {
        Ok(s) => s,
        Err(e) => return refusal(format!("watching the connection: {e}")),
    };
    std::thread::scope(|scope| {
        let (cancel, done) = (&cancel, &done);
        scope.spawn(move || {
            // Any byte, the end of the stream or an error: the client gave up. Woken by the shutdown below.
            let _ = (&watcher).read(&mut [0u8; 1]);
            if !done.load(Ordering::Acquire) {
                cancel.store(true, Ordering::Release);
            }
        });
        let t = Instant::now();
        let r = read_request(engine, devices, req, cancel);
        done.store(true, Ordering::Release);
        let _ = stream.shutdown(std::net::Shutdown::Read);
        match r {
            Ok(mut report) => {
                tracing::info!(
                    bytes = req.extents.iter().map(|e| e.2).sum::<u64>(),
                    secs = t.elapsed().as_secs_f64(),
                    "served"
                );
                report["served_secs"] = json!(t.elapsed().as_secs_f64());
                Reply { ok: true, error: None, cancelled: false, report: Some(report) }
            }
            Err(e) => {
                let cancelled = e.is_cancelled();
                tracing::info!("load server: a request failed: {e}");
                Reply { ok: false, error: Some(e.to_string()), cancelled, report: None }
            }
        }
    })
}

fn read_request(engine: &Engine, devices: &[(String, u32)], req: &Request, cancel: &AtomicBool) -> Result<Value> {
    if req.protocol != PROTOCOL {
        return Err(Error::Server(format!("protocol {} asked, the server speaks {PROTOCOL}", req.protocol)));
    }
    let ordinal =
        devices.iter().find(|(u, _)| *u == req.device_uuid).map(|&(_, n)| n).ok_or_else(|| {
            Error::Server(format!("no device with UUID {} is visible to the server", req.device_uuid))
        })?;
    for f in &req.files {
        f.check().map_err(Error::Server)?;
    }
    let gpu = engine.gpu(ordinal)?;
    let _restore = weightlift_cuda::ContextRestore::save();
    let mut opened: HashMap<&str, ipc::Imported> = HashMap::new();
    let mut dests = Vec::with_capacity(req.dests.len());
    for d in &req.dests {
        if d.len == 0 {
            dests.push((RawDest::Device { ordinal, ptr: 0 }, 0));
            continue;
        }
        if !opened.contains_key(d.handle.as_str()) {
            let handle = unhex(&d.handle).map_err(Error::Server)?;
            opened.insert(&d.handle, ipc::Imported::open(&gpu, &handle)?);
        }
        let imported = &opened[d.handle.as_str()];
        if d.offset.checked_add(d.len).is_none_or(|end| end > imported.len()) {
            return Err(Error::Server(format!(
                "a destination of {} bytes at offset {} passes the end of its {}-byte allocation",
                d.len,
                d.offset,
                imported.len()
            )));
        }
        dests.push((RawDest::Device { ordinal, ptr: imported.ptr() + d.offset }, d.len));
    }
    let paths: Vec<PathBuf> = req.files.iter().map(|f| f.path.clone()).collect();
    let ranges: Vec<(usize, u64, u64, u32, u64)> =
        req.extents.iter().map(|&(f, o, l, d, od)| (f as usize, o, l, d, od)).collect();
    let opts = LoadOpts { cancel: Some(cancel), ..LoadOpts::default() };
    // SAFETY: each destination is a range of an allocation opened above and checked to lie inside it; the client
    // keeps the allocations alive and untouched until it has this reply, and the opened mappings are closed only
    // after the read has returned (every copy done).
    let report = unsafe { engine.read_scattered_into(&paths, &ranges, &dests, &opts) }?;
    drop(opened);
    Ok(report.to_json())
}

/// The client's side: a GPU path that hands the reads to a server, else to `local`.
pub(crate) struct ServerPath {
    pub socket: PathBuf,
    pub local: Box<dyn GpuPath>,
}

enum Declined {
    /// The server did not (or could not) write anything it will still write: read locally.
    Fallback(String),
    /// The load was cancelled and the server has stopped.
    Cancelled,
}

impl GpuPath for ServerPath {
    fn read(
        &self,
        io: &IoEngine,
        req: &DeviceRead<'_>,
        allocate: &mut dyn FnMut() -> Result<()>,
    ) -> Result<PathOutcome> {
        let local_reason = if !self.socket.exists() {
            Some("no load server listens there".to_string())
        } else if req.observer.is_some() {
            Some("checksums are checked as bytes land, which only a local read can watch".to_string())
        } else if req.opts.faults.is_some() {
            Some("injected faults apply to local reads".to_string())
        } else {
            None
        };
        if let Some(why) = local_reason {
            let mut out = self.local.read(io, req, allocate)?;
            out.server = Some(json!({"socket": self.socket, "used": false, "reason": why}));
            return Ok(out);
        }
        if let Err(e) = allocate() {
            req.targets.fail(format!("allocating the destinations failed: {e}"));
            return Err(e);
        }
        let t = Instant::now();
        match self.remote(req) {
            Ok((report, bytes)) => {
                if let Some(p) = req.opts.progress {
                    p.fetch_add(bytes, Ordering::Relaxed);
                }
                let mut io_report =
                    IoReport::blank(weightlift_io::ReadEngineUsed::Pread, "read by the load server".into());
                io_report.requested_bytes = bytes;
                io_report.io_secs = t.elapsed().as_secs_f64();
                Ok(PathOutcome {
                    path: PathUsed::Server,
                    io: io_report,
                    copy_span_secs: None,
                    nvme: None,
                    server: Some(
                        json!({"socket": self.socket, "used": true, "secs": t.elapsed().as_secs_f64(), "report": report}),
                    ),
                })
            }
            Err(Declined::Cancelled) => Err(weightlift_io::IoError::Cancelled.into()),
            Err(Declined::Fallback(why)) => {
                tracing::info!(socket = %self.socket.display(), "the load server did not serve a load: {why}");
                // The destinations are published already: the local path's allocation step has nothing to do.
                let mut out = self.local.read(io, req, &mut || Ok(()))?;
                out.server = Some(json!({"socket": self.socket, "used": false, "reason": why}));
                Ok(out)
            }
        }
    }
}

impl ServerPath {
    /// Sends the read to the server and waits for its answer: the server's report and the bytes read.
    fn remote(&self, req: &DeviceRead<'_>) -> std::result::Result<(Value, u64), Declined> {
        let fallback = |what: &str, e: &dyn std::fmt::Display| Declined::Fallback(format!("{what}: {e}"));
        // The server writes outside this process's streams: the allocations must be done first.
        req.targets.synchronize().map_err(|e| fallback("waiting for the allocations", &e))?;
        let _restore = weightlift_cuda::ContextRestore::save();
        req.gpu.bind().map_err(|e| fallback("binding the device", &e))?;
        let mut dests = Vec::with_capacity(req.dest_lens.len());
        for i in 0..req.dest_lens.len() {
            let (ptr, len, _) = req.targets.wait(i as u32).map_err(|e| fallback("a destination", &e))?;
            if len == 0 {
                dests.push(Dest { handle: String::new(), offset: 0, len: 0 });
                continue;
            }
            let e = ipc::export(req.gpu, ptr).map_err(|e| {
                fallback("this memory cannot be shared with another process (the device's stream-ordered pool cannot; cuMemAlloc and torch's caching allocator can)", &e)
            })?;
            dests.push(Dest { handle: hex(&e.handle), offset: e.offset, len });
        }
        let files = req
            .files
            .iter()
            .map(|f| FileId::of(f).map_err(|e| fallback(&format!("{}", f.path.display()), &e)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let device_uuid = ipc::uuid(req.gpu).map_err(|e| fallback("the device's UUID", &e))?;
        let extents = req.extents.iter().map(|e| (e.file, e.offset, e.len, e.dest, e.dest_offset)).collect();
        let request = Request { protocol: PROTOCOL, device_uuid, files, extents, dests };
        let mut text = serde_json::to_string(&request).map_err(|e| fallback("encoding the request", &e))?;
        text.push('\n');
        let bytes = req.extents.iter().map(|e| e.len).sum();
        let mut stream = UnixStream::connect(&self.socket).map_err(|e| fallback("connecting", &e))?;
        stream.write_all(text.as_bytes()).map_err(|e| fallback("sending the request", &e))?;
        stream.set_read_timeout(Some(CANCEL_POLL)).map_err(|e| fallback("setting a timeout", &e))?;
        // From here the server may be writing: wait for its answer whatever happens, unless it exits.
        let mut answer = Vec::new();
        let mut told = false;
        let mut buf = [0u8; 64 << 10];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if answer.ends_with(b"\n") {
                        break;
                    }
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(fallback("waiting for the server", &e)),
            }
            if !told && req.opts.cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                told = true;
                let _ = stream.shutdown(std::net::Shutdown::Write);
            }
        }
        let reply: Reply = serde_json::from_slice(&answer)
            .map_err(|e| fallback("the server ended the connection without a well-formed answer (did it exit?)", &e))?;
        match reply {
            Reply { ok: true, report, .. } => Ok((report.unwrap_or(Value::Null), bytes)),
            Reply { cancelled: true, .. } if told => Err(Declined::Cancelled),
            Reply { error, .. } => Err(Declined::Fallback(format!(
                "the server refused: {}",
                error.unwrap_or_else(|| "no reason given".into())
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_through_hex() {
        let mut h = [0u8; ipc::HANDLE_BYTES];
        for (i, b) in h.iter_mut().enumerate() {
            *b = (i * 37 % 256) as u8;
        }
        assert_eq!(unhex(&hex(&h)).unwrap(), h);
        assert!(unhex("00").unwrap_err().contains("expected 128 hex digits"));
        assert!(unhex(&"zz".repeat(64)).unwrap_err().contains("not hex"));
        assert!(unhex(&"é".repeat(64)).is_err());
    }

    #[test]
    fn a_file_is_checked_by_identity_not_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.bin");
        std::fs::write(&p, b"0123456789").unwrap();
        let f = OpenFile::open(&p, false).unwrap();
        let id = FileId::of(&f).unwrap();
        id.check().unwrap();
        // The same name, another file: refused, naming both sides.
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"0123456789abc").unwrap();
        let why = id.check().unwrap_err();
        assert!(why.contains("is another file for the server"), "{why}");
        std::fs::remove_file(&p).unwrap();
        assert!(id.check().unwrap_err().contains("No such file"));
    }

    #[test]
    fn requests_and_replies_keep_every_field() {
        let req = Request {
            protocol: PROTOCOL,
            device_uuid: "ab".repeat(16),
            files: vec![FileId { path: "/x/y".into(), len: 5, dev: 1, ino: 2, mtime_ns: -3 }],
            extents: vec![(0, 8, 100, 1, 256)],
            dests: vec![Dest { handle: "00".repeat(64), offset: 512, len: 4096 }],
        };
        let text = serde_json::to_string(&req).unwrap();
        assert!(!text.contains('\n'));
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), req);
        let reply = Reply { ok: false, error: Some("no".into()), cancelled: true, report: None };
        assert_eq!(serde_json::from_str::<Reply>(&serde_json::to_string(&reply).unwrap()).unwrap(), reply);
    }

    #[test]
    fn the_default_socket_is_in_a_directory_of_its_own() {
        let s = default_socket();
        assert_eq!(s.file_name().unwrap(), "server.sock");
        let dir = s.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
        assert!(dir == "weightlift" || dir.starts_with("weightlift-"), "{}", s.display());
    }

    /// A server refuses requests it cannot serve, with a reason, without CUDA (which bind would need): malformed
    /// lines, another protocol, an unknown device, a file it sees differently.
    #[test]
    fn refusals_name_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let engine =
            Engine::new(crate::settings::Settings::default().server(crate::settings::ServerMode::Off)).unwrap();
        let p = dir.path().join("w.bin");
        std::fs::write(&p, [7u8; 64]).unwrap();
        let id = FileId::of(&OpenFile::open(&p, false).unwrap()).unwrap();
        let devices = vec![("cd".repeat(16), 0)];
        let ask = |req: &Request| {
            let (a, b) = UnixStream::pair().unwrap();
            let mut line = serde_json::to_string(req).unwrap();
            line.push('\n');
            (&a).write_all(line.as_bytes()).unwrap();
            serve_one(&engine, &devices, b);
            let mut out = String::new();
            (&a).read_to_string(&mut out).unwrap();
            serde_json::from_str::<Reply>(&out).unwrap()
        };
        let good = Request {
            protocol: PROTOCOL,
            device_uuid: "cd".repeat(16),
            files: vec![id.clone()],
            extents: vec![(0, 0, 64, 0, 0)],
            dests: vec![Dest { handle: "00".repeat(64), offset: 0, len: 64 }],
        };
        let r = ask(&Request { protocol: 99, ..good.clone() });
        assert!(!r.ok && r.error.as_deref().unwrap().contains("protocol 99 asked"), "{r:?}");
        let r = ask(&Request { device_uuid: "ef".repeat(16), ..good.clone() });
        assert!(r.error.as_deref().unwrap().contains("no device with UUID efef"), "{r:?}");
        let other = FileId { ino: id.ino + 1, ..id.clone() };
        let r = ask(&Request { files: vec![other], ..good.clone() });
        assert!(r.error.as_deref().unwrap().contains("is another file for the server"), "{r:?}");
        // A malformed line.
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"{\"protocol\": 1}\n").unwrap();
        serve_one(&engine, &devices, b);
        let mut out = String::new();
        (&a).read_to_string(&mut out).unwrap();
        let r: Reply = serde_json::from_str(&out).unwrap();
        assert!(r.error.as_deref().unwrap().contains("a malformed request"), "{r:?}");
        // A line cut short (the client went away mid-request).
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"{\"protocol\"").unwrap();
        a.shutdown(std::net::Shutdown::Write).unwrap();
        serve_one(&engine, &devices, b);
        let mut out = String::new();
        (&a).read_to_string(&mut out).unwrap();
        let r: Reply = serde_json::from_str(&out).unwrap();
        assert!(r.error.as_deref().unwrap().contains("ended before its end of line"), "{r:?}");
    }
}
