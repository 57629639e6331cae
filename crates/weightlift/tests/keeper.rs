//! The keeper on the CPU (host memory kept in sealed memfds, the same protocol, registry and leases as on a GPU):
//! what it serves equals the file byte for byte, a changed file is never served, the budget holds, handouts end
//! with their connections, a bad frame or a foreign user is refused, and a load it cannot serve reads the files
//! as usual with the reason in its report. Objects (served by nginx, as a bucket) are kept by URL and ETag: a
//! replaced object is never served from the keeper, and one the keeper cannot fetch is not fetched again per load.

mod common;
mod servers;
use common::check_against;

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::keep::wire::{self, Input, PROTO, Reply, Request};
use weightlift::keep::{Keeper, KeeperConfig};
use weightlift::{Device, Engine, KeeperSocket, LoadOpts, Loaded, PathUsed, Settings};

fn generate(dir: &Path, name: &str, seed: u64, size: u64) -> PathBuf {
    generate_as(dir, name, seed, size, Layout::Llama)
}

fn generate_as(dir: &Path, name: &str, seed: u64, size: u64, layout: Layout) -> PathBuf {
    let path = dir.join(name);
    synth::generate(&path, &Spec { layout, container: Container::Safetensors, size, seed, align: None }).unwrap();
    path
}

/// Runs test `name` of this binary in a process of its own (for what is process-wide: descriptors, the
/// environment), with `env` set; the test's body runs only there (it returns at once without
/// `WEIGHTLIFT_KEEPER_TEST_CHILD`).
fn in_own_process(name: &str, env: &[(&str, &std::ffi::OsStr)]) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]).env("WEIGHTLIFT_KEEPER_TEST_CHILD", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

fn is_child() -> bool {
    std::env::var_os("WEIGHTLIFT_KEEPER_TEST_CHILD").is_some()
}

/// A private folder for sockets (the keeper refuses folders others may enter).
fn socket_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    d
}

fn keeper(socket: &Path, budget: u64) -> Keeper {
    Keeper::start(KeeperConfig {
        device: Device::Cpu,
        socket: Some(socket.to_path_buf()),
        budget: Some(budget),
        settings: Settings::default().keeper(KeeperSocket::Off),
    })
    .unwrap()
}

fn engine(socket: &Path) -> Engine {
    Engine::new(Settings::default().keeper(KeeperSocket::Path(socket.to_path_buf()))).unwrap()
}

fn load(engine: &Engine, paths: &[PathBuf]) -> (Loaded, weightlift::format::TensorIndex) {
    let index = weightlift::format::open(paths, None).unwrap();
    let loaded = engine.load(&index, Device::Cpu, &LoadOpts::default()).unwrap();
    (loaded, index)
}

/// Every tensor byte against the file, read with plain reads.
fn check_bytes(loaded: &Loaded, index: &weightlift::format::TensorIndex) {
    weightlift::verify::compare_with_file(index, |i, off, out| loaded.tensors[i].data.read_back(off, out)).unwrap();
}

fn status(k: &Keeper) -> (u64, Vec<weightlift::keep::EntryStatus>) {
    match k.status() {
        Reply::Status { used, entries, .. } => (used, entries),
        other => panic!("status answered {other:?}"),
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn a_kept_checkpoint_is_served_byte_exact_and_a_load_it_misses_is_kept_for_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let a = generate(dir.path(), "a.safetensors", 1, 3 << 20);
    let b = generate_as(dir.path(), "b.safetensors", 2, 2 << 20, Layout::ManySmall { tensors: Some(40) });
    let k = keeper(&socket, 1 << 30);
    k.keep(std::slice::from_ref(&a)).unwrap();
    k.wait_idle();
    let e = engine(&socket);
    let (loaded, index) = load(&e, std::slice::from_ref(&a));
    assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
    let note = loaded.report.keeper.as_deref().unwrap();
    assert!(note.contains("served by the keeper"), "{note}");
    // Where the time went, step by step.
    assert!(["device ", "asked ", "mapped ", "copied "].iter().all(|s| note.contains(s)), "{note}");
    check_bytes(&loaded, &index);
    // Nothing was read from storage: the engine's I/O lanes never started.
    assert!(!e.io().started());
    // Two files, one not kept: read from the files, the reason said, and the keeper loads the missing one.
    let (loaded, index) = load(&e, &[a.clone(), b.clone()]);
    assert_ne!(loaded.report.path, PathUsed::Keeper);
    let why = loaded.report.keeper.clone().unwrap();
    assert!(why.contains("1 of 2 file(s) not kept") && why.contains("loading them now"), "{why}");
    assert!(e.io().started(), "a load from the files starts the lanes");
    // The keeper was asked to keep the missing file only once this load had read it (not beside it).
    let (before_load, after_load) = why.split_once("; after the load: ").expect("asked after the load");
    assert!(!before_load.contains("loading"), "{why}");
    assert!(after_load.contains("loading them now"), "{why}");
    check_bytes(&loaded, &index);
    k.wait_idle();
    let (loaded, index) = load(&e, &[a.clone(), b.clone()]);
    assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
    check_bytes(&loaded, &index);
    let (used, entries) = status(&k);
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().all(|e| e.state == "ready" && e.leases == 0), "copies end their leases: {entries:?}");
    assert_eq!(used, std::fs::metadata(&a).unwrap().len() + std::fs::metadata(&b).unwrap().len());
    drop(k);
    assert!(!socket.exists(), "a stopped keeper removes its socket");
    // The keeper gone: a normal load, and the reason.
    let (loaded, index) = load(&e, &[a, b]);
    assert_ne!(loaded.report.path, PathUsed::Keeper);
    assert!(loaded.report.keeper.as_deref().unwrap().contains("connect"), "{:?}", loaded.report.keeper);
    check_bytes(&loaded, &index);
}

