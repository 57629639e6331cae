//! The keeper process's side: a listening socket, a thread per connection, one loader thread, the registry.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::thread::JoinHandle;

use weightlift_cuda::Gpu;
use weightlift_io::OpenFile;

use super::memory::{Filling, Kept};
use super::registry::{Found, Refused, Registry};
use super::stamp::{Key, ObjectStamp, Stamp, display_url};
use super::wire::{self, Input, PROTO, Reply, Request, Status, WireError};
use crate::device::Device;
use crate::engine::Engine;
use crate::engine::read::{ByteRange, Dests, ReadRequest, Sources};
use crate::error::{Error, Result};
use crate::settings::Settings;

/// How a keeper is started.
#[derive(Clone, Debug)]
pub struct KeeperConfig {
    /// The device it keeps files on: `cuda:N`, or `cpu` (host memory, for host loads).
    pub device: Device,
    /// Its socket (default: [`super::default_socket`] of the device).
    pub socket: Option<PathBuf>,
    /// Memory it may hold, in bytes (default: 80 % of the device's free memory when it starts; for `cpu`, half of
    /// the memory available).
    pub budget: Option<u64>,
    /// Settings of the engine it reads files with.
    pub settings: Settings,
}

/// A kept input: its memory, and for a file the descriptor it was read through (a file whose last name is removed,
/// replaced by a rename say, is retired: no one can open it again).
#[derive(Debug)]
pub(crate) struct Held {
    memory: Kept,
    file: Option<OwnedFd>,
}

impl Held {
    fn is_gone(&self) -> bool {
        self.file.as_ref().is_some_and(|f| rustix::fs::fstat(f).map_or(true, |st| st.st_nlink == 0))
    }
}

/// A load for the loader thread: a file (through the client's descriptor) or an object (by its URL, at its ETag).
struct Job {
    key: Key,
    fd: Option<OwnedFd>,
    /// An object kept by name, opened already (its first request pinned the ETag): read without opening it again.
    opened: Option<Arc<weightlift_remote::Object>>,
    path: String,
}

/// Objects the keeper could not fetch, and why (remembered so that each later load is not one more fetch that
/// fails the same way; forgotten after [`FAILURE_MEMORY`], when the keeper is asked to keep the object by name, or
/// past this many).
const FAILURES_KEPT: usize = 256;

/// The longest input a keeper takes (2^50 bytes: far past any device, and its rounding cannot overflow).
const MAX_LEN: u64 = 1 << 50;

/// How long a failed fetch is remembered: a failure may pass (the network, device memory), and the next load after
/// this asks again.
const FAILURE_MEMORY: std::time::Duration = std::time::Duration::from_secs(60);

struct Shared {
    device: Device,
    uuid: Option<String>,
    gpu: Option<(Gpu, u64)>,
    reg: Mutex<Registry<Held>>,
    socket: PathBuf,
    /// The listening socket, shut down to wake the acceptor when stopping.
    listener: Arc<OwnedFd>,
    /// Signalled whenever a load ends (for [`Keeper::wait_idle`]).
    idle: Condvar,
    stop: AtomicBool,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    served: AtomicU64,
    failed: AtomicU64,
    /// Objects whose fetch failed, and why.
    failures: Mutex<std::collections::HashMap<Key, (std::time::Instant, String)>>,
    uid: u32,
}

/// A running keeper (see the module documentation). Stops when dropped: it stops accepting, finishes the load in
/// progress, frees what it keeps (memory a client still maps stays until that client unmaps it) and removes its
/// socket.
pub struct Keeper {
    shared: Arc<Shared>,
    socket: PathBuf,
    acceptor: Option<JoinHandle<()>>,
    loader: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keeper({} at {})", self.shared.device, self.socket.display())
    }
}

fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

