//! The load server: a resident process (`weightlift serve`) whose lanes' staging is set up once, reading
//! checkpoints into other processes' device memory.
//!
//! A process's first load onto a GPU sets up its lanes' staging (faulted in and pinned) while it runs, and that
//! made the first load of a fresh process 1.3-1.9× its second on the H100 machine (bench/results). The server
//! keeps that staging for every process on the machine: a client allocates its tensors' memory as usual, exports
//! each allocation through CUDA IPC as it is made, and sends the server the byte ranges to read into them over a
//! Unix socket; the server reads meanwhile, opening each allocation as it comes, and answers when the bytes are in
//! place.
//!
//! ```text
//!   client (fresh process)                              server (weightlift serve)
//!   request: files (dev, inode, size, mtime),  ───────▶  check the files are the same; start reading
//!            ranges, destination sizes                   (each lane waits only for its destination)
//!   allocate blocks (torch / cuMemAlloc); per block:
//!   cuIpcGetMemHandle, one line  ─────────────────────▶  cuIpcOpenMemHandle, publish to the lanes
//!   tensors ready  ◀── one line: ok and its report ───  every copy done; close the allocations
//! ```
//!
//! The client falls back to its own data path, saying why in its report, whenever the server cannot serve a load:
//! no server listening, memory that cannot be exported (the stream-ordered pool's), a file the server sees
//! differently (another mount namespace), a server error or the server's exit. Only a cancellation is not
//! retried: the server is told (the client shuts its side of the socket), stops, and answers before the client
//! frees anything. The default socket lives in a directory only its user can enter (checked, not assumed), the
//! server serves only processes of its own user, and a client talks only to a server of its own user (both by
//! `SO_PEERCRED`). Writes to the socket never raise SIGPIPE (`MSG_NOSIGNAL`): a host program that keeps SIGPIPE's
//! default is not killed by a peer that went away.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use weightlift_cuda::{Targets, ipc};
use weightlift_io::{IoEngine, IoReport, OpenFile};

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::path::{DeviceRead, GpuPath, LoadOpts, PathOutcome};
use crate::report::PathUsed;

/// The server's reason when a client stops sending destinations (the client's own reason is the one to report).
const CLIENT_STOPPED: &str = "the client ended the connection before sending every destination";

/// Version of the socket protocol; a server refuses requests of another.
pub const PROTOCOL: u32 = 1;
/// Largest request line a server reads (a checkpoint of a million tensors needs a few tens of MB).
const MAX_REQUEST_BYTES: u64 = 256 << 20;
/// How often a server's accept loop looks at its stop flag.
const STOP_POLL_MS: i32 = 200;
/// Longest wait of a server for a client's next destination: past it the read fails (a stalled client would
/// otherwise hold the server's lanes, which every client shares).
const DEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a waiting client looks at its cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(50);
/// Connections a server serves at once, each on a thread of its own; one past it is answered at once with a
/// refusal (its client reads by itself), so that a crowd of clients, or of connections that never send, cannot
/// make the server start threads without end.
pub const MAX_REQUESTS: usize = 64;
/// Longest wait of a server for a client's request line.
const REQUEST_TIMEOUT: Duration = DEST_TIMEOUT;

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

/// The request's first line: what to read, and where (destination `d` has `dest_lens[d]` bytes). The
/// destinations follow as [`DestLine`]s, one per line, as the client allocates them; the server reads meanwhile.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
struct Request {
    protocol: u32,
    device_uuid: String,
    files: Vec<FileId>,
    /// `(file, offset, len, destination, destination offset)`.
    extents: Vec<(u32, u64, u64, u32, u64)>,
    dest_lens: Vec<u64>,
}