#[test]
fn a_changed_file_is_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let a = generate(dir.path(), "a.safetensors", 1, 2 << 20);
    let k = keeper(&socket, 1 << 30);
    k.keep(std::slice::from_ref(&a)).unwrap();
    k.wait_idle();
    let e = engine(&socket);
    assert_eq!(load(&e, std::slice::from_ref(&a)).0.report.path, PathUsed::Keeper);

    // 1. Rewritten in place, same length, its modification time forged back: the change time gives it away.
    let meta = std::fs::metadata(&a).unwrap();
    let len = meta.len();
    {
        let mut f = std::fs::OpenOptions::new().write(true).open(&a).unwrap();
        use std::io::{Seek, SeekFrom};
        f.seek(SeekFrom::Start(len - 4096)).unwrap();
        f.write_all(&[0x5a; 4096]).unwrap();
        f.sync_all().unwrap();
        f.set_modified(meta.modified().unwrap()).unwrap();
    }
    assert_eq!(std::fs::metadata(&a).unwrap().modified().unwrap(), meta.modified().unwrap());
    let (loaded, index) = load(&e, std::slice::from_ref(&a));
    assert_ne!(loaded.report.path, PathUsed::Keeper);
    assert!(loaded.report.keeper.as_deref().unwrap().contains("changed"), "{:?}", loaded.report.keeper);
    check_bytes(&loaded, &index);
    k.wait_idle();
    let (loaded, index) = load(&e, std::slice::from_ref(&a));
    assert_eq!(loaded.report.path, PathUsed::Keeper, "the new contents are kept: {:?}", loaded.report.keeper);
    check_bytes(&loaded, &index);

    // 2. Replaced by a rename (another inode, another tensor layout): never the old bytes.
    let tmp = generate(dir.path(), "a.tmp", 7, 3 << 20);
    std::fs::rename(&tmp, &a).unwrap();
    let (loaded, index) = load(&e, std::slice::from_ref(&a));
    assert_ne!(loaded.report.path, PathUsed::Keeper);
    check_bytes(&loaded, &index);
    k.wait_idle();
    let (loaded, index) = load(&e, std::slice::from_ref(&a));
    assert_eq!(loaded.report.path, PathUsed::Keeper);
    check_bytes(&loaded, &index);
    let (_, entries) = status(&k);
    assert_eq!(entries.len(), 1, "old versions are freed: {entries:?}");

    // 3. Truncated: its checkpoint no longer parses the same, so the load fails as without a keeper, or is read.
    std::fs::OpenOptions::new().write(true).open(&a).unwrap().set_len(len / 2).unwrap();
    let index = weightlift::format::open(std::slice::from_ref(&a), None);
    if let Ok(index) = index {
        let loaded = e.load(&index, Device::Cpu, &LoadOpts::default());
        assert!(loaded.is_err() || loaded.unwrap().report.path != PathUsed::Keeper);
    }
}

