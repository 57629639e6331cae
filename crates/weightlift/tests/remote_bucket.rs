//! Loads from a bucket shaped like a cloud's (nginx with a time to first byte, a share of 503 SlowDown answers and
//! Retry-After), every byte compared with the local file; what requests went out, read from nginx's log.

mod servers;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use servers::Shape;
use weightlift::format::TensorIndex;
use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::remote::{Config, configure};
use weightlift::{Device, Engine, LoadOpts, Loaded, Settings};

/// The request settings are process-wide (`configure`): the tests of this binary run one at a time.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn generate(dir: &Path, name: &str, size: u64, seed: u64) -> PathBuf {
    let path = dir.join(name);
    let spec = Spec { layout: Layout::Llama, container: Container::Safetensors, size, seed, align: None };
    synth::generate(&path, &spec).unwrap();
    path
}

/// An engine whose GETs are small (many of them per object).
fn engine(concurrency: Option<u32>) -> Engine {
    let mut s = Settings::default().chunk_bytes(256 << 10).staging_bytes(8 << 20).remote_range_bytes(512 << 10);
    if let Some(n) = concurrency {
        s = s.remote_concurrency(weightlift::settings::Concurrency::Fixed(n));
    }
    Engine::new(s).unwrap()
}

fn assert_same_as(local: &[PathBuf], index: &TensorIndex, loaded: &Loaded) {
    let want = weightlift::format::open(local, None).unwrap();
    assert_eq!(index.tensors, want.tensors);
    let files: Vec<Vec<u8>> = want.files.iter().map(|f| std::fs::read(&f.path).unwrap()).collect();
    for (t, got) in index.tensors.iter().zip(&loaded.tensors) {
        let mut out = vec![0u8; t.nbytes as usize];
        got.data.read_back(0, &mut out).unwrap();
        let file = &files[t.file];
        assert!(out[..] == file[t.offset as usize..(t.offset + t.nbytes) as usize], "{}: bytes differ", t.name);
    }
}

#[test]
fn an_object_is_opened_by_one_get_and_loaded_without_a_head() {
    let _serial = one_at_a_time();
    let Some(bucket) = servers::bucket(&Shape { ttfb_s: 0.01, ..Shape::default() }) else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = generate(dir.path(), "a.safetensors", 6 << 20, 1);
    servers::put(&bucket.root, "bucket/a.safetensors", &local);
    let url = format!("{}/bucket/a.safetensors", bucket.base());
    let index = weightlift::format::open(&[PathBuf::from(&url)], None).unwrap();
    let opened = bucket.requests();
    assert_eq!(opened.len(), 1, "parsing sends one request: {opened:?}");
    assert_eq!((opened[0].method.as_str(), opened[0].range.as_str()), ("GET", "bytes=0-262143"));
    let loaded = engine(None).load(&index, Device::Cpu, &LoadOpts::default()).unwrap();
    assert_same_as(std::slice::from_ref(&local), &index, &loaded);
    let all = bucket.requests();
    assert!(all.iter().all(|r| r.method == "GET" && r.status == 206), "{all:?}");
    // The load's GETs: one per 512 KiB block of the file that the data section touches (reads are cut at multiples
    // of their size), none opening the object again.
    let (start, end) = (index.files[0].data_start, std::fs::metadata(&local).unwrap().len());
    let blocks = (end - 1) / (512 << 10) - start / (512 << 10) + 1;
    assert_eq!(all.len() - 1, blocks as usize, "{all:?}");
    let net = loaded.report.network.as_ref().unwrap();
    assert_eq!((net.heads, net.requests), (0, (all.len() - 1) as u64), "{net:?}");
    let gets = net.gets.as_ref().expect("the report says how many GETs were in flight");
    assert_eq!(gets.setting, "auto");
    assert!(gets.peak_in_flight >= 2 && gets.peak_in_flight <= gets.max, "{gets:?}");
    assert!(gets.why().contains("GETs in flight"), "{}", gets.why());
}