/// Destination `d`: an exported allocation (64 bytes, hex; empty for a destination of no bytes) and the offset of
/// the destination in it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
struct DestLine {
    d: u32,
    handle: String,
    offset: u64,
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

/// Writes all of `bytes` to `stream` without raising SIGPIPE if the peer has gone (`MSG_NOSIGNAL`).
fn send_all(stream: &UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: a valid descriptor and a buffer of `bytes.len()` readable bytes.
        let n = unsafe { libc::send(stream.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// Checks that `dir` belongs to this user and that no one else may enter or change it.
fn check_private_dir(dir: &Path) -> Result<()> {
    let m = std::fs::symlink_metadata(dir).map_err(|e| server_err(dir, "reading the socket's directory", e))?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
        return Err(Error::Server(format!(
            "{}: the default socket's directory must be a directory of uid {uid} that only it may use (mode 700); it \
             is {} of uid {} with mode {:o}",
            dir.display(),
            if m.is_dir() { "a directory" } else { "not a directory" },
            m.uid(),
            m.mode() & 0o7777
        )));
    }
    Ok(())
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
    /// The connections being served (every call of `run` shares it).
    admission: Admission,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("socket", &self.socket).field("devices", &self.devices).finish()
    }
}

impl Server {
    /// Binds `socket` (its directory made, only for its user, if missing) for `engine`, whose `server` setting must
    /// be `off` (a server does not send its loads to a server). Fails if CUDA is unavailable, if a server already
    /// listens there, or if the socket is the default one and its directory is not this user's alone; a socket
    /// file nobody listens on is replaced.
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
            if std::path::absolute(default_socket()).ok().as_deref() == Some(socket.as_path()) {
                check_private_dir(dir)?;
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
        let mut server = Server {
            engine,
            listener,
            socket,
            ino: meta.ino(),
            devices: Vec::new(),
            admission: Admission::new(MAX_REQUESTS),
        };
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

    /// `(uuid, ordinal)` of each device served.
    pub fn devices(&self) -> &[(String, u32)] {
        &self.devices
    }

    /// Serves connections, each on a thread of its own (at most [`MAX_REQUESTS`] at once), until `stop` is set
    /// (looked at every 200 ms).
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
            let Some(admitted) = self.admission.admit() else {
                refuse_busy(&stream, MAX_REQUESTS);
                continue;
            };
            let (engine, devices) = (self.engine.clone(), self.devices.clone());
            let spawned = std::thread::Builder::new().name("wl-serve".into()).spawn(move || {
                let _admitted = admitted; // the slot is free again when the connection is done (or panicked)
                serve_one(&engine, &devices, stream, REQUEST_TIMEOUT)
            });
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

/// Counts the connections being served, up to a limit.
struct Admission {
    active: Arc<AtomicUsize>,
    limit: usize,
}

/// One admitted connection's slot, given back when dropped.
struct Admitted(Arc<AtomicUsize>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    fn new(limit: usize) -> Admission {
        Admission { active: Arc::new(AtomicUsize::new(0)), limit }
    }

    /// A slot, unless `limit` connections hold one.
    fn admit(&self) -> Option<Admitted> {
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.limit).then_some(n + 1))
            .ok()
            .map(|_| Admitted(self.active.clone()))
    }
}

/// Answers a connection past the limit at once, on the accepting thread, without reading its request: the
/// answer waits in the client's socket, which reads it even after this side has closed.
fn refuse_busy(stream: &UnixStream, limit: usize) {
    let reply = refusal(format!("the server is busy: {limit} connections are being served, its limit"));
    let mut text = serde_json::to_string(&reply).unwrap_or_else(|e| format!("{{\"ok\":false,\"error\":\"{e}\"}}"));
    text.push('\n');
    // A fresh socket's buffer takes the line at once; the timeout only bounds a pathological peer.
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    if let Err(e) = send_all(stream, text.as_bytes()) {
        tracing::debug!("answering a client past the limit: {e}");
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn server_err(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::Server(format!("{}: {what}: {e}", path.display()))
}

/// One connection: one request (awaited for at most `request_timeout` of silence), one reply.
fn serve_one(engine: &Engine, devices: &[(String, u32)], stream: UnixStream, request_timeout: Duration) {
    let reply = match peer_uid(&stream) {
        // SAFETY: getuid cannot fail.
        Ok(uid) if uid == unsafe { libc::getuid() } => None,
        Ok(uid) => Some(refusal(format!("the server serves only its own user; the client runs as uid {uid}"))),
        Err(e) => Some(refusal(format!("reading the client's credentials: {e}"))),
    };
    let mut served = None;
    let reply = reply.unwrap_or_else(|| {
        // A client that connects and never sends would otherwise hold its thread and its slot for good.
        let _ = stream.set_read_timeout(Some(request_timeout));
        let mut reader = BufReader::new(&stream);
        let mut line = String::new();
        match (&mut reader).take(MAX_REQUEST_BYTES).read_line(&mut line) {
            Ok(_) if line.ends_with('\n') => match serde_json::from_str::<Request>(&line) {
                Ok(req) => {
                    let reply = execute(engine, devices, &stream, reader, &req);
                    if reply.ok {
                        served = devices.iter().find(|(u, _)| *u == req.device_uuid).map(|&(_, n)| n);
                    }
                    reply
                }
                Err(e) => refusal(format!("a malformed request: {e}")),
            },
            Ok(_) => refusal("the request ended before its end of line (or passed 256 MiB)".into()),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                refusal(format!("the client sent nothing for {request_timeout:?} while its request was awaited"))
            }
            Err(e) => refusal(format!("reading the request: {e}")),
        }
    });
    let mut text = serde_json::to_string(&reply).unwrap_or_else(|e| format!("{{\"ok\":false,\"error\":\"{e}\"}}"));
    text.push('\n');
    if let Err(e) = send_all(&stream, text.as_bytes()) {
        tracing::debug!("answering a client: {e}");
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
    // A load of cold pages sets up larger staging slots; the next client's warm load should not have to set the
    // usual ones up again (it did, at 15 ms a lane, in bench/results/2026-11-25-h100-zo). Cheap when nothing
    // changed; after the reply, so that no client waits for it.
    if let Some(n) = served {
        if let Err(e) = engine.prepare(crate::Device::Cuda(n)) {
            tracing::warn!(device = n, "setting the staging up again after a load: {e}");
        }
    }
}

fn refusal(why: String) -> Reply {
    tracing::info!("load server: {why}");
    Reply { ok: false, error: Some(why), cancelled: false, report: None }
}

/// Runs one request. The read starts at once; a receiving thread opens each destination the client sends and
/// publishes it to the read's lanes (a lane waits only for its own destination), then watches the connection: the
/// client's end of it (a cancellation, or its exit) cancels the read.
fn execute<R: BufRead + Send>(
    engine: &Engine,
    devices: &[(String, u32)],
    stream: &UnixStream,
    lines: R,
    req: &Request,
) -> Reply {
    let checked = check_request(devices, req);
    let ordinal = match checked {
        Ok(n) => n,
        Err(e) => return refusal(e.to_string()),
    };
    let gpu = match engine.gpu(ordinal) {
        Ok(g) => g,
        Err(e) => return refusal(e.to_string()),
    };
    let targets = Targets::lazy(req.dest_lens.len());
    let cancel = AtomicBool::new(false);
    let done = AtomicBool::new(false);
    let opened: std::sync::Mutex<Vec<ipc::Imported>> = std::sync::Mutex::new(Vec::new());
    let t = Instant::now();
    let (result, refused) = std::thread::scope(|scope| {
        let (targets, cancel, done, opened, gpu) = (&targets, &cancel, &done, &opened, &gpu);
        let receiver = scope.spawn(move || {
            // A failure once the read has ended (which shuts the connection's reading side) is not the reason.
            let mut open = |h: &[u8; ipc::HANDLE_BYTES]| {
                let imported = ipc::Imported::open(gpu, h).map_err(|e| e.to_string())?;
                let v = (imported.ptr(), imported.len());
                opened.lock().unwrap_or_else(|p| p.into_inner()).push(imported);
                Ok(v)
            };
            let _ = stream.set_read_timeout(Some(DEST_TIMEOUT));
            let refused =
                receive_dests(lines, req, ordinal, targets, &mut open).err().filter(|_| !done.load(Ordering::Acquire));
            let _ = stream.set_read_timeout(None);
            if let Some(why) = &refused {
                targets.fail(why.clone());
                return refused;
            }
            // Then the end of the connection: the client gave up (woken by the shutdown below once done).
            while let Err(e) = (&*stream).read(&mut [0u8; 1]) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    break;
                }
            }
            if !done.load(Ordering::Acquire) {
                cancel.store(true, Ordering::Release);
                targets.fail("the client ended the connection".into());
            }
            None
        });
        let paths: Vec<PathBuf> = req.files.iter().map(|f| f.path.clone()).collect();
        let ranges: Vec<(usize, u64, u64, u32, u64)> =
            req.extents.iter().map(|&(f, o, l, d, od)| (f as usize, o, l, d, od)).collect();
        let opts = LoadOpts { cancel: Some(cancel), ..LoadOpts::default() };
        // SAFETY: each destination is published only once opened and checked to lie inside its allocation; the
        // client keeps the allocations alive and untouched until it has this reply, and the opened mappings are
        // closed only after the read has returned (every copy done).
        let result = unsafe { engine.read_into_targets(&paths, &ranges, &req.dest_lens, ordinal, targets, &opts) };
        done.store(true, Ordering::Release);
        let _ = stream.shutdown(std::net::Shutdown::Read);
        (result, receiver.join().unwrap_or_else(|_| Some("the receiving thread panicked".into())))
    });
    drop(opened);
    match (result, refused) {
        (Ok(report), _) => {
            let mut report = report.to_json();
            tracing::info!(bytes = report["bytes"].as_u64(), secs = t.elapsed().as_secs_f64(), "served");
            report["served_secs"] = json!(t.elapsed().as_secs_f64());
            Reply { ok: true, error: None, cancelled: false, report: Some(report) }
        }
        // A destination the server could not use is the reason the read failed.
        (Err(_), Some(why)) => refusal(why),
        (Err(e), None) => {
            let cancelled = e.is_cancelled() || cancel.load(Ordering::Acquire);
            tracing::info!("load server: a request failed: {e}");
            Reply { ok: false, error: Some(e.to_string()), cancelled, report: None }
        }
    }
}

/// The device a request names, once its protocol and files check out.
fn check_request(devices: &[(String, u32)], req: &Request) -> Result<u32> {
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
    Ok(ordinal)
}

/// Opens an exported allocation: its address here and its length.
type OpenHandle<'a> = dyn FnMut(&[u8; ipc::HANDLE_BYTES]) -> std::result::Result<(u64, u64), String> + 'a;

/// Reads the request's destination lines, opening each allocation once and publishing each destination as it
/// comes; `Err(why)` for a line it cannot use or a connection that ends before every destination came.
fn receive_dests<R: BufRead>(
    mut lines: R,
    req: &Request,
    ordinal: u32,
    targets: &Targets,
    open: &mut OpenHandle<'_>,
) -> std::result::Result<(), String> {
    let n = req.dest_lens.len();
    let mut seen = vec![false; n];
    let mut by_handle: HashMap<String, (u64, u64)> = HashMap::new();
    let mut line = String::new();
    for _ in 0..n {
        line.clear();
        match (&mut lines).take(4096).read_line(&mut line) {
            Ok(_) if line.ends_with('\n') => {}
            Ok(_) => return Err(CLIENT_STOPPED.into()),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(format!("the client sent no destination for {} s", DEST_TIMEOUT.as_secs()));
            }
            Err(e) => return Err(format!("reading a destination: {e}")),
        }
        let dl: DestLine = serde_json::from_str(&line).map_err(|e| format!("a malformed destination: {e}"))?;
        let d = dl.d as usize;
        if d >= n || std::mem::replace(&mut seen[d], true) {
            return Err(format!("destination {d} sent twice or past the {n} the request has"));
        }
        let len = req.dest_lens[d];
        if len == 0 {
            // SAFETY: no bytes.
            unsafe { targets.publish(&[(dl.d, 0, 0)], None) };
            continue;
        }
        let (base, alloc_len) = match by_handle.get(&dl.handle) {
            Some(&v) => v,
            None => {
                let v = open(&unhex(&dl.handle)?).map_err(|e| format!("opening destination {d}: {e}"))?;
                by_handle.insert(dl.handle.clone(), v);
                v
            }
        };
        if dl.offset.checked_add(len).is_none_or(|end| end > alloc_len) {
            return Err(format!(
                "destination {d} ({len} bytes at offset {}) passes the end of its {alloc_len}-byte allocation on cuda:{ordinal}",
                dl.offset
            ));
        }
        // SAFETY: a range inside an allocation opened above, which stays open until the read has returned.
        unsafe { targets.publish(&[(dl.d, base + dl.offset, len)], None) };
    }
    Ok(())
}

/// The client's side: a GPU path that hands the reads to a server, else to `local`.
pub(crate) struct ServerPath {
    pub socket: PathBuf,
    pub local: Box<dyn GpuPath>,
}

enum Declined {
    /// Nothing was allocated yet: read locally, allocating as usual.
    Before(String),
    /// The destinations are allocated, and the server will not write into them any more: read locally into them.
    After(String),
    /// The load was cancelled and the server has stopped.
    Cancelled,
    /// Allocating the destinations failed (the server has stopped).
    Alloc(Error),
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
        } else if req.dest_lens.is_empty() {
            Some("nothing to read".to_string())
        } else if req.opts.device_alloc.is_none() && !req.targets.is_published(0) {
            // The engine allocates this load's memory itself, from the pool: no server could open it.
            Some("this load's memory comes from the device's stream-ordered pool, which cannot be shared with another process (cuMemAlloc and torch's caching allocator can)".to_string())
        } else if let Some(why) = unshareable_fixed_memory(req) {
            Some(why)
        } else if req.observer.is_some() {
            Some("checksums are checked as bytes land, which only a local read can watch".to_string())
        } else if req.opts.faults.is_some() {
            Some("injected faults apply to local reads".to_string())
        } else {
            None
        };
        let not_used = |why: String| json!({"socket": self.socket, "used": false, "reason": why});
        if let Some(why) = local_reason {
            let mut out = self.local.read(io, req, allocate)?;
            out.server = Some(not_used(why));
            return Ok(out);
        }
        let t = Instant::now();
        match self.remote(req, allocate) {
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
            Err(Declined::Alloc(e)) => Err(e),
            Err(Declined::Before(why)) => {
                tracing::info!(socket = %self.socket.display(), "the load server did not serve a load: {why}");
                let mut out = self.local.read(io, req, allocate)?;
                out.server = Some(not_used(why));
                Ok(out)
            }
            Err(Declined::After(why)) => {
                tracing::info!(socket = %self.socket.display(), "the load server did not serve a load: {why}");
                // The destinations are published already: the local path's allocation step has nothing to do.
                let mut out = self.local.read(io, req, &mut || Ok(()))?;
                out.server = Some(not_used(why));
                Ok(out)
            }
        }
    }
}