#[test]
fn the_budget_holds_least_recently_used_first_and_a_file_over_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let files: Vec<PathBuf> = (0..3).map(|i| generate(dir.path(), &format!("{i}.safetensors"), i, 2 << 20)).collect();
    let len = std::fs::metadata(&files[0]).unwrap().len();
    let big = generate(dir.path(), "big.safetensors", 9, 8 << 20);
    let k = keeper(&socket, 2 * len + len / 2);
    let e = engine(&socket);
    for f in &files[..2] {
        load(&e, std::slice::from_ref(f));
        k.wait_idle();
    }
    assert_eq!(load(&e, std::slice::from_ref(&files[0])).0.report.path, PathUsed::Keeper); // 1 is now older
    load(&e, std::slice::from_ref(&files[2]));
    k.wait_idle();
    let (used, entries) = status(&k);
    assert!(used <= k.budget());
    let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    assert!(!paths.iter().any(|p| p.ends_with("/1.safetensors")), "the least recently used goes: {paths:?}");
    assert_eq!(load(&e, std::slice::from_ref(&files[0])).0.report.path, PathUsed::Keeper);
    assert_eq!(load(&e, std::slice::from_ref(&files[2])).0.report.path, PathUsed::Keeper);
    let (loaded, index) = load(&e, std::slice::from_ref(&big));
    assert!(loaded.report.keeper.as_deref().unwrap().contains("budget"), "{:?}", loaded.report.keeper);
    check_bytes(&loaded, &index);
    assert!(k.keep(std::slice::from_ref(&big)).unwrap_err().to_string().contains("budget"));
    // 200 mixed loads of four files, two fitting at once: always within the budget, every byte right.
    let all: Vec<PathBuf> = files.iter().cloned().chain([big.clone()]).collect();
    for i in 0..200usize {
        let f = &all[(i * 7 + i / 3) % all.len()];
        let (loaded, index) = load(&e, std::slice::from_ref(f));
        if i % 20 == 0 {
            check_bytes(&loaded, &index);
        }
        assert!(status(&k).0 <= k.budget());
        if i % 5 == 0 {
            k.wait_idle();
        }
    }
    k.wait_idle();
    let (used, _) = status(&k);
    assert!(used <= k.budget());
}

/// A Get by hand: the descriptors of `paths`, the reply and what came with it.
fn get(socket: &Path, paths: &[PathBuf], keep: bool) -> (std::os::fd::OwnedFd, Reply, Vec<std::os::fd::OwnedFd>) {
    let conn = wire::connect(socket).unwrap();
    let files: Vec<std::fs::File> = paths.iter().map(|p| std::fs::File::open(p).unwrap()).collect();
    let fds: Vec<_> = files.iter().map(|f| f.as_fd()).collect();
    let req =
        Request::Get { proto: PROTO, device: "cpu".into(), uuid: None, inputs: vec![Input::File; fds.len()], keep };
    wire::send(conn.as_fd(), &req, &fds).unwrap();
    let (reply, got) = wire::recv::<Reply>(conn.as_fd()).unwrap();
    (conn, reply, got)
}

#[test]
fn a_handout_is_leased_until_its_connection_ends_and_a_kept_memfd_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let a = generate(dir.path(), "a.safetensors", 3, 2 << 20);
    let k = keeper(&socket, 1 << 30);
    k.keep(std::slice::from_ref(&a)).unwrap();
    k.wait_idle();
    let (conn, reply, fds) = get(&socket, std::slice::from_ref(&a), false);
    let Reply::Hit { sizes, .. } = reply else { panic!("{reply:?}") };
    assert_eq!((sizes.len(), fds.len()), (1, 1));
    assert_eq!(status(&k).1[0].leases, 1);
    // The memory is the file's bytes, and sealed: no one can write it.
    let mut held = std::fs::File::from(fds.into_iter().next().unwrap());
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut held, &mut bytes).unwrap();
    assert!(bytes == std::fs::read(&a).unwrap());
    assert!(held.write_all(b"x").is_err(), "a kept memfd is sealed against writes");
    // A second client at the same time is served too.
    let (conn2, reply2, _fds2) = get(&socket, std::slice::from_ref(&a), false);
    assert!(matches!(reply2, Reply::Hit { .. }));
    assert_eq!(status(&k).1[0].leases, 2);
    // A client's end (its process killed closes the socket the same way) gives its leases back.
    drop(conn);
    drop(conn2);
    let t = Instant::now();
    while status(&k).1[0].leases > 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "leases not given back");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn bad_frames_are_refused_and_leak_no_descriptor() {
    in_own_process("bad_frames_child", &[]);
}

