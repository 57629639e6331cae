//! Real servers for the object-storage tests, started on 127.0.0.1 by the tests themselves: an S3-compatible one
//! (`s3s-fs`, from crates.io: a Rust S3 server over a directory, quick to start and serving ranges and ETags as S3
//! does), nginx (Debian's; real HTTP with ranges, ETags and If-Match), and a fault proxy of our own in front of
//! either. A server missing here skips its test with the reason, unless `WEIGHTLIFT_REQUIRE_SERVERS=1` (CI sets it,
//! having installed them), where it fails.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const ACCESS_KEY: &str = "weightlift-test";
pub const SECRET_KEY: &str = "weightlift-test-secret";

/// Says why a server is missing: a skip, or a failure where CI requires the servers.
pub fn missing(what: &str) -> Option<()> {
    if std::env::var("WEIGHTLIFT_REQUIRE_SERVERS").is_ok_and(|v| v == "1") {
        panic!("{what} (WEIGHTLIFT_REQUIRE_SERVERS=1)");
    }
    println!("skipped: {what}");
    None
}

fn find(name: &str, also: &[&str]) -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).collect::<Vec<_>>())
        .unwrap_or_default();
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    from_path
        .into_iter()
        .chain(also.iter().map(PathBuf::from))
        .chain([home.join(".cargo/bin").join(name)])
        .find(|p| p.is_file())
}