impl ServerPath {
    /// Sends the request, allocates the destinations (sending each to the server as it is made, while the server
    /// reads), and waits for the server's answer: its report and the bytes read.
    fn remote(
        &self,
        req: &DeviceRead<'_>,
        allocate: &mut dyn FnMut() -> Result<()>,
    ) -> std::result::Result<(Value, u64), Declined> {
        let before = |what: &str, e: &dyn std::fmt::Display| Declined::Before(format!("{what}: {e}"));
        let files = req
            .files
            .iter()
            .map(|f| FileId::of(f).map_err(|e| before(&format!("{}", f.path.display()), &e)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let device_uuid = {
            let _restore = weightlift_cuda::ContextRestore::save();
            req.gpu.bind().map_err(|e| before("binding the device", &e))?;
            ipc::uuid(req.gpu).map_err(|e| before("the device's UUID", &e))?
        };
        let extents = req.extents.iter().map(|e| (e.file, e.offset, e.len, e.dest, e.dest_offset)).collect();
        let request = Request { protocol: PROTOCOL, device_uuid, files, extents, dest_lens: req.dest_lens.to_vec() };
        let mut text = serde_json::to_string(&request).map_err(|e| before("encoding the request", &e))?;
        text.push('\n');
        let bytes = req.extents.iter().map(|e| e.len).sum();
        let stream = UnixStream::connect(&self.socket).map_err(|e| before("connecting", &e))?;
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        match peer_uid(&stream) {
            Ok(u) if u == uid => {}
            Ok(u) => return Err(Declined::Before(format!("the server runs as uid {u}, not as this process's {uid}"))),
            Err(e) => return Err(before("reading the server's credentials", &e)),
        }
        send_request(&stream, text.as_bytes())?;
        // From here the server may write into what is allocated: whatever happens, wait for its answer (or its exit)
        // before returning.
        let (allocated, sent) = std::thread::scope(|scope| {
            let sender = scope.spawn(|| {
                let r = send_dests(&stream, req);
                if r.is_err() {
                    // The server then fails the read (a destination never comes) and answers.
                    let _ = stream.shutdown(std::net::Shutdown::Write);
                }
                r
            });
            // A panic of the allocation is held until the server has answered (it may be writing meanwhile).
            let allocated = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut *allocate));
            match &allocated {
                Ok(Err(e)) => req.targets.fail(format!("allocating the destinations failed: {e}")),
                Err(_) => req.targets.fail("allocating the destinations panicked".into()),
                Ok(Ok(())) => {}
            }
            (allocated, sender.join().unwrap_or_else(|_| Err("the sending thread panicked".into())))
        });
        let reply = wait_reply(&stream, req.opts.cancel);
        let allocated = allocated.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        if let Err(e) = allocated {
            return Err(Declined::Alloc(e));
        }
        let (reply, told) = reply.map_err(Declined::After)?;
        match reply {
            // (A destination the server no longer needed may have failed to send: the load is done all the same.)
            Reply { ok: true, report, .. } => Ok((report.unwrap_or(Value::Null), bytes)),
            Reply { cancelled: true, .. } if told => Err(Declined::Cancelled),
            // The server's reason, unless it only saw the client stop sending: then the client's.
            Reply { error, .. } => Err(Declined::After(match (error, sent) {
                (Some(e), Err(why)) if e.contains(CLIENT_STOPPED) => why,
                (Some(e), _) => format!("the server refused: {e}"),
                (None, Err(why)) => why,
                (None, Ok(())) => "the server refused without a reason".into(),
            })),
        }
    }
}