#[test]
fn a_fixed_count_of_gets_is_kept() {
    let _serial = one_at_a_time();
    let Some(bucket) = servers::bucket(&Shape { ttfb_s: 0.005, ..Shape::default() }) else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = generate(dir.path(), "a.safetensors", 6 << 20, 2);
    servers::put(&bucket.root, "bucket/a.safetensors", &local);
    let index =
        weightlift::format::open(&[PathBuf::from(format!("{}/bucket/a.safetensors", bucket.base()))], None).unwrap();
    let loaded = engine(Some(3)).load(&index, Device::Cpu, &LoadOpts::default()).unwrap();
    assert_same_as(&[local], &index, &loaded);
    let gets = loaded.report.network.as_ref().and_then(|n| n.gets.clone()).unwrap();
    assert_eq!((gets.setting.as_str(), gets.last, gets.peak_target), ("3", 3, 3), "{gets:?}");
    assert!(gets.peak_in_flight <= 3, "{gets:?}");
}

#[test]
fn shard_headers_are_fetched_at_once() {
    let _serial = one_at_a_time();
    // 8 shards behind a 300 ms first byte: one after another their headers alone would take 2.7 s.
    let Some(bucket) = servers::bucket(&Shape { ttfb_s: 0.3, ..Shape::default() }) else { return };
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("llama");
    std::fs::create_dir(&folder).unwrap();
    let mut map = serde_json::Map::new();
    for i in 0..8 {
        let name = format!("model-{:05}-of-00008.safetensors", i + 1);
        let original = generate(dir.path(), &name, 1 << 20, 10 + i);
        // Tensor names are the synthetic layout's: made unique per shard.
        let shard = folder.join(&name);
        rename_tensors(&original, &shard, &format!("s{i}."));
        for t in &weightlift::format::open(std::slice::from_ref(&shard), None).unwrap().tensors {
            map.insert(t.name.clone(), name.clone().into());
        }
        servers::put(&bucket.root, &format!("bucket/llama/{name}"), &shard);
    }
    let json = serde_json::json!({"metadata": {}, "weight_map": map});
    let index_path = folder.join("model.safetensors.index.json");
    std::fs::write(&index_path, serde_json::to_vec(&json).unwrap()).unwrap();
    servers::put(&bucket.root, "bucket/llama/model.safetensors.index.json", &index_path);
    let url = format!("{}/bucket/llama/model.safetensors.index.json", bucket.base());
    let t = Instant::now();
    let index = weightlift::format::open(&[PathBuf::from(&url)], None).unwrap();
    let took = t.elapsed();
    assert!(took < Duration::from_millis(1500), "the index and 8 shard headers took {took:?}");
    assert_eq!(bucket.requests().len(), 9, "one GET for the index, one for each shard");
    let loaded = engine(None).load(&index, Device::Cpu, &LoadOpts::default()).unwrap();
    assert_same_as(std::slice::from_ref(&index_path), &index, &loaded);
    assert!(bucket.requests().iter().all(|r| r.method == "GET"));

    // The shards as a list of URLs (what transformers hands a loader): opened at once too, in the order given.
    let names: Vec<String> = (0..8).map(|i| format!("model-{:05}-of-00008.safetensors", i + 1)).collect();
    let urls: Vec<PathBuf> =
        names.iter().rev().map(|n| PathBuf::from(format!("{}/bucket/llama/{n}", bucket.base()))).collect();
    let before = bucket.requests().len();
    let t = Instant::now();
    let listed = weightlift::format::open(&urls, None).unwrap();
    let took = t.elapsed();
    assert!(took < Duration::from_millis(1500), "8 shard headers given as URLs took {took:?}");
    assert_eq!(bucket.requests().len() - before, 8, "one GET for each shard");
    let locals: Vec<PathBuf> = names.iter().rev().map(|n| folder.join(n)).collect();
    assert_eq!(listed.files.iter().map(|f| f.path.clone()).collect::<Vec<_>>(), urls, "the order given");
    let loaded = engine(None).load(&listed, Device::Cpu, &LoadOpts::default()).unwrap();
    assert_same_as(&locals, &listed, &loaded);
}