/// Counts this process's descriptors, so runs alone (see above).
#[test]
fn bad_frames_child() {
    if !is_child() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let a = generate(dir.path(), "a.safetensors", 4, 1 << 20);
    let k = keeper(&socket, 1 << 30);
    // The count once the keeper has served a request and settled (its threads open what they need as they start).
    status(&k);
    drop(weightlift::keep::status(&socket).unwrap());
    let mut before = open_fds();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = open_fds();
        if now == before {
            break;
        }
        before = now;
    }
    let f = std::fs::File::open(&a).unwrap();
    let cases: Vec<(Vec<u8>, usize)> = vec![
        (b"not json".to_vec(), 0),
        (b"{\"op\":\"get\"}".to_vec(), 1),
        (
            serde_json::to_vec(&Request::Get {
                proto: PROTO,
                device: "cpu".into(),
                uuid: None,
                inputs: vec![Input::File; 2],
                keep: true,
            })
            .unwrap(),
            1,
        ),
        (
            serde_json::to_vec(&Request::Get {
                proto: 99,
                device: "cpu".into(),
                uuid: None,
                inputs: vec![Input::File],
                keep: true,
            })
            .unwrap(),
            1,
        ),
        (serde_json::to_vec(&Request::Status { proto: PROTO }).unwrap(), 1),
        (vec![b' '; wire::MAX_FRAME + 10], 0),
    ];
    for (frame, nfds) in cases {
        let conn = wire::connect(&socket).unwrap();
        let fds: Vec<_> = std::iter::repeat_n(f.as_fd(), nfds).collect();
        let mut space = vec![std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
        if nfds > 0 {
            assert!(control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
        }
        rustix::net::sendmsg(&conn, &[std::io::IoSlice::new(&frame)], &mut control, rustix::net::SendFlags::empty())
            .unwrap();
        let (reply, _) = wire::recv::<Reply>(conn.as_fd()).unwrap();
        let Reply::Error { reason, .. } = &reply else {
            panic!("{reply:?} for {:?}", String::from_utf8_lossy(&frame[..frame.len().min(80)]))
        };
        assert!(!reason.is_empty());
        // The keeper drops the connection after an error.
        assert!(matches!(wire::recv::<Reply>(conn.as_fd()), Err(wire::WireError::Closed)));
    }
    // A descriptor that is not a regular file.
    let (r, w) = std::io::pipe().unwrap();
    let conn = wire::connect(&socket).unwrap();
    let req = Request::Get { proto: PROTO, device: "cpu".into(), uuid: None, inputs: vec![Input::File], keep: true };
    wire::send(conn.as_fd(), &req, &[r.as_fd()]).unwrap();
    assert!(matches!(wire::recv::<Reply>(conn.as_fd()).unwrap().0, Reply::Error { .. }));
    drop((conn, r, w, f));
    // Another device: a miss that says so.
    let conn = wire::connect(&socket).unwrap();
    let f = std::fs::File::open(&a).unwrap();
    let req = Request::Get { proto: PROTO, device: "cuda:0".into(), uuid: None, inputs: vec![Input::File], keep: true };
    wire::send(conn.as_fd(), &req, &[f.as_fd()]).unwrap();
    let (reply, _) = wire::recv::<Reply>(conn.as_fd()).unwrap();
    assert!(matches!(&reply, Reply::Miss { code, .. } if code == "other_device"), "{reply:?}");
    drop((conn, f));
    // The connection threads finish (and close what they hold) on their own time: wait up to 10 s.
    let t = Instant::now();
    while open_fds() != before && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(open_fds(), before, "descriptors leaked");
    assert_eq!(status(&k).1.len(), 0, "nothing was kept from refused frames");
}

#[test]
fn sockets_are_private_stale_ones_reclaimed_and_a_second_keeper_refused() {
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    // A folder others may enter is refused.
    let open_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open_dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let err = Keeper::start(KeeperConfig {
        device: Device::Cpu,
        socket: Some(open_dir.path().join("k.sock")),
        budget: Some(1 << 20),
        settings: Settings::default(),
    })
    .unwrap_err();
    assert!(err.to_string().contains("0700"), "{err}");
    // A stale socket (nothing listening) is reclaimed; a live one refused.
    let stale = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    drop(stale);
    assert!(socket.exists());
    let k = keeper(&socket, 1 << 20);
    let err = Keeper::start(KeeperConfig {
        device: Device::Cpu,
        socket: Some(socket.clone()),
        budget: Some(1 << 20),
        settings: Settings::default(),
    })
    .unwrap_err();
    assert!(err.to_string().contains("another keeper"), "{err}");
    drop(k);
    // A keeper of another user is refused by the client; needs root to make one (skipped otherwise).
    if rustix::process::getuid().is_root() {
        foreign_user_is_refused();
    } else {
        eprintln!("skipped: the foreign-user check needs root to run a client as another user");
    }
}

/// A client running as `nobody` (by python3, which has SOCK_SEQPACKET) is refused by the keeper's peer check.
fn foreign_user_is_refused() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let socket = dir.path().join("k.sock");
    let k = keeper(&socket, 1 << 20);
    // Let `nobody` reach the socket (the folder's mode is the first guard; this checks the second).
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let script = format!(
        "import socket,json; s=socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.connect({:?}); \
         s.send(json.dumps({{'op':'status','proto':{PROTO}}}).encode()); print(s.recv(65536).decode())",
        socket.display().to_string()
    );
    let out = match std::process::Command::new("python3").arg("-c").arg(&script).uid(65534).gid(65534).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: python3 as nobody: {e}");
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("\"op\":\"error\"") && text.contains("uid 65534"),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(k);
}