/// Sends the request line. A server that refused the connection at once (busy) has closed it. Where it did so
/// before this send, the send fails, and the answer waiting in the socket is the reason rather than the broken
/// pipe; where the request went into the socket first, the refusal is the answer that `wait_reply` reads.
fn send_request(stream: &UnixStream, text: &[u8]) -> std::result::Result<(), Declined> {
    let Err(e) = send_all(stream, text) else {
        return Ok(());
    };
    if matches!(e.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset) {
        // The peer has closed: this read ends at once, with its answer or with nothing.
        if let Ok((Reply { error: Some(why), .. }, _)) = wait_reply(stream, None) {
            return Err(Declined::Before(format!("the server refused: {why}")));
        }
    }
    Err(Declined::Before(format!("sending the request: {e}")))
}

/// For a read into memory the caller allocated already: why the server could not open it, if it could not (its first
/// destination tried).
fn unshareable_fixed_memory(req: &DeviceRead<'_>) -> Option<String> {
    if !req.targets.is_published(0) {
        return None;
    }
    let (ptr, len, _) = req.targets.wait(0).ok()?;
    if len == 0 {
        return None;
    }
    let _restore = weightlift_cuda::ContextRestore::save();
    let exported =
        req.gpu.bind().map_err(|e| e.to_string()).and_then(|()| ipc::export(req.gpu, ptr).map_err(|e| e.to_string()));
    exported.err().map(|e| {
        format!("this memory cannot be shared with another process (cuMemAlloc and torch's caching allocator can): {e}")
    })
}