/// Writes `to`: the safetensors file `from` with its tensors named `prefix` + their name (bytes unchanged).
fn rename_tensors(from: &Path, to: &Path, prefix: &str) {
    let index = weightlift::format::open(&[from.to_path_buf()], None).unwrap();
    let bytes = std::fs::read(from).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    for t in &index.tensors {
        let v = header.remove(&t.name).unwrap();
        header.insert(format!("{prefix}{}", t.name), v);
    }
    let mut text = serde_json::to_vec(&header).unwrap();
    while !(8 + text.len()).is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + header_len..]);
    std::fs::write(to, out).unwrap();
}

#[test]
fn a_presigned_url_keeps_its_query_on_every_request() {
    let _serial = one_at_a_time();
    let Some(bucket) = servers::bucket(&Shape::default()) else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = generate(dir.path(), "a.safetensors", 3 << 20, 3);
    servers::put(&bucket.root, "bucket/a.safetensors", &local);
    let query = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=600&X-Amz-Signature=0123abcd";
    let url = format!("{}/bucket/a.safetensors?{query}", bucket.base());
    let index = weightlift::format::open(&[PathBuf::from(&url)], None).unwrap();
    let loaded = engine(None).load(&index, Device::Cpu, &LoadOpts::default()).unwrap();
    assert_same_as(&[local], &index, &loaded);
    let requests = bucket.requests();
    assert!(requests.len() > 2, "{requests:?}");
    for r in &requests {
        assert_eq!((r.method.as_str(), r.target.as_str()), ("GET", format!("/bucket/a.safetensors?{query}").as_str()));
    }
}

#[test]
fn slowdown_answers_are_retried_and_counted() {
    let _serial = one_at_a_time();
    // About a third of all requests answered 503 SlowDown, without Retry-After (as S3 answers): among the load's 16
    // or so requests, none is slowed once in a thousand runs (a fifth failed 3 % of them).
    let shape = Shape { ttfb_s: 0.002, slowdown: 0.35, ..Shape::default() };
    let Some(bucket) = servers::bucket(&shape) else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = generate(dir.path(), "a.safetensors", 8 << 20, 4);
    servers::put(&bucket.root, "bucket/a.safetensors", &local);
    let url = format!("{}/bucket/a.safetensors", bucket.base());
    let engine = engine(None);
    configure(Config { retries: 30, ..Config::default() });
    let index = weightlift::format::open(&[PathBuf::from(&url)], None).unwrap();
    let parsing = bucket.requests().len();
    let loaded = engine.load(&index, Device::Cpu, &LoadOpts::default()).unwrap();
    configure(Config::default());
    assert_same_as(&[local], &index, &loaded);
    let net = loaded.report.network.as_ref().unwrap();
    let slowed = bucket.requests()[parsing..].iter().filter(|r| r.status == 503).count() as u64;
    assert!(slowed > 0, "no SlowDown answer among {} requests", net.requests);
    assert_eq!((net.throttled, net.retries), (slowed, slowed), "{net:?}");
}

#[test]
fn retry_after_is_waited_out() {
    let _serial = one_at_a_time();
    // Every request is answered 503 with Retry-After: 1; two retries wait at least 2 s where the backoff alone
    // would wait at most 150 ms.
    let Some(bucket) = servers::bucket(&Shape { slowdown: 0.999, retry_after_s: Some(1), ..Shape::default() }) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let local = generate(dir.path(), "a.safetensors", 1 << 20, 5);
    servers::put(&bucket.root, "bucket/a.safetensors", &local);
    let url = format!("{}/bucket/a.safetensors", bucket.base());
    configure(Config { retries: 2, ..Config::default() });
    let t = Instant::now();
    let err = weightlift::format::open(&[PathBuf::from(&url)], None).unwrap_err().to_string();
    let took = t.elapsed();
    configure(Config::default());
    assert!(took >= Duration::from_millis(1900), "gave up after {took:?}: {err}");
    assert!(err.contains("failed after 2 retries") && err.contains("503"), "{err}");
}

