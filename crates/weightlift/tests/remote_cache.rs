//! Local copies of objects (`remote_cache_dir`) against real servers (S3 through `s3s-fs`, HTTP through nginx and
//! the tests' proxy): the first load writes the copy, byte for byte the file the object was made from; the next
//! load reads it with only a HEAD going out; the copy's header is the one parsing fetched, at no further request; a
//! replaced object is fetched again; a failed load publishes nothing and leaves nothing; a key with `..` writes
//! nothing outside the folder.

mod servers;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::SeqCst;

use servers::Fault;
use weightlift::format::TensorIndex;
use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::settings::Folder;
use weightlift::{Device, Engine, LoadOpts, Loaded, Settings};

/// The S3 server all tests of this binary share, its endpoint and keys in the environment.
fn s3() -> Option<&'static servers::Server> {
    servers::s3_in_env()
}

fn generate(dir: &Path, name: &str, seed: u64) -> PathBuf {
    let path = dir.join(name);
    let spec = Spec { layout: Layout::Llama, container: Container::Safetensors, size: 6 << 20, seed, align: None };
    synth::generate(&path, &spec).unwrap();
    path
}

/// Small chunks and staging (many GETs, slots reused), one retry (a lasting fault fails fast; the request settings
/// are process-wide, so every engine of this binary sets the same).
fn settings() -> Settings {
    // GETs of 1 MiB: several per object.
    Settings::default().chunk_bytes(256 << 10).staging_bytes(4 << 20).remote_retries(1).remote_range_bytes(1 << 20)
}

fn engine(cache: &Path) -> Engine {
    Engine::new(settings().remote_cache_dir(Folder(Some(cache.to_path_buf())))).unwrap()
}

fn load(engine: &Engine, url: &str) -> (TensorIndex, Loaded) {
    let index = weightlift::format::open(&[PathBuf::from(url)], None).unwrap_or_else(|e| panic!("{url}: {e}"));
    let loaded = engine.load(&index, Device::Cpu, &LoadOpts::default()).unwrap_or_else(|e| panic!("{url}: {e}"));
    (index, loaded)
}

/// Every file (not folder) under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

fn sidecar(copy: &Path) -> String {
    std::fs::read_to_string(format!("{}.weightlift-etag", copy.display())).unwrap()
}

#[test]
fn the_first_load_writes_the_copy_the_next_reads_it_and_a_new_version_replaces_it() {
    if s3().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let local = generate(dir.path(), "m.safetensors", 7);
    let url = "s3://bucket/cached/m.safetensors";
    weightlift::remote::upload(&local, url).unwrap();
    let engine = engine(&cache);

    // (a) the first load is from the network and writes the copy.
    let (index, loaded) = load(&engine, url);
    servers::assert_loaded(&local, &index, &loaded);
    let net = loaded.report.network.as_ref().unwrap();
    assert_eq!(net.copies_written, [url], "{net:?}");
    assert!(net.cached.is_empty() && net.bytes >= index.total_bytes(), "{net:?}");
    let copy = cache.join("s3/bucket/cached/m.safetensors");
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(&local).unwrap(), "the copy differs from the file");
    let etag = index.files[0].etag.clone().expect("s3s-fs gives ETags");
    let stamp = sidecar(&copy);
    assert!(stamp.starts_with(&format!("etag {etag}\nlen {}\n", index.files[0].len)), "{stamp}");
    assert_eq!(files_under(&cache), [copy.clone(), PathBuf::from(format!("{}.weightlift-etag", copy.display()))]);

    // (b) the next load reads the copy: its parsing's one GET (which pins the ETag the copy is checked against),
    // then no request.
    let (index, loaded) = load(&engine, url);
    servers::assert_loaded(&local, &index, &loaded);
    let net = loaded.report.network.as_ref().unwrap();
    assert_eq!(net.cached, [url], "{net:?}");
    assert_eq!((net.requests, net.bytes), (0, 0), "{net:?}");
    assert!(net.copies_written.is_empty(), "{net:?}");
    // A new engine (a new start) too, whatever the page cache holds: the copy is read as a local file.
    let (_, loaded) = load(&self::engine(&cache), url);
    assert_eq!(loaded.report.network.as_ref().unwrap().cached, [url]);

    // (c) the object replaced on the server (another ETag): the copy is not used, it is written again.
    let newer = generate(dir.path(), "newer.safetensors", 8);
    assert_ne!(std::fs::read(&newer).unwrap(), std::fs::read(&local).unwrap());
    weightlift::remote::upload(&newer, url).unwrap();
    let (index, loaded) = load(&engine, url);
    assert_ne!(index.files[0].etag.as_deref(), Some(etag.as_str()), "the new version has a new ETag");
    servers::assert_loaded(&newer, &index, &loaded);
    let net = loaded.report.network.as_ref().unwrap();
    assert!(net.cached.is_empty(), "a stale copy was read: {net:?}");
    assert_eq!(net.copies_written, [url], "{net:?}");
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(&newer).unwrap(), "the copy was not refreshed");
    assert!(sidecar(&copy).starts_with(&format!("etag {}\n", index.files[0].etag.as_deref().unwrap())));
    assert_eq!(files_under(&cache).len(), 2, "{:?}", files_under(&cache));
}