impl Keeper {
    /// Starts a keeper: opens the device, binds the socket (refusing one another keeper listens on, reclaiming a
    /// stale one) and starts serving on threads of its own.
    pub fn start(config: KeeperConfig) -> Result<Keeper> {
        let (gpu, uuid) = match config.device {
            Device::Cuda(n) => {
                let gpu = Gpu::open(n)?;
                let granularity = weightlift_cuda::vmm::shareable_granularity(&gpu).map_err(|why| {
                    Error::InvalidArgument(format!("cuda:{n} cannot keep memory for other processes: {why}"))
                })?;
                let uuid = weightlift_cuda::vmm::gpu_uuid(&gpu)?;
                (Some((gpu, granularity)), Some(uuid))
            }
            Device::Cpu => (None, None),
            Device::PinnedCpu => {
                return Err(Error::InvalidArgument("a keeper keeps on cuda:N or cpu, not cpu:pinned".into()));
            }
        };
        let budget = match (config.budget, &gpu) {
            (Some(b), _) => b,
            (None, Some((g, _))) => g.mem_info()?.0 / 10 * 8,
            (None, None) => mem_available() / 2,
        };
        let socket = match config.socket {
            Some(p) => p,
            None => super::socket::default_socket(config.device)?,
        };
        let listener = Arc::new(super::socket::bind(&socket)?);
        let engine = Engine::new(config.settings)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let shared = Arc::new(Shared {
            device: config.device,
            uuid,
            gpu,
            reg: Mutex::new(Registry::new(budget)),
            socket: socket.clone(),
            listener: listener.clone(),
            idle: Condvar::new(),
            stop: AtomicBool::new(false),
            jobs: Mutex::new(Some(tx)),
            served: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            failures: Mutex::new(std::collections::HashMap::new()),
            uid: rustix::process::getuid().as_raw(),
        });
        let loader = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("weightlift-keep-load".into())
                .spawn(move || {
                    for job in rx {
                        if shared.stop.load(Ordering::SeqCst) {
                            // Stopping: what is queued is not read.
                            let dropped = shared.lock().finish(&job.key, None);
                            drop(dropped);
                            shared.idle.notify_all();
                            continue;
                        }
                        let key = job.key.clone();
                        let panicked =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| shared.load(&engine, job)));
                        if panicked.is_err() {
                            tracing::warn!("keeper: a load panicked (a bug); its file is not kept");
                            let dropped = shared.lock().finish(&key, None);
                            drop(dropped);
                            shared.idle.notify_all();
                        }
                    }
                })
                .map_err(|e| Error::InvalidArgument(format!("starting the keeper's loader: {e}")))?
        };
        let acceptor = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("weightlift-keep".into())
                .spawn(move || accept_loop(shared))
                .map_err(|e| Error::InvalidArgument(format!("starting the keeper: {e}")))?
        };
        tracing::info!(device = %config.device, socket = %socket.display(), budget, "keeper started");
        Ok(Keeper { shared, socket, acceptor: Some(acceptor), loader: Some(loader) })
    }

    /// The socket it listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Its budget in bytes.
    pub fn budget(&self) -> u64 {
        self.shared.lock().budget()
    }

    /// Starts keeping the files or objects (URLs) `paths` (loaded in the background, in order;
    /// [`Keeper::wait_idle`] waits for them). One it keeps already is left as it is; one that does not fit the
    /// budget, or an object without an ETag, is an error naming it.
    pub fn keep(&self, paths: &[PathBuf]) -> Result<()> {
        for p in paths {
            if let weightlift_remote::Location::Object(url) =
                weightlift_remote::Location::new(p).map_err(remote_error)?
            {
                let shown = display_url(url.as_str());
                if url.has_query() {
                    // Loads never ask for such a URL (a presigned URL's signature changes with each signing), so it
                    // would never be served: refused before any request, its query left out of the message.
                    return Err(Error::InvalidArgument(format!(
                        "{shown}: the URL has a query string (a signature, say); keepers keep objects by URL \
                         without one, and loads of it are never asked; not kept"
                    )));
                }
                // One request (the first byte) pins the object's version: it is kept at that ETag, and the loader
                // reads the object opened here.
                let object = weightlift_remote::Object::open(&url).map_err(remote_error)?;
                let Some(etag) = object.etag() else {
                    return Err(Error::InvalidArgument(format!(
                        "{shown}: its store gives no ETag, which would tell a later version from this one; not kept"
                    )));
                };
                let key = Key::Object(ObjectStamp {
                    url: url.as_str().to_string(),
                    etag: etag.to_string(),
                    len: object.len(),
                });
                self.shared.failures.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
                self.shared
                    .enqueue(key, None, Some(Arc::new(object)), shown.clone())
                    .map_err(|why| Error::InvalidArgument(format!("{shown}: {why}")))?;
                continue;
            }
            let f = std::fs::File::open(p)
                .map_err(|cause| Error::Io(weightlift_io::IoError::Open { path: p.clone(), cause }))?;
            let fd: OwnedFd = f.into();
            if !Stamp::is_regular(&fd).unwrap_or(false) {
                return Err(Error::InvalidArgument(format!("{}: not a regular file", p.display())));
            }
            let stamp = Stamp::of(&fd).map_err(|e| Error::InvalidArgument(format!("{}: {e}", p.display())))?;
            self.shared
                .enqueue(Key::File(stamp), Some(fd), None, p.display().to_string())
                .map_err(|why| Error::InvalidArgument(format!("{}: {why}", p.display())))?;
        }
        Ok(())
    }

    /// Waits until no load is in progress.
    pub fn wait_idle(&self) {
        let mut reg = self.shared.lock();
        while reg.loading() > 0 {
            reg = self.shared.idle.wait(reg).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// What it holds now.
    pub fn status(&self) -> Status {
        self.shared.status()
    }

    /// Stops it (as dropping it does), once its loads in progress have ended.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // The acceptor blocks in accept: a connection of our own wakes it to see the flag (it removes the socket's
        // name while it still listens, so no keeper started meanwhile loses its own), and shutting the socket down
        // wakes it where the name is gone already.
        let _ = wire::connect(&self.socket);
        let _ = rustix::net::shutdown(&*self.shared.listener, rustix::net::Shutdown::Read);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        self.shared.jobs.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(l) = self.loader.take() {
            let _ = l.join();
        }
        let freed = self.shared.lock().clear();
        drop(freed);
        tracing::info!(socket = %self.socket.display(), "keeper stopped");
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        if self.acceptor.is_some() {
            self.shutdown();
        }
    }
}