#[test]
fn steps_of_byte_ranges_send_no_request_to_open_the_object_again() {
    // weightlift.distributed's steps: byte ranges of a parsed index (Engine::read of Sources::Described), step after step.
    let _serial = one_at_a_time();
    let Some(bucket) = servers::bucket(&Shape { ttfb_s: 0.002, ..Shape::default() }) else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = generate(dir.path(), "a.safetensors", 4 << 20, 6);
    servers::put(&bucket.root, "bucket/a.safetensors", &local);
    let url = format!("{}/bucket/a.safetensors", bucket.base());
    let index = weightlift::format::open(&[PathBuf::from(&url)], None).unwrap();
    let file = std::fs::read(&local).unwrap();
    let engine = engine(None);
    for t in &index.tensors {
        let mut out = vec![0u8; t.nbytes as usize];
        let dest = weightlift::RawDest::Host(out.as_mut_ptr());
        let (ranges, dests) = ([weightlift::ByteRange::new(0, t.offset, t.nbytes, 0)], [(dest, t.nbytes)]);
        let req = weightlift::ReadRequest::new(
            weightlift::Sources::Described(&index.files),
            &ranges,
            weightlift::Dests::Memory(&dests),
        );
        // SAFETY: `out` is a host buffer of the range's length, alive and untouched until the call returns.
        let report = unsafe { engine.read(&req) }.unwrap();
        assert!(out[..] == file[t.offset as usize..(t.offset + t.nbytes) as usize], "{}", t.name);
        assert_eq!(report.network.as_ref().map(|n| n.heads), Some(0));
    }
    let requests = bucket.requests();
    // The first request opened the object (parsing); every later one is a GET of tensor bytes, pinned to its ETag.
    assert!(requests.iter().all(|r| r.method == "GET"), "{requests:?}");
    let pinned = requests.iter().skip(1).all(|r| r.range != "bytes=0-262143" && !r.if_match.is_empty());
    assert!(pinned && requests.len() > index.tensors.len(), "{requests:?}");
}

#[test]
fn a_small_object_is_fetched_whole_by_the_get_that_opens_it() {
    let _serial = one_at_a_time();
    let Some(bucket) = servers::bucket(&Shape::default()) else { return };
    let dir = tempfile::tempdir().unwrap();
    // Bytes that repeat nowhere: a config-sized object, one just over the opening GET, one over the limit.
    let bytes = |n: usize, seed: u64| -> Vec<u8> {
        (0..n as u64).map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(seed) >> 56) as u8).collect()
    };
    let first = weightlift::remote::Head::FIRST as usize;
    for (name, want) in [("small.json", bytes(3_001, 1)), ("larger.json", bytes(first + 4_097, 2))] {
        let local = dir.path().join(name);
        std::fs::write(&local, &want).unwrap();
        servers::put(&bucket.root, &format!("bucket/{name}"), &local);
        let before = bucket.requests().len();
        let url = weightlift::remote::ObjectUrl::parse(&format!("{}/bucket/{name}", bucket.base())).unwrap();
        let got = weightlift::remote::Head::fetch(&url, 1 << 20).unwrap();
        assert!(got == want, "{name}: bytes differ");
        let sent = &bucket.requests()[before..];
        let gets = if want.len() <= first { 1 } else { 2 };
        assert_eq!(sent.len(), gets, "{name}: {sent:?}");
        assert!(sent.iter().all(|r| r.method == "GET" && r.status == 206), "{name}: {sent:?}");
    }
    let url = weightlift::remote::ObjectUrl::parse(&format!("{}/bucket/larger.json", bucket.base())).unwrap();
    let e = weightlift::remote::Head::fetch(&url, 4096).unwrap_err();
    assert!(e.to_string().contains(&format!("{} bytes: more than the 4096", first + 4_097)), "{e}");
    let url = weightlift::remote::ObjectUrl::parse(&format!("{}/bucket/none.json", bucket.base())).unwrap();
    let e = weightlift::remote::Head::fetch(&url, 4096).unwrap_err();
    assert_eq!(e.io_kind(), std::io::ErrorKind::NotFound, "{e}");
}