/// Starts `cmd` so that its process dies with the test process (servers kept in statics are never dropped): it
/// asks for SIGKILL when its parent thread ends, and is started by a thread that lives as long as the process.
fn spawn_owned(mut cmd: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    use std::sync::mpsc::{Sender, channel};
    type Ask = (Command, Sender<std::io::Result<Child>>);
    static SPAWNER: std::sync::OnceLock<Mutex<Sender<Ask>>> = std::sync::OnceLock::new();
    // SAFETY: prctl is async-signal-safe, as a pre_exec hook must be.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    };
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = channel::<Ask>();
        std::thread::spawn(move || {
            for (mut cmd, back) in rx {
                let _ = back.send(cmd.spawn());
            }
        });
        Mutex::new(tx)
    });
    let (back, answer) = channel();
    spawner.lock().unwrap().send((cmd, back)).expect("the spawner thread lives as long as the process");
    answer.recv().expect("the spawner answers")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_for(port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited at start: {status}");
        }
        assert!(Instant::now() < deadline, "{what} did not listen on port {port} within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server process, killed when dropped.
pub struct Server {
    child: Child,
    pub port: u16,
    /// The directory it serves (for S3: the directory holding the buckets).
    pub root: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// `s3s-fs` serving a fresh directory; bucket `bucket` exists in it.
pub fn s3() -> Option<Server> {
    let Some(bin) = std::env::var_os("WEIGHTLIFT_S3S_FS").map(PathBuf::from).or_else(|| find("s3s-fs", &[])) else {
        return missing("no s3s-fs here (cargo install s3s-fs --features binary, or set WEIGHTLIFT_S3S_FS)")
            .map(|_| unreachable!());
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("s3");
    std::fs::create_dir_all(root.join("bucket")).unwrap();
    let port = free_port();
    let mut cmd = Command::new(&bin);
    cmd.args([
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--access-key",
        ACCESS_KEY,
        "--secret-key",
        SECRET_KEY,
    ])
    .arg(&root)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let mut child = spawn_owned(cmd).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    wait_for(port, &mut child, "s3s-fs");
    Some(Server { child, port, root, _dir: dir })
}

/// What a bucket served by nginx does to each request (tests/servers/nginx-bucket.conf says how).
#[derive(Clone, Debug)]
pub struct Shape {
    /// Seconds before each answer's first byte.
    pub ttfb_s: f64,
    /// nginx's `limit_rate` of each GET's body (`0`: none).
    pub get_rate: &'static str,
    /// Share of requests answered 503 SlowDown.
    pub slowdown: f64,
    /// The SlowDown answers' Retry-After, in seconds (`None`: no header, as S3 sends).
    pub retry_after_s: Option<u32>,
    /// Whether byte ranges are served (`false`: `max_ranges 0`, the whole object for every GET).
    pub ranges: bool,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape { ttfb_s: 0.0, get_rate: "0", slowdown: 0.0, retry_after_s: None, ranges: true }
    }
}

/// The template the Python tests and the bench render too.
const BUCKET_CONF: &str = include_str!("../../../../tests/servers/nginx-bucket.conf");

fn echo_module() -> Option<PathBuf> {
    ["/usr/lib/nginx/modules/ngx_http_echo_module.so", "/usr/lib64/nginx/modules/ngx_http_echo_module.so"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// nginx serving a fresh directory as a bucket shaped by `shape`, its requests logged (`Server::requests`).
pub fn bucket(shape: &Shape) -> Option<Server> {
    let Some(bin) = find("nginx", &["/usr/sbin/nginx"]) else {
        return missing("no nginx here (apt-get install nginx-light)").map(|_| unreachable!());
    };
    let Some(echo) = echo_module() else {
        return missing("no nginx echo module here (apt-get install libnginx-mod-http-echo)").map(|_| unreachable!());
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir_all(root.join("bucket")).unwrap();
    std::fs::create_dir_all(dir.path().join("tmp")).unwrap();
    let port = free_port();
    let p = dir.path().display().to_string();
    let mut conf: String = BUCKET_CONF
        .lines()
        .filter(|l| shape.slowdown > 0.0 || !l.contains("@SLOWDOWN@"))
        .filter(|l| shape.retry_after_s.is_some() || !l.contains("@RETRY_AFTER@"))
        .map(|l| format!("{l}\n"))
        .collect();
    for (k, v) in [
        ("USER", String::new()),
        ("ECHO_MODULE", echo.display().to_string()),
        ("WORKERS", "1".into()),
        ("PREFIX", p.clone()),
        ("ACCESS_LOG", format!("{p}/access.log bucket")),
        ("TTFB_S", format!("{:.3}", shape.ttfb_s)),
        ("RATE", shape.get_rate.into()),
        ("SLOWDOWN", format!("{:.2}%", shape.slowdown * 100.0)),
        ("RETRY_AFTER", shape.retry_after_s.unwrap_or(0).to_string()),
        ("REQ_RATE", "1000000r/s".into()),
        ("REQ_BURST", "1000000".into()),
        ("PORT", port.to_string()),
        ("ROOT", root.display().to_string()),
    ] {
        conf = conf.replace(&format!("@{k}@"), &v);
    }
    if !shape.ranges {
        conf = conf.replace("sendfile on;", "sendfile on; max_ranges 0;");
    }
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let mut cmd = Command::new(&bin);
    cmd.args(["-p", &p, "-c"]).arg(&path).stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = spawn_owned(cmd).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    wait_for(port, &mut child, "nginx");
    Some(Server { child, port, root, _dir: dir })
}

/// nginx serving a fresh directory, without shaping; `ranges: false` turns byte ranges off (`max_ranges 0`).
pub fn nginx(ranges: bool) -> Option<Server> {
    bucket(&Shape { ranges, ..Shape::default() })
}

/// One request as nginx logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// GET or HEAD.
    pub method: String,
    /// The path and query string as sent.
    pub target: String,
    /// The Range header (empty when none).
    pub range: String,
    /// The If-Match header (empty when none).
    pub if_match: String,
    /// The answer's status.
    pub status: u16,
}

impl Server {
    /// The requests nginx served so far (a bucket's server: see [`bucket`]).
    pub fn requests(&self) -> Vec<Logged> {
        let log = self._dir.path().join("access.log");
        let text = std::fs::read_to_string(log).unwrap_or_default();
        text.lines()
            .filter_map(|line| {
                let mut words = line.split(' ');
                let method = words.next()?.to_string();
                let target = words.next()?.to_string();
                let field = |name: &str| {
                    line.split(' ').find_map(|w| w.strip_prefix(name)).map(|v| v.trim_matches('"').to_string())
                };
                Some(Logged {
                    method,
                    target,
                    range: field("range=").unwrap_or_default(),
                    if_match: field("if_match=").unwrap_or_default(),
                    status: field("status=")?.parse().ok()?,
                })
            })
            .collect()
    }
}

/// The S3 server all tests of one test binary share, started once, with its endpoint and keys put in the process's
/// environment, which every S3 client of the process reads.
pub fn s3_in_env() -> Option<&'static Server> {
    static S3: std::sync::OnceLock<Option<Server>> = std::sync::OnceLock::new();
    static DIR: Mutex<Option<PathBuf>> = Mutex::new(None);
    // A static is never dropped: its server's folder (the objects the tests wrote, tens of MB) is removed when the
    // process exits, and the server itself dies with it (`spawn_owned`).
    extern "C" fn remove_dir() {
        if let Some(dir) = DIR.lock().ok().and_then(|mut d| d.take()) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    S3.get_or_init(|| {
        let server = s3()?;
        *DIR.lock().unwrap() = server.root.parent().map(Path::to_path_buf);
        // SAFETY: registers a function that touches only its own static, to run at exit.
        unsafe { libc::atexit(remove_dir) };
        // SAFETY: set once, under the OnceLock, before any test of this binary makes an S3 client (each first asks
        // for the server here and waits for this initialisation).
        unsafe {
            std::env::set_var("AWS_ENDPOINT_URL", server.base());
            std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
            std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
            std::env::set_var("AWS_REGION", "us-east-1");
            std::env::set_var("AWS_ALLOW_HTTP", "true");
        }
        Some(server)
    })
    .as_ref()
}

/// What runs before a ranged GET is forwarded, given its number.
pub type Hook = Box<dyn FnMut(usize) + Send>;

/// What the proxy does to the requests passing through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answers 503 without asking the server.
    Unavailable,
    /// Answers 429 (throttling).
    Throttled,
    /// Forwards, then resets the connection after the headers and a few body bytes.
    Reset,
    /// Forwards, then closes cleanly with the body cut short.
    Truncate,
    /// Waits this long before forwarding.
    Slow(Duration),
}

/// A proxy in front of `upstream` that applies `faults` to ranged GETs, one each, in order; then passes all
/// through. A hook runs before each ranged GET is forwarded, with its number (to replace an object mid-load).
pub struct Proxy {
    pub port: u16,
    pub faults: Arc<Mutex<Vec<Fault>>>,
    pub ranged_gets: Arc<AtomicUsize>,
    pub after_get: Arc<Mutex<Option<Hook>>>,
    stop: Arc<AtomicU64>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(1, SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl Proxy {
    pub fn start(upstream: u16, faults: Vec<Fault>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let proxy = Proxy {
            port,
            faults: Arc::new(Mutex::new(faults)),
            ranged_gets: Arc::new(AtomicUsize::new(0)),
            after_get: Arc::new(Mutex::new(None)),
            stop: Arc::new(AtomicU64::new(0)),
        };
        let (faults, gets, hook, stop) =
            (proxy.faults.clone(), proxy.ranged_gets.clone(), proxy.after_get.clone(), proxy.stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(SeqCst) != 0 {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (faults, gets, hook) = (faults.clone(), gets.clone(), hook.clone());
                std::thread::spawn(move || serve(conn, upstream, &faults, &gets, &hook));
            }
        });
        proxy
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// One request per connection: read it, apply the next fault if it is a ranged GET, forward it with
/// `Connection: close`, relay the answer.
fn serve(
    mut client: TcpStream,
    upstream: u16,
    faults: &Mutex<Vec<Fault>>,
    gets: &AtomicUsize,
    hook: &Mutex<Option<Hook>>,
) {
    let Some(head) = read_head(&mut client) else { return };
    let text = String::from_utf8_lossy(&head).to_string();
    let ranged_get = text.starts_with("GET ") && text.to_ascii_lowercase().contains("\r\nrange:");
    let fault = if ranged_get {
        let mut f = faults.lock().unwrap();
        (!f.is_empty()).then(|| f.remove(0))
    } else {
        None
    };
    let canned = |status: &str| format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    match fault {
        Some(Fault::Unavailable) => {
            let _ = client.write_all(canned("503 Service Unavailable").as_bytes());
            return;
        }
        Some(Fault::Throttled) => {
            let _ = client.write_all(canned("429 Too Many Requests").as_bytes());
            return;
        }
        Some(Fault::Slow(d)) => std::thread::sleep(d),
        _ => {}
    }
    if ranged_get {
        let k = gets.fetch_add(1, SeqCst) + 1;
        if let Some(h) = hook.lock().unwrap().as_mut() {
            h(k);
        }
    }
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)) else { return };
    let mut forwarded = String::new();
    for line in text.split("\r\n").filter(|l| !l.is_empty()) {
        if !line.to_ascii_lowercase().starts_with("connection:") {
            forwarded.push_str(line);
            forwarded.push_str("\r\n");
        }
    }
    forwarded.push_str("Connection: close\r\n\r\n");
    if server.write_all(forwarded.as_bytes()).is_err() {
        return;
    }
    let mut relayed = 0usize;
    let mut buf = vec![0u8; 64 << 10];
    let cut_at = match fault {
        Some(Fault::Reset) | Some(Fault::Truncate) => Some(600usize),
        _ => None,
    };
    loop {
        let n = match server.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let n = cut_at.map_or(n, |c| n.min(c.saturating_sub(relayed)));
        if client.write_all(&buf[..n]).is_err() {
            return;
        }
        relayed += n;
        if cut_at.is_some_and(|c| relayed >= c) {
            if fault == Some(Fault::Reset) {
                // SO_LINGER 0: the close sends a reset.
                let _ = socket_linger_zero(&client);
            }
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
    }
}

fn socket_linger_zero(s: &TcpStream) -> std::io::Result<()> {
    let sock = socket2_free::Linger(s);
    sock.zero()
}

/// `SO_LINGER` with a zero timeout, through std's raw descriptor (no socket crate needed for one option).
mod socket2_free {
    use std::os::fd::AsRawFd;

    pub struct Linger<'a>(pub &'a std::net::TcpStream);

    impl Linger<'_> {
        pub fn zero(&self) -> std::io::Result<()> {
            let l = libc::linger { l_onoff: 1, l_linger: 0 };
            // SAFETY: a valid socket descriptor, and a pointer to a `linger` of the size given.
            let r = unsafe {
                libc::setsockopt(
                    self.0.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&l as *const libc::linger).cast(),
                    std::mem::size_of::<libc::linger>() as u32,
                )
            };
            if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
        }
    }
}

fn read_head(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
        if head.len() > 64 << 10 {
            return None;
        }
    }
    Some(head)
}

/// Copies `file` into `dir` under `name`.
pub fn put(dir: &Path, name: &str, file: &Path) -> PathBuf {
    let to = dir.join(name);
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::copy(file, &to).unwrap();
    to
}

/// Every loaded byte equals the local file the objects were made from (read with std::fs).
pub fn assert_loaded(local: &Path, index: &weightlift::format::TensorIndex, loaded: &weightlift::Loaded) {
    let file = std::fs::read(local).unwrap();
    assert_eq!(index.tensors.len(), loaded.tensors.len());
    for (t, got) in index.tensors.iter().zip(&loaded.tensors) {
        let mut out = vec![0u8; t.nbytes as usize];
        got.data.read_back(0, &mut out).unwrap();
        assert!(out[..] == file[t.offset as usize..(t.offset + t.nbytes) as usize], "{}: bytes differ", t.name);
    }
}