/// Sends each destination as it is published: its allocation exported once it has been made.
fn send_dests(stream: &UnixStream, req: &DeviceRead<'_>) -> std::result::Result<(), String> {
    req.gpu.bind().map_err(|e| format!("binding the device: {e}"))?;
    for d in 0..req.dest_lens.len() as u32 {
        let (ptr, len, generation) = req.targets.wait(d).map_err(|e| e.to_string())?;
        let line = if len == 0 {
            DestLine { d, handle: String::new(), offset: 0 }
        } else {
            // The server writes outside this process's streams: the allocation must have been made first.
            req.targets.synchronize(generation).map_err(|e| format!("waiting for an allocation: {e}"))?;
            let e = ipc::export(req.gpu, ptr).map_err(|e| {
                format!("this memory cannot be shared with another process (the device's stream-ordered pool cannot; cuMemAlloc and torch's caching allocator can): {e}")
            })?;
            DestLine { d, handle: hex(&e.handle), offset: e.offset }
        };
        let mut text = serde_json::to_string(&line).map_err(|e| e.to_string())?;
        text.push('\n');
        // One write per destination, so that the server can use each as soon as it is made.
        send_all(stream, text.as_bytes()).map_err(|e| format!("sending destination {d}: {e}"))?;
    }
    Ok(())
}