#[test]
fn the_copy_is_read_with_no_request_going_out() {
    let Some(nginx) = servers::nginx(true) else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let local = generate(dir.path(), "h.safetensors", 9);
    servers::put(&nginx.root, "h.safetensors", &local);
    let proxy = servers::Proxy::start(nginx.port, Vec::new());
    let url = format!("{}/h.safetensors", proxy.base());
    let engine = engine(&cache);
    let (index, loaded) = load(&engine, &url);
    servers::assert_loaded(&local, &index, &loaded);
    assert_eq!(loaded.report.network.as_ref().unwrap().copies_written, std::slice::from_ref(&url));
    let copy = cache.join(format!("http/127.0.0.1:{}/h.safetensors", proxy.port));
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(&local).unwrap(), "the copy differs from the file");

    let gets = proxy.ranged_gets.load(SeqCst);
    let loaded = engine.load(&index, Device::Cpu, &LoadOpts::default()).unwrap();
    servers::assert_loaded(&local, &index, &loaded);
    assert_eq!(proxy.ranged_gets.load(SeqCst), gets, "a load from the copy sent a GET");
    let net = loaded.report.network.as_ref().unwrap();
    assert_eq!((net.cached.clone(), net.requests, net.bytes), (vec![url], 0, 0), "{net:?}");
}

#[test]
fn the_copy_takes_its_header_from_parsing_at_no_further_request() {
    let Some(nginx) = servers::nginx(true) else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = generate(dir.path(), "p.safetensors", 12);
    servers::put(&nginx.root, "p.safetensors", &local);
    let proxy = servers::Proxy::start(nginx.port, Vec::new());
    let url = format!("{}/p.safetensors", proxy.base());
    let index = weightlift::format::open(&[PathBuf::from(&url)], None).unwrap();
    let file = &index.files[0];
    let header = file.header.as_ref().expect("parsing fetched the whole header in its first GET");
    assert_eq!(header.0.len() as u64, file.data_start);
    let gets = || proxy.ranged_gets.load(SeqCst);
    let load = |engine: &Engine, index: &TensorIndex| {
        let before = gets();
        let loaded = engine.load(index, Device::Cpu, &LoadOpts::default()).unwrap();
        servers::assert_loaded(&local, index, &loaded);
        (gets() - before, loaded.report.network.unwrap())
    };
    let copy_of = |cache: &Path| std::fs::read(cache.join(format!("http/127.0.0.1:{}/p.safetensors", proxy.port)));

    // The load without a cache folder, and the one that writes the copy: the same GETs, the same requests.
    let (plain_gets, plain) = load(&Engine::new(settings()).unwrap(), &index);
    let cache = dir.path().join("cache");
    let (gets_with, net) = load(&engine(&cache), &index);
    assert_eq!(net.copies_written, std::slice::from_ref(&url), "{net:?}");
    assert_eq!((gets_with, net.requests), (plain_gets, plain.requests), "{net:?}");
    assert!(copy_of(&cache).unwrap() == std::fs::read(&local).unwrap(), "the copy differs from the file");

    // Without the header bytes of parsing, the copy's header costs one more GET.
    let mut bare = index.clone();
    bare.files[0].header = None;
    let other = dir.path().join("other");
    let (gets_bare, net) = load(&engine(&other), &bare);
    assert_eq!((gets_bare, net.requests), (plain_gets + 1, plain.requests + 1), "{net:?}");
    assert!(copy_of(&other).unwrap() == std::fs::read(&local).unwrap(), "the copy differs from the file");
}

#[test]
fn a_failed_load_publishes_nothing_and_leaves_nothing() {
    let Some(nginx) = servers::nginx(true) else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let local = generate(dir.path(), "f.safetensors", 10);
    servers::put(&nginx.root, "f.safetensors", &local);
    let proxy = servers::Proxy::start(nginx.port, Vec::new());
    let url = format!("{}/f.safetensors", proxy.base());
    let index = weightlift::format::open(&[PathBuf::from(&url)], None).unwrap();
    let before = proxy.ranged_gets.load(SeqCst);
    let faults = proxy.faults.clone();
    // Two GETs land (and are written into the copy); every one sent after the second is forwarded meets a lasting
    // 503 (the proxy counts only the GETs it forwards).
    *proxy.after_get.lock().unwrap() = Some(Box::new(move |k| {
        if k == before + 2 {
            *faults.lock().unwrap() = vec![Fault::Unavailable; 4096];
        }
    }));
    let err = engine(&cache).load(&index, Device::Cpu, &LoadOpts::default()).unwrap_err().to_string();
    assert!(err.contains("503"), "{err}");
    assert!(proxy.ranged_gets.load(SeqCst) >= before + 2, "the load failed before any GET landed");
    assert_eq!(files_under(&cache), Vec::<PathBuf>::new(), "a failed load left files");
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0, "a failed load left folders");
}

#[test]
fn a_key_with_dot_dot_writes_nothing_outside_the_folder() {
    if s3().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("sub/cache");
    std::fs::create_dir_all(&cache).unwrap();
    let local = generate(dir.path(), "x.safetensors", 11);
    weightlift::remote::upload(&local, "s3://bucket/x.safetensors").unwrap();
    let engine = engine(&cache);
    // The URL's dot segments resolve to the object `x.safetensors`; its cache path would climb out of the folder.
    let url = "s3://bucket/a/../../../x.safetensors";
    let (index, loaded) = load(&engine, url);
    servers::assert_loaded(&local, &index, &loaded);
    let net = loaded.report.network.as_ref().unwrap();
    assert!(net.copies_written.is_empty() && net.cached.is_empty(), "{net:?}");
    assert_eq!(files_under(dir.path()), [local], "something was written beside the cache");
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0);
}