fn accept_loop(shared: Arc<Shared>) {
    let stopping = || {
        if shared.stop.load(Ordering::SeqCst) {
            let _ = std::fs::remove_file(&shared.socket);
            return true;
        }
        false
    };
    loop {
        let conn = match rustix::net::accept_with(&*shared.listener, rustix::net::SocketFlags::CLOEXEC) {
            Ok(c) => c,
            Err(_) if stopping() => return,
            Err(rustix::io::Errno::INTR) | Err(rustix::io::Errno::CONNABORTED) => continue,
            Err(e) => {
                tracing::warn!("keeper: accept failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        if stopping() {
            return;
        }
        let s = shared.clone();
        let spawned = std::thread::Builder::new().name("weightlift-keep-conn".into()).spawn(move || s.serve(conn));
        if let Err(e) = spawned {
            tracing::warn!("keeper: no thread for a connection: {e}");
        }
    }
}

fn miss(code: &str, reason: String) -> Reply {
    Reply::Miss { proto: PROTO, code: code.into(), reason }
}

/// A connection's handouts, given back when it ends: also when its thread unwinds from a panic, which would
/// otherwise leave them leased (never evicted) for the keeper's life.
struct Leases<'a> {
    shared: &'a Shared,
    keys: Vec<Key>,
}

impl Drop for Leases<'_> {
    fn drop(&mut self) {
        let freed: Vec<_> = {
            let mut reg = self.shared.lock();
            self.keys.iter().filter_map(|s| reg.release(s)).collect()
        };
        drop(freed); // freed outside the lock
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry<Held>> {
        self.reg.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bytes_for(&self, len: u64) -> u64 {
        match &self.gpu {
            Some((_, g)) => len.max(1).div_ceil(*g) * g,
            None => len,
        }
    }

    fn status(&self) -> Reply {
        let reg = self.lock();
        Reply::Status {
            proto: PROTO,
            device: self.device.to_string(),
            budget: reg.budget(),
            used: reg.used(),
            entries: reg.status(),
            served: self.served.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }

    /// Reserves room for `key` and queues its load (from `fd` for a file, from `opened` for an object opened
    /// already); `Ok(false)` if it is held already.
    fn enqueue(
        &self,
        key: Key,
        fd: Option<OwnedFd>,
        opened: Option<Arc<weightlift_remote::Object>>,
        path: String,
    ) -> std::result::Result<bool, String> {
        let evicted = {
            let mut reg = self.lock();
            match reg.find(&key) {
                Found::Ready(_) | Found::Loading => return Ok(false),
                Found::Absent { .. } => {}
            }
            match reg.begin(key.clone(), self.bytes_for(key.len()), path.clone()) {
                Ok(evicted) => evicted,
                Err(Refused::Held) => return Ok(false),
                Err(Refused::OverBudget(why)) => return Err(why),
            }
        };
        drop(evicted); // freed outside the lock
        let job = Job { key: key.clone(), fd, opened, path };
        let sent = self.jobs.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|tx| tx.send(job));
        if !matches!(sent, Some(Ok(()))) {
            let _ = self.lock().finish(&key, None);
            return Err("the keeper is stopping".into());
        }
        Ok(true)
    }

    /// Reads a file into new memory and publishes it, unless it changed while being read.
    fn load(&self, engine: &Engine, job: Job) {
        let t = std::time::Instant::now();
        let kept = self.fill(engine, &job);
        let ok = kept.is_ok();
        match &kept {
            Ok(_) => tracing::info!(
                path = %job.path,
                bytes = job.key.len(),
                secs = t.elapsed().as_secs_f64(),
                "keeper: kept"
            ),
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(path = %job.path, "keeper: not kept: {e}");
                if matches!(job.key, Key::Object(_)) {
                    let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
                    if failures.len() >= FAILURES_KEPT {
                        failures.clear();
                    }
                    failures.insert(job.key.clone(), (std::time::Instant::now(), e.to_string()));
                }
            }
        }
        let held = kept.ok().map(|memory| Arc::new(Held { memory, file: job.fd }));
        let dropped = self.lock().finish(&job.key, held);
        drop(dropped);
        if !ok {
            tracing::debug!("keeper: load failed");
        }
        self.idle.notify_all();
    }

    fn fill(&self, engine: &Engine, job: &Job) -> Result<Kept> {
        let changed = || Error::InvalidArgument(format!("{} changed while the keeper read it", job.path));
        let source = match (&job.key, &job.fd) {
            (Key::File(stamp), Some(fd)) => {
                settle(stamp, fd, &job.path)?;
                // The client's descriptor, reopened through /proc: the same inode, whatever its path names now.
                let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
                (stamp.len > 0).then(|| OpenFile::open(&path, true)).transpose()?
            }
            (Key::Object(o), _) => {
                Some(open_object(o, job.opened.clone(), engine.settings().remote_cache_dir.value.0.as_deref())?)
            }
            (Key::File(_), None) => {
                return Err(Error::InvalidArgument(format!("{}: a file to keep without its descriptor", job.path)));
            }
        };
        let gpu = self.gpu.as_ref().map(|(g, gr)| (g, *gr));
        let len = job.key.len();
        let filling = Filling::create(gpu, len)?;
        let ordinal = match self.device {
            Device::Cuda(n) => n,
            _ => 0,
        };
        if let Some(file) = source.filter(|_| len > 0) {
            let files = [Arc::new(file)];
            let ranges = [ByteRange::new(0, 0, len, 0)];
            let dests = [filling.dest(ordinal)];
            let req = ReadRequest::new(Sources::Open(&files), &ranges, Dests::Memory(&dests));
            // SAFETY: the destination is the new memory, `filling.bytes()` long, which nothing else can reach
            // until it is published below.
            unsafe { engine.read(&req) }?;
            if let Some((g, _)) = &self.gpu {
                g.synchronize()?;
            }
        }
        // A file is checked again after the read; an object's GETs each asked for its ETag (a replaced object
        // fails them).
        if let (Key::File(stamp), Some(fd)) = (&job.key, &job.fd) {
            let after = Stamp::of(fd).map_err(|e| Error::InvalidArgument(format!("{}: {e}", job.path)))?;
            if after != *stamp {
                return Err(changed());
            }
        }
        filling.seal()
    }

    fn serve(self: Arc<Self>, conn: OwnedFd) {
        match wire::peer_uid(&conn) {
            Ok(uid) if uid == self.uid => {}
            Ok(uid) => {
                let reason = format!("refused: uid {uid} is not the keeper's user (uid {})", self.uid);
                tracing::warn!("keeper: {reason}");
                // Its request is read (and its descriptors closed) first: a socket closed with a frame unread resets
                // the connection, and the client would not see why.
                let _ = rustix::net::sockopt::set_socket_timeout(
                    &conn,
                    rustix::net::sockopt::Timeout::Recv,
                    Some(std::time::Duration::from_secs(1)),
                );
                let _ = wire::recv::<serde_json::Value>(conn.as_fd());
                let _ = wire::send(conn.as_fd(), &Reply::Error { proto: PROTO, reason }, &[]);
                return;
            }
            Err(e) => {
                tracing::warn!("keeper: {e}");
                return;
            }
        }
        let mut leases = Leases { shared: &self, keys: Vec::new() };
        loop {
            let (req, fds) = match wire::recv::<Request>(conn.as_fd()) {
                Ok(r) => r,
                Err(WireError::Closed) => break,
                Err(e) => {
                    let _ = wire::send(conn.as_fd(), &Reply::Error { proto: PROTO, reason: e.to_string() }, &[]);
                    break;
                }
            };
            let reply = match req {
                Request::Status { proto } if proto == PROTO && fds.is_empty() => Ok((self.status(), Vec::new())),
                Request::Get { proto, device, uuid, inputs, keep }
                    if proto == PROTO && inputs.iter().filter(|i| matches!(i, Input::File)).count() == fds.len() =>
                {
                    self.get(&device, uuid.as_deref(), inputs, fds, keep, &mut leases.keys)
                }
                Request::Status { proto } | Request::Get { proto, .. } if proto != PROTO => {
                    Err(format!("protocol {proto} asked; this keeper speaks {PROTO}"))
                }
                _ => Err("the frame carries a different number of descriptors than it declares".into()),
            };
            match reply {
                Ok((r, out)) => {
                    let borrowed: Vec<_> = out.iter().map(|f| f.as_fd()).collect();
                    if let Err(e) = wire::send(conn.as_fd(), &r, &borrowed) {
                        tracing::debug!("keeper: reply not sent: {e}");
                        break;
                    }
                }
                Err(reason) => {
                    let _ = wire::send(conn.as_fd(), &Reply::Error { proto: PROTO, reason }, &[]);
                    break;
                }
            }
        }
        // The connection ended (or went bad): its handouts are given back (as `leases` drops).
    }

    /// Serves a Get: every input kept → a hit with one descriptor each (leased until the connection ends);
    /// otherwise a miss, and (with `keep`) the inputs not kept queued for loading.
    fn get(
        &self,
        device: &str,
        uuid: Option<&str>,
        inputs: Vec<Input>,
        fds: Vec<OwnedFd>,
        keep: bool,
        leases: &mut Vec<Key>,
    ) -> std::result::Result<(Reply, Vec<OwnedFd>), String> {
        let mine = self.device.to_string();
        if device != mine || (uuid.is_some() && self.uuid.is_some() && uuid != self.uuid.as_deref()) {
            let theirs = uuid.map_or(String::new(), |u| format!(" ({u})"));
            let ours = self.uuid.as_ref().map_or(String::new(), |u| format!(" ({u})"));
            return Ok((
                miss("other_device", format!("the keeper keeps on {mine}{ours}, the load is onto {device}{theirs}")),
                Vec::new(),
            ));
        }
        if inputs.len() > wire::MAX_FDS {
            // The answer carries a descriptor per input.
            return Err(format!("{} inputs; a keeper serves loads of at most {}", inputs.len(), wire::MAX_FDS));
        }
        let mut fds = fds.into_iter();
        let mut stamps = Vec::with_capacity(inputs.len());
        let mut files: Vec<Option<OwnedFd>> = Vec::with_capacity(inputs.len());
        let mut paths: Vec<String> = Vec::with_capacity(inputs.len());
        for input in inputs {
            match input {
                Input::File => {
                    let fd = fds.next().ok_or("fewer descriptors than files")?;
                    if !Stamp::is_regular(&fd).unwrap_or(false) {
                        return Err("a descriptor that is not a regular file".into());
                    }
                    stamps.push(Key::File(Stamp::of(&fd).map_err(|e| format!("fstat: {e}"))?));
                    paths.push(
                        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                            .map_or_else(|_| "?".into(), |p| p.display().to_string()),
                    );
                    files.push(Some(fd));
                }
                Input::Object(o) => {
                    if o.etag.is_empty() || !weightlift_remote::is_url(&o.url) || o.len > MAX_LEN {
                        return Err(format!("an object without an ETag, a URL or a length ({})", o.display_url()));
                    }
                    paths.push(o.display_url());
                    stamps.push(Key::Object(o));
                    files.push(None);
                }
            }
        }
        let mut reg = self.lock();
        let gone = reg.retire_where(Held::is_gone);
        let found: Vec<Found<Held>> = stamps.iter().map(|s| reg.find(s)).collect();
        if found.iter().all(|f| matches!(f, Found::Ready(_))) {
            for s in &stamps {
                reg.lease(s);
            }
            drop(reg);
            drop(gone);
            leases.extend_from_slice(&stamps);
            let kept: Vec<Arc<Held>> =
                found.into_iter().filter_map(|f| if let Found::Ready(m) = f { Some(m) } else { None }).collect();
            let _restore = weightlift_cuda::ContextRestore::save();
            if let Some((g, _)) = &self.gpu {
                g.bind().map_err(|e| e.to_string())?;
            }
            let mut out = Vec::with_capacity(kept.len());
            for k in &kept {
                match k.memory.handout() {
                    Ok(fd) => out.push(fd),
                    Err(e) => return Ok((miss("failed", format!("exporting kept memory: {e}")), Vec::new())),
                }
            }
            self.served.fetch_add(1, Ordering::Relaxed);
            let sizes = kept.iter().map(|k| k.memory.bytes()).collect();
            return Ok((Reply::Hit { proto: PROTO, sizes, stamps }, out));
        }
        let changed = found.iter().any(|f| matches!(f, Found::Absent { changed: true }));
        let loading = found.iter().any(|f| matches!(f, Found::Loading));
        drop(reg);
        drop(gone);
        let absent: Vec<usize> = (0..found.len()).filter(|&i| matches!(found[i], Found::Absent { .. })).collect();
        let total = stamps.len();
        // An object the keeper failed to fetch is not fetched again for every load (a new version, or a keep of it
        // by name, is).
        let failed: Vec<(usize, String)> = {
            let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
            failures.retain(|_, (at, _)| at.elapsed() < FAILURE_MEMORY);
            absent.iter().filter_map(|&i| failures.get(&stamps[i]).map(|(_, why)| (i, why.clone()))).collect()
        };
        if !failed.is_empty() {
            // The others are still queued (with `keep`), so that they are kept for the next load.
            if keep {
                for &i in absent.iter().filter(|i| !failed.iter().any(|(f, _)| f == *i)) {
                    let fd = files[i].take();
                    let _ = self.enqueue(stamps[i].clone(), fd, None, paths[i].clone());
                }
            }
            let (i, why) = &failed[0];
            return Ok((miss("failed", format!("the keeper could not fetch {}: {why}", paths[*i])), Vec::new()));
        }
        if keep && !absent.is_empty() {
            for &i in &absent {
                let fd = files[i].take();
                if let Err(why) = self.enqueue(stamps[i].clone(), fd, None, paths[i].clone()) {
                    return Ok((miss("over_budget", format!("{}: {why}", paths[i])), Vec::new()));
                }
            }
            let what = if changed { "changed since it was kept" } else { "not kept" };
            return Ok((
                miss(
                    if changed { "changed" } else { "not_kept" },
                    format!("{} of {total} file(s) {what}; the keeper is loading them now", absent.len()),
                ),
                Vec::new(),
            ));
        }
        if loading && absent.is_empty() {
            return Ok((miss("loading", "the keeper is still loading it".into()), Vec::new()));
        }
        let (code, what) = if changed { ("changed", "changed since it was kept") } else { ("not_kept", "not kept") };
        Ok((miss(code, format!("{} of {total} file(s) {what}", absent.len())), Vec::new()))
    }
}

/// Waits until a file's last change is two clock ticks old. File times come from a clock that advances in ticks (up
/// to 10 ms): a write in the tick of the stamp would leave it as it is. Reading starts two ticks after the file's last
/// change, from a stamp taken then, so that any later write shows in the stamp checked after the read.
fn settle(stamp: &Stamp, fd: &OwnedFd, path: &str) -> Result<()> {
    let newest = stamp.mtime_ns.max(stamp.ctime_ns);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64);
    let wait = newest + 20_000_000 - now;
    if wait > 1_000_000_000 {
        return Err(Error::InvalidArgument(format!("{path}: its times lie in the future; not kept")));
    }
    if wait > 0 {
        std::thread::sleep(std::time::Duration::from_nanos(wait as u64));
        if Stamp::of(fd).ok().as_ref() != Some(stamp) {
            return Err(Error::InvalidArgument(format!("{path} changed while the keeper read it")));
        }
    }
    Ok(())
}