/// Waits for the server's answer line, telling the server once `cancel` is set (the client shuts its side of the
/// connection, and the server stops and answers). `Err(why)`: no well-formed answer (the server exited).
fn wait_reply(stream: &UnixStream, cancel: Option<&AtomicBool>) -> std::result::Result<(Reply, bool), String> {
    // Without a timeout (should setting one fail) the wait still ends with the answer, only deaf to `cancel`.
    let _ = stream.set_read_timeout(Some(CANCEL_POLL));
    let mut answer = Vec::new();
    let mut told = false;
    let mut buf = [0u8; 64 << 10];
    loop {
        match (&*stream).read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.ends_with(b"\n") {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(format!("waiting for the server: {e}")),
        }
        if !told && cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            told = true;
            let _ = stream.shutdown(std::net::Shutdown::Write);
        }
    }
    let reply = serde_json::from_slice(&answer)
        .map_err(|e| format!("the server ended the connection without a well-formed answer (did it exit?): {e}"))?;
    Ok((reply, told))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

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
            dest_lens: vec![0, 4096],
        };
        let text = serde_json::to_string(&req).unwrap();
        assert!(!text.contains('\n'));
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), req);
        let d = DestLine { d: 1, handle: "00".repeat(64), offset: 512 };
        assert_eq!(serde_json::from_str::<DestLine>(&serde_json::to_string(&d).unwrap()).unwrap(), d);
        let reply = Reply { ok: false, error: Some("no".into()), cancelled: true, report: None };
        assert_eq!(serde_json::from_str::<Reply>(&serde_json::to_string(&reply).unwrap()).unwrap(), reply);
    }

    /// Destinations arrive one line each: every allocation is opened once, each destination is published at its
    /// offset, and a line the server cannot use stops the read with a reason.
    #[test]
    fn destinations_are_opened_once_and_checked() {
        let req = |lens: Vec<u64>| Request {
            protocol: PROTOCOL,
            device_uuid: String::new(),
            files: Vec::new(),
            extents: Vec::new(),
            dest_lens: lens,
        };
        let line = |d: u32, h: u8, offset: u64| {
            let h = if h == 0 { String::new() } else { format!("{h:02x}").repeat(64) };
            format!("{}\n", serde_json::to_string(&DestLine { d, handle: h, offset }).unwrap())
        };
        let mut opens = Vec::new();
        let mut open = |h: &[u8; ipc::HANDLE_BYTES]| {
            opens.push(h[0]);
            Ok((u64::from(h[0]) << 32, 1 << 20))
        };
        let r = req(vec![4096, 0, 256, 512]);
        let targets = Targets::lazy(4);
        let text = line(0, 7, 0) + &line(1, 0, 0) + &line(3, 9, 4096) + &line(2, 7, 8192);
        receive_dests(text.as_bytes(), &r, 0, &targets, &mut open).unwrap();
        assert_eq!(opens, vec![7, 9]);
        assert_eq!(targets.wait(0).unwrap(), (7 << 32, 4096, 0));
        assert_eq!(targets.wait(1).unwrap(), (0, 0, 0));
        assert_eq!(targets.wait(2).unwrap(), ((7 << 32) + 8192, 256, 0));
        assert_eq!(targets.wait(3).unwrap(), ((9 << 32) + 4096, 512, 0));
        let mut open = |_: &[u8; ipc::HANDLE_BYTES]| Ok((1 << 32, 4096));
        let refuse = |lens: Vec<u64>, text: String, open: &mut OpenHandle<'_>| {
            let n = lens.len();
            receive_dests(text.as_bytes(), &req(lens), 0, &Targets::lazy(n), open).unwrap_err()
        };
        let why = refuse(vec![4096, 16], line(0, 5, 0) + &line(1, 5, 4090), &mut open);
        assert!(why.contains("passes the end of its 4096-byte allocation"), "{why}");
        let why = refuse(vec![16, 16], line(0, 5, 0) + &line(0, 5, 16), &mut open);
        assert!(why.contains("sent twice"), "{why}");
        let why = refuse(vec![16], line(3, 5, 0), &mut open);
        assert!(why.contains("past the 1 the request has"), "{why}");
        let why = refuse(vec![16, 16], line(0, 5, 0), &mut open);
        assert!(why.contains("before sending every destination"), "{why}");
        // A client that sends nothing while the server waits (the socket's read timeout passed).
        struct Silent;
        impl Read for Silent {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::WouldBlock.into())
            }
        }
        let why = receive_dests(BufReader::new(Silent), &req(vec![16]), 0, &Targets::lazy(1), &mut open).unwrap_err();
        assert!(why.contains("sent no destination for 30 s"), "{why}");
        let why = refuse(vec![16], "{\"d\": 0}\n".into(), &mut open);
        assert!(why.contains("a malformed destination"), "{why}");
        let why = refuse(vec![16], "{\"d\":0,\"handle\":\"xy\",\"offset\":0}\n".into(), &mut open);
        assert!(why.contains("expected 128 hex digits"), "{why}");
        let mut failing = |_: &[u8; ipc::HANDLE_BYTES]| Err("cuIpcOpenMemHandle failed".to_string());
        let why = refuse(vec![16], line(0, 5, 0), &mut failing);
        assert!(why.contains("opening destination 0: cuIpcOpenMemHandle failed"), "{why}");
    }

    #[test]
    fn the_default_sockets_directory_must_be_this_users_alone() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("weightlift");
        std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
        check_private_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let why = check_private_dir(&d).unwrap_err().to_string();
        assert!(why.contains("only it may use (mode 700)") && why.contains("mode 755"), "{why}");
        let f = dir.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(check_private_dir(&f).unwrap_err().to_string().contains("not a directory"));
    }

    #[test]
    fn writes_to_a_peer_that_went_away_fail_instead_of_signalling() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        let e = send_all(&a, b"hello\n").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn connections_past_the_limit_are_not_admitted_until_a_slot_comes_back() {
        let admission = Admission::new(2);
        let a = admission.admit().expect("first");
        let b = admission.admit().expect("second");
        assert!(admission.admit().is_none(), "a third connection past a limit of 2");
        drop(a);
        let c = admission.admit().expect("a slot given back is taken again");
        assert!(admission.admit().is_none());
        drop((b, c));
        assert_eq!(admission.active.load(Ordering::Acquire), 0);
        // A serving thread that panics gives its slot back too.
        let held = admission.admit().unwrap();
        let _ = std::thread::spawn(move || {
            let _held = held;
            panic!("a serving thread panics");
        })
        .join();
        assert_eq!(admission.active.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_client_refused_as_busy_reports_the_servers_reason_not_the_broken_pipe() {
        let request = vec![b'x'; 1 << 20]; // more than the socket holds: the send meets the closed side
        let (client, server) = UnixStream::pair().unwrap();
        refuse_busy(&server, MAX_REQUESTS);
        drop(server);
        match send_request(&client, &request) {
            Err(Declined::Before(why)) => {
                assert!(why.starts_with("the server refused: the server is busy: 64 connections"), "{why}")
            }
            _ => panic!("expected a refusal before anything was sent"),
        }
        // A server gone without an answer: the broken pipe is the reason.
        let (client, server) = UnixStream::pair().unwrap();
        drop(server);
        match send_request(&client, &request) {
            Err(Declined::Before(why)) => assert!(why.starts_with("sending the request: "), "{why}"),
            _ => panic!("expected the send to fail"),
        }
        // The usual order: the request is in the socket before the server refuses; the refusal is the answer.
        let (client, server) = UnixStream::pair().unwrap();
        assert!(send_request(&client, b"{}\n").is_ok());
        refuse_busy(&server, MAX_REQUESTS);
        drop(server);
        let (reply, told) = wait_reply(&client, None).unwrap();
        assert!(!reply.ok && !told);
        assert!(reply.error.unwrap().starts_with("the server is busy: 64 connections"));
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
            serve_one(&engine, &devices, b, REQUEST_TIMEOUT);
            let mut out = String::new();
            (&a).read_to_string(&mut out).unwrap();
            serde_json::from_str::<Reply>(&out).unwrap()
        };
        let good = Request {
            protocol: PROTOCOL,
            device_uuid: "cd".repeat(16),
            files: vec![id.clone()],
            extents: vec![(0, 0, 64, 0, 0)],
            dest_lens: vec![64],
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
        serve_one(&engine, &devices, b, REQUEST_TIMEOUT);
        let mut out = String::new();
        (&a).read_to_string(&mut out).unwrap();
        let r: Reply = serde_json::from_str(&out).unwrap();
        assert!(r.error.as_deref().unwrap().contains("a malformed request"), "{r:?}");
        // A line cut short (the client went away mid-request).
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"{\"protocol\"").unwrap();
        a.shutdown(std::net::Shutdown::Write).unwrap();
        serve_one(&engine, &devices, b, REQUEST_TIMEOUT);
        let mut out = String::new();
        (&a).read_to_string(&mut out).unwrap();
        let r: Reply = serde_json::from_str(&out).unwrap();
        assert!(r.error.as_deref().unwrap().contains("ended before its end of line"), "{r:?}");
        // A client that connects and sends nothing: its connection is closed after the timeout, with the reason.
        let (a, b) = UnixStream::pair().unwrap();
        let t = Instant::now();
        serve_one(&engine, &devices, b, Duration::from_millis(200));
        assert!(t.elapsed() >= Duration::from_millis(200));
        let mut out = String::new();
        (&a).read_to_string(&mut out).unwrap();
        let r: Reply = serde_json::from_str(&out).unwrap();
        assert!(r.error.as_deref().unwrap().contains("the client sent nothing for 200ms"), "{r:?}");
    }
}