#[test]
fn two_clients_at_once_are_both_served_right() {
    let dir = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let a = generate(dir.path(), "a.safetensors", 5, 4 << 20);
    let k = keeper(&socket, 1 << 30);
    k.keep(std::slice::from_ref(&a)).unwrap();
    k.wait_idle();
    let e = Arc::new(engine(&socket));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (e, a) = (e.clone(), a.clone());
            std::thread::spawn(move || {
                for _ in 0..10 {
                    let (loaded, index) = load(&e, std::slice::from_ref(&a));
                    assert_eq!(loaded.report.path, PathUsed::Keeper);
                    check_bytes(&loaded, &index);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let Reply::Status { served, .. } = k.status() else { unreachable!() };
    assert_eq!(served, 40);
}

#[test]
fn no_keeper_asked_when_off_and_auto_finds_none_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let a = generate(dir.path(), "a.safetensors", 6, 1 << 20);
    let e = Engine::new(Settings::default().keeper(KeeperSocket::Off)).unwrap();
    let (loaded, _) = load(&e, std::slice::from_ref(&a));
    assert_eq!(loaded.report.keeper, None);
    // `auto` looks at the default socket, under XDG_RUNTIME_DIR: set in a process of its own (setting the variable
    // here would race the other tests' threads).
    let run = socket_dir();
    in_own_process("auto_child", &[("XDG_RUNTIME_DIR", run.path().as_os_str()), ("KEEPER_TEST_FILE", a.as_os_str())]);
}

/// Run by the test above in a process of its own.
#[test]
fn auto_child() {
    if !is_child() {
        return;
    }
    let a = PathBuf::from(std::env::var_os("KEEPER_TEST_FILE").unwrap());
    let run = PathBuf::from(std::env::var_os("XDG_RUNTIME_DIR").unwrap());
    let e = Engine::new(Settings::default()).unwrap();
    let (loaded, index) = load(&e, std::slice::from_ref(&a));
    assert_eq!(loaded.report.keeper, None, "no keeper running: nothing to say");
    check_bytes(&loaded, &index);
    // One started at the default socket is found.
    let k = Keeper::start(KeeperConfig {
        device: Device::Cpu,
        socket: None,
        budget: Some(1 << 30),
        settings: Settings::default(),
    })
    .unwrap();
    assert!(k.socket().starts_with(&run), "{}", k.socket().display());
    k.keep(std::slice::from_ref(&a)).unwrap();
    k.wait_idle();
    let (loaded, index) = load(&e, std::slice::from_ref(&a));
    assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
    check_bytes(&loaded, &index);
}

/// Small GETs (several per object) for the object tests; the keeper reads with the same settings (the request
/// settings are process-wide).
fn object_settings() -> Settings {
    Settings::default().chunk_bytes(256 << 10).staging_bytes(4 << 20).remote_range_bytes(1 << 20)
}

fn load_url(engine: &Engine, url: &str) -> (Loaded, weightlift::format::TensorIndex) {
    load(engine, &[PathBuf::from(url)])
}

/// A keeper on the CPU that reads objects with the tests' settings.
fn object_keeper(socket: &Path) -> Keeper {
    Keeper::start(KeeperConfig {
        device: Device::Cpu,
        socket: Some(socket.to_path_buf()),
        budget: Some(1 << 30),
        settings: object_settings().keeper(KeeperSocket::Off),
    })
    .unwrap()
}

#[test]
fn an_object_is_kept_by_its_etag_and_a_replaced_one_is_never_served() {
    let Some(bucket) = servers::nginx(true) else { return };
    let dir = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let first = generate(dir.path(), "first.safetensors", 21, 3 << 20);
    let second = generate(dir.path(), "second.safetensors", 22, 3 << 20);
    let served = servers::put(&bucket.root, "m/model.safetensors", &first);
    let url = format!("{}/m/model.safetensors", bucket.base());
    let k = object_keeper(&socket);
    let e = Engine::new(object_settings().keeper(KeeperSocket::Path(socket.clone()))).unwrap();
    // Not kept yet: read from the bucket, and the keeper asked to keep it once the load has read it.
    let (loaded, index) = load_url(&e, &url);
    assert_ne!(loaded.report.path, PathUsed::Keeper);
    let why = loaded.report.keeper.clone().unwrap();
    assert!(why.contains("not kept") && why.contains("after the load") && why.contains("loading them now"), "{why}");
    servers::assert_loaded(&first, &index, &loaded);
    k.wait_idle();
    let (_, entries) = status(&k);
    assert_eq!(entries.len(), 1);
    assert_eq!((entries[0].path.as_str(), entries[0].state.as_str()), (url.as_str(), "ready"));
    // Kept: served from the keeper, the bucket asked only for what opening the object and parsing its header take.
    let before = bucket.requests().len();
    let (loaded, index) = load_url(&e, &url);
    assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
    servers::assert_loaded(&first, &index, &loaded);
    let asked = bucket.requests()[before..].to_vec();
    assert!(asked.len() <= 2 && asked.iter().all(|r| r.method == "GET" || r.method == "HEAD"), "{asked:?}");
    // Replaced in the bucket (a new ETag: nginx's is the modification time and length): never served from the
    // keeper; read from the bucket, and the new version kept for the next load.
    std::fs::copy(&second, &served).unwrap();
    let later = std::time::SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options().write(true).open(&served).unwrap().set_modified(later).unwrap();
    let (loaded, index) = load_url(&e, &url);
    assert_ne!(loaded.report.path, PathUsed::Keeper);
    let why = loaded.report.keeper.clone().unwrap();
    assert!(why.contains("changed since it was kept"), "{why}");
    servers::assert_loaded(&second, &index, &loaded);
    k.wait_idle();
    let (loaded, index) = load_url(&e, &url);
    assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
    servers::assert_loaded(&second, &index, &loaded);
    let (_, entries) = status(&k);
    assert_eq!(entries.len(), 1, "the old version is gone: {entries:?}");
    // Kept by name, as `weightlift keep URL` does: at the version the bucket has now.
    let other = servers::put(&bucket.root, "m/other.safetensors", &first);
    let other_url = format!("{}/m/other.safetensors", bucket.base());
    let before = bucket.requests().len();
    k.keep(&[PathBuf::from(&other_url)]).unwrap();
    k.wait_idle();
    // Opened once (its first byte pins the version), then read: never opened a second time.
    let opens = bucket.requests()[before..].iter().filter(|r| r.range == "bytes=0-0").count();
    assert_eq!(opens, 1, "{:?}", &bucket.requests()[before..]);
    let (loaded, index) = load_url(&e, &other_url);
    assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
    servers::assert_loaded(&other, &index, &loaded);
    // A URL with a query string is refused before any request, its query not shown.
    let before = bucket.requests().len();
    let err = k.keep(&[PathBuf::from(format!("{other_url}?X-Signature=abc"))]).unwrap_err().to_string();
    assert!(err.contains("query string") && err.contains("other.safetensors") && !err.contains("abc"), "{err}");
    assert_eq!(bucket.requests().len(), before);
    // A URL that names nothing is an error naming it.
    let err = k.keep(&[PathBuf::from(format!("{}/m/absent.safetensors", bucket.base()))]).unwrap_err().to_string();
    assert!(err.contains("absent.safetensors"), "{err}");
}

#[test]
fn an_object_read_from_its_local_copy_is_kept_once_and_the_keeper_reads_the_copy() {
    let Some(bucket) = servers::nginx(true) else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let a = generate(dir.path(), "a.safetensors", 24, 3 << 20);
    servers::put(&bucket.root, "a.safetensors", &a);
    let url = format!("{}/a.safetensors", bucket.base());
    let copies = || object_settings().remote_cache_dir(weightlift::settings::Folder(Some(cache.path().to_path_buf())));
    let k = Keeper::start(KeeperConfig {
        device: Device::Cpu,
        socket: Some(socket.clone()),
        budget: Some(1 << 30),
        settings: copies().keeper(KeeperSocket::Off),
    })
    .unwrap();
    let e = Engine::new(copies().keeper(KeeperSocket::Path(socket.clone()))).unwrap();
    // The first load reads the bucket and writes the local copy; the keeper, asked after it, reads that copy.
    let (loaded, index) = load_url(&e, &url);
    assert_ne!(loaded.report.path, PathUsed::Keeper);
    servers::assert_loaded(&a, &index, &loaded);
    k.wait_idle();
    let ranged: Vec<String> = bucket
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && !r.range.is_empty() && !r.range.starts_with("bytes=0-"))
        .map(|r| r.range)
        .collect();
    let mut once = ranged.clone();
    once.sort();
    once.dedup();
    assert!(!ranged.is_empty() && once.len() == ranged.len(), "a body range fetched twice: {ranged:?}");
    // The next load reads the local copy, and asks for the object: served, one entry.
    let (loaded, index) = load_url(&e, &url);
    assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
    servers::assert_loaded(&a, &index, &loaded);
    let (_, entries) = status(&k);
    assert_eq!(entries.len(), 1, "{entries:?}");
}

#[test]
fn an_object_the_keeper_cannot_fetch_is_not_fetched_again_for_each_load() {
    let Some(bucket) = servers::nginx(true) else { return };
    let dir = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let a = generate(dir.path(), "a.safetensors", 23, 1 << 20);
    servers::put(&bucket.root, "a.safetensors", &a);
    let url = format!("{}/a.safetensors", bucket.base());
    let k = object_keeper(&socket);
    // A client that names a version the bucket does not have (as one whose object was replaced since it opened it
    // would): the keeper's fetch, conditional on that ETag, fails, and nothing is kept.
    let object = weightlift::keep::stamp::ObjectStamp {
        url: url.clone(),
        etag: "\"not-this-version\"".into(),
        len: std::fs::metadata(&a).unwrap().len(),
    };
    let ask = || {
        let conn = wire::connect(&socket).unwrap();
        let req = Request::Get {
            proto: PROTO,
            device: "cpu".into(),
            uuid: None,
            inputs: vec![Input::Object(object.clone())],
            keep: true,
        };
        wire::send(conn.as_fd(), &req, &[]).unwrap();
        wire::recv::<Reply>(conn.as_fd()).unwrap().0
    };
    let reply = ask();
    assert!(matches!(&reply, Reply::Miss { code, .. } if code == "not_kept"), "{reply:?}");
    k.wait_idle();
    let Reply::Status { failed, entries, .. } = k.status() else { panic!() };
    assert_eq!((failed, entries.len()), (1, 0));
    let before = bucket.requests().len();
    let reply = ask();
    let Reply::Miss { code, reason, .. } = &reply else { panic!("{reply:?}") };
    assert_eq!(code, "failed", "{reason}");
    assert!(reason.contains("could not fetch") && reason.contains("a.safetensors"), "{reason}");
    k.wait_idle();
    assert_eq!(bucket.requests().len(), before, "fetched again");
    // A URL with a query (a presigned URL's signature) is not asked for: the load says why, and nothing is kept.
    let e = Engine::new(object_settings().keeper(KeeperSocket::Path(socket.clone()))).unwrap();
    let (loaded, index) = load_url(&e, &format!("{url}?X-Signature=abc"));
    servers::assert_loaded(&a, &index, &loaded);
    let why = loaded.report.keeper.clone().unwrap();
    assert!(why.contains("query string") && !why.contains("abc"), "{why}");
    k.wait_idle();
    assert_eq!(status(&k).1.len(), 0);
    // More inputs than an answer can carry descriptors for is refused; an older client's request is answered with
    // the protocol versions.
    let conn = wire::connect(&socket).unwrap();
    let many = vec![Input::Object(object.clone()); wire::MAX_FDS + 1];
    let req = Request::Get { proto: PROTO, device: "cpu".into(), uuid: None, inputs: many, keep: true };
    wire::send(conn.as_fd(), &req, &[]).unwrap();
    let reply = wire::recv::<Reply>(conn.as_fd()).unwrap().0;
    assert!(matches!(&reply, Reply::Error { reason, .. } if reason.contains("at most")), "{reply:?}");
    let conn = wire::connect(&socket).unwrap();
    let old = serde_json::json!({"op": "get", "proto": 1, "device": "cpu", "uuid": null, "files": 0, "keep": true});
    wire::send(conn.as_fd(), &old, &[]).unwrap();
    let reply = wire::recv::<Reply>(conn.as_fd()).unwrap().0;
    assert!(matches!(&reply, Reply::Error { reason, .. } if reason.contains("protocol 1")), "{reply:?}");
    // An object without an ETag (or a URL) in a request is refused as a bad frame.
    let conn = wire::connect(&socket).unwrap();
    let bad = weightlift::keep::stamp::ObjectStamp { url: url.clone(), etag: String::new(), len: 1 };
    let req =
        Request::Get { proto: PROTO, device: "cpu".into(), uuid: None, inputs: vec![Input::Object(bad)], keep: true };
    wire::send(conn.as_fd(), &req, &[]).unwrap();
    assert!(matches!(wire::recv::<Reply>(conn.as_fd()).unwrap().0, Reply::Error { .. }));
}

#[test]
fn a_kept_pack_is_decoded_from_the_keepers_memory_and_a_replaced_one_is_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let first = generate(dir.path(), "first.safetensors", 31, 3 << 20);
    let second = generate(dir.path(), "second.safetensors", 32, 2 << 20);
    let pack = dir.path().join("model.wlpack");
    let opts = weightlift_pack::PackOptions { plane_chunk: 64 << 10, ..Default::default() };
    weightlift_pack::pack(&first, &pack, &opts, &|_, _| {}).unwrap();
    let k = keeper(&socket, 1 << 30);
    let load_pack = |e: &Engine, which: Option<&[usize]>| {
        e.load_pack(&pack, which, Device::Cpu, weightlift::Decoder::Auto, &LoadOpts::default()).unwrap()
    };
    // Not kept: decoded from the file, and the keeper asked to keep the pack once the load has read it.
    let e = engine(&socket);
    let loaded = load_pack(&e, None);
    assert_ne!(loaded.report.path, PathUsed::Keeper);
    let why = loaded.report.keeper.clone().unwrap();
    assert!(why.contains("not kept") && why.contains("after the load") && why.contains("loading them now"), "{why}");
    check_against(&first, &loaded);
    k.wait_idle();
    let (used, entries) = status(&k);
    assert_eq!(entries.len(), 1);
    assert!(used >= std::fs::metadata(&pack).unwrap().len(), "{used}");
    // Kept (its stored bytes): decoded from the keeper's memory, nothing read.
    let e = engine(&socket);
    let loaded = load_pack(&e, None);
    assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
    let note = loaded.report.keeper.clone().unwrap();
    assert!(note.contains("decoded from its shared memory"), "{note}");
    check_against(&first, &loaded);
    assert!(!e.io().started(), "nothing read from storage");
    // Some of its tensors: served too.
    let loaded = load_pack(&e, Some(&[2, 0]));
    assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
    assert_eq!(loaded.tensors.len(), 2);
    check_against(&first, &loaded);
    // Replaced by a rename (as writers replace files): never served from the keeper; the new pack is kept next.
    let next = dir.path().join("next.wlpack");
    weightlift_pack::pack(&second, &next, &opts, &|_, _| {}).unwrap();
    std::fs::rename(&next, &pack).unwrap();
    let loaded = load_pack(&e, None);
    assert_ne!(loaded.report.path, PathUsed::Keeper);
    check_against(&second, &loaded);
    k.wait_idle();
    let loaded = load_pack(&engine(&socket), None);
    assert_eq!(loaded.report.path, PathUsed::Keeper, "{:?}", loaded.report.keeper);
    check_against(&second, &loaded);
    // A load with faults injected (tests) does not ask: read from the file.
    let pk = weightlift::Pack::open(&pack).unwrap();
    let faults = Some(Arc::new(weightlift::io::fault::FaultPlan::new(Vec::new())));
    let loaded =
        e.load_pack_with(&pk, None, Device::Cpu, weightlift::Decoder::Auto, &LoadOpts::default(), faults).unwrap();
    assert_ne!(loaded.report.path, PathUsed::Keeper);
    assert_eq!(loaded.report.keeper, None);
    check_against(&second, &loaded);
}