/// Opens the object `o` names at its ETag (or takes `opened`, opened at it already), with the keeper's own
/// credentials and settings: a store that now gives another version (or another length) is refused. With local copies (`cache`: the keeper's `remote_cache_dir`),
/// its valid copy is read instead of the network (a load that missed the keeper has just written it there, where
/// the load's own setting names the same folder).
fn open_object(
    o: &ObjectStamp,
    opened: Option<Arc<weightlift_remote::Object>>,
    cache: Option<&Path>,
) -> Result<OpenFile> {
    let file = match opened {
        Some(object) => OpenFile::of_object(object),
        None => {
            let url = weightlift_remote::ObjectUrl::parse(&o.url).map_err(remote_error)?;
            OpenFile::open_object(&url, Some(&o.etag))?
        }
    };
    let etag = file.object().and_then(|x| x.etag().map(str::to_string));
    if etag.as_deref() != Some(o.etag.as_str()) || file.len != o.len {
        return Err(Error::InvalidArgument(format!(
            "{}: the keeper finds it at ETag {} and {} bytes, the load at ETag {} and {} bytes",
            o.display_url(),
            etag.as_deref().unwrap_or("(none)"),
            file.len,
            o.etag,
            o.len
        )));
    }
    match (cache, file.object()) {
        (Some(dir), Some(object)) => Ok(OpenFile::open_object_cached(object.clone(), None, dir, false, true)?),
        _ => Ok(file),
    }
}

fn remote_error(e: weightlift_remote::RemoteError) -> Error {
    Error::Io(weightlift_io::IoError::Remote(e))
}