#[test]
fn a_pack_whose_kept_memory_fails_its_checksums_is_read_from_the_file() {
    // A keeper whose memory of a pack differs from the file (a fault of its own: a real keeper serves only what it
    // read at the file's identity): the chunks' checksums fail as they decode, and the load reads the file
    // instead, saying why; the progress it reports counts each byte once.
    let dir = tempfile::tempdir().unwrap();
    let sockets = socket_dir();
    let socket = sockets.path().join("k.sock");
    let a = generate(dir.path(), "a.safetensors", 33, 2 << 20);
    let pack = dir.path().join("a.wlpack");
    let opts = weightlift_pack::PackOptions { plane_chunk: 64 << 10, ..Default::default() };
    weightlift_pack::pack(&a, &pack, &opts, &|_, _| {}).unwrap();
    let listener = wire::seqpacket().unwrap();
    rustix::net::bind(&listener, &rustix::net::SocketAddrUnix::new(&socket).unwrap()).unwrap();
    rustix::net::listen(&listener, 1).unwrap();
    let bytes = std::fs::read(&pack).unwrap();
    let fake = std::thread::spawn(move || {
        let conn = rustix::net::accept(&listener).unwrap();
        let (req, fds) = wire::recv::<Request>(conn.as_fd()).unwrap();
        assert!(matches!(req, Request::Get { .. }), "{req:?}");
        let stamp = weightlift::keep::stamp::Stamp::of(&fds[0]).unwrap();
        // The pack with its middle half flipped.
        let mut wrong = bytes.clone();
        let n = wrong.len();
        wrong[n / 4..3 * n / 4].iter_mut().for_each(|b| *b ^= 0x5a);
        let memfd = rustix::fs::memfd_create("wrong", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let mut f = std::fs::File::from(memfd);
        f.write_all(&wrong).unwrap();
        let reply =
            Reply::Hit { proto: PROTO, sizes: vec![n as u64], stamps: vec![weightlift::keep::stamp::Key::File(stamp)] };
        wire::send(conn.as_fd(), &reply, &[f.as_fd()]).unwrap();
        // Held until the client hangs up (its lease).
        let _ = wire::recv::<Request>(conn.as_fd());
    });
    // Small batches: the first ones decode before the flipped bytes are met.
    let e = Engine::new(Settings::default().keeper(KeeperSocket::Path(socket.clone())).pack_batch_bytes(256 << 10))
        .unwrap();
    let done = std::sync::atomic::AtomicU64::new(0);
    let load_opts = LoadOpts { progress: Some(&done), ..LoadOpts::default() };
    let loaded = e.load_pack(&pack, None, Device::Cpu, weightlift::Decoder::Auto, &load_opts).unwrap();
    fake.join().unwrap();
    assert_ne!(loaded.report.path, PathUsed::Keeper);
    let why = loaded.report.keeper.clone().unwrap();
    assert!(why.contains("decoding the pack from its memory failed") && why.contains("checksum"), "{why}");
    check_against(&a, &loaded);
    let raw: u64 = loaded.tensors.iter().map(|t| t.data.len() as u64).sum();
    assert_eq!(done.load(std::sync::atomic::Ordering::Relaxed), raw);
}
