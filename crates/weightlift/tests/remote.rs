//! Checkpoints read from objects (S3 through `s3s-fs`, HTTP through nginx), every byte compared with the local
//! file the object was made from.

mod servers;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use weightlift::format::TensorIndex;
use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::{Device, Engine, LoadOpts, Loaded, Settings};

/// The S3 server all tests of this binary share, its endpoint and keys in the environment.
fn s3() -> Option<&'static servers::Server> {
    servers::s3_in_env()
}

fn generate(dir: &Path, name: &str, layout: Layout, container: Container) -> PathBuf {
    let path = dir.join(name);
    synth::generate(&path, &Spec { layout, container, size: 6 << 20, seed: 7, align: None }).unwrap();
    path
}

fn engine() -> Engine {
    // Small GETs, chunks and staging: many ranged GETs, several in flight per lane, slots reused.
    Engine::new(Settings::default().chunk_bytes(256 << 10).staging_bytes(4 << 20).remote_range_bytes(1 << 20)).unwrap()
}

fn load(engine: &Engine, url: &str) -> (TensorIndex, Loaded) {
    let index = weightlift::format::open(&[PathBuf::from(url)], None).unwrap_or_else(|e| panic!("{url}: {e}"));
    let loaded = engine.load(&index, Device::Cpu, &LoadOpts::default()).unwrap_or_else(|e| panic!("{url}: {e}"));
    (index, loaded)
}

/// The object's index equals the local file's, and every loaded byte equals the file's (read with std::fs).
fn assert_same_as(local: &Path, index: &TensorIndex, loaded: &Loaded) {
    let want = weightlift::format::open(&[local.to_path_buf()], None).unwrap();
    assert_eq!(index.tensors, want.tensors);
    let files: Vec<Vec<u8>> = want.files.iter().map(|f| std::fs::read(&f.path).unwrap()).collect();
    for (t, got) in index.tensors.iter().zip(&loaded.tensors) {
        let mut out = vec![0u8; t.nbytes as usize];
        got.data.read_back(0, &mut out).unwrap();
        let file = &files[t.file];
        assert!(out[..] == file[t.offset as usize..(t.offset + t.nbytes) as usize], "{}: bytes differ", t.name);
    }
    assert_eq!(loaded.report.bytes, want.total_bytes());
}

#[test]
fn s3_objects_load_byte_exact() {
    if s3().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    for (name, layout, container) in [
        ("llama.safetensors", Layout::Llama, Container::Safetensors),
        ("many.safetensors", Layout::ManySmall { tensors: Some(400) }, Container::Safetensors),
        ("llama.gguf", Layout::Llama, Container::Gguf),
    ] {
        let local = generate(dir.path(), name, layout, container);
        weightlift::remote::upload(&local, &format!("s3://bucket/models/{name}")).unwrap();
        let (index, loaded) = load(&engine, &format!("s3://bucket/models/{name}"));
        assert_same_as(&local, &index, &loaded);
        let net = loaded.report.network.as_ref().expect("a load from an object reports its requests");
        assert_eq!(net.objects, [format!("s3://bucket/models/{name}")]);
        assert!(net.bytes >= index.total_bytes(), "{net:?}");
        assert!(net.requests >= 2, "{net:?}");
    }
}

#[test]
fn a_shard_index_finds_its_shards_beside_it_in_the_bucket() {
    if s3().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let local = generate(dir.path(), "model-00001-of-00001.safetensors", Layout::Llama, Container::Safetensors);
    let index = weightlift::format::open(std::slice::from_ref(&local), None).unwrap();
    let map: serde_json::Map<String, serde_json::Value> =
        index.tensors.iter().map(|t| (t.name.clone(), "model-00001-of-00001.safetensors".into())).collect();
    let json = serde_json::json!({"metadata": {}, "weight_map": map});
    let index_path = dir.path().join("model.safetensors.index.json");
    std::fs::write(&index_path, serde_json::to_vec(&json).unwrap()).unwrap();
    weightlift::remote::upload(&local, "s3://bucket/sharded/model-00001-of-00001.safetensors").unwrap();
    weightlift::remote::upload(&index_path, "s3://bucket/sharded/model.safetensors.index.json").unwrap();
    let (index, loaded) = load(&engine(), "s3://bucket/sharded/model.safetensors.index.json");
    assert_eq!(index.files[0].path, PathBuf::from("s3://bucket/sharded/model-00001-of-00001.safetensors"));
    assert_same_as(&local, &index, &loaded);
}

#[test]
fn http_objects_load_byte_exact() {
    let Some(nginx) = servers::nginx(true) else { return };
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    for (name, layout, container) in [
        ("a.safetensors", Layout::Llama, Container::Safetensors),
        ("b.gguf", Layout::ManySmall { tensors: Some(200) }, Container::Gguf),
    ] {
        let local = generate(dir.path(), name, layout, container);
        servers::put(&nginx.root, name, &local);
        let (index, loaded) = load(&engine, &format!("{}/{name}", nginx.base()));
        assert_same_as(&local, &index, &loaded);
    }
}

#[test]
fn missing_objects_and_servers_without_ranges_are_one_clear_line() {
    let Some(nginx) = servers::nginx(true) else { return };
    let Some(no_ranges) = servers::nginx(false) else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = generate(dir.path(), "a.safetensors", Layout::Llama, Container::Safetensors);
    servers::put(&no_ranges.root, "a.safetensors", &local);
    let missing = format!("{}/nothing.safetensors", nginx.base());
    let err = weightlift::format::open(&[PathBuf::from(&missing)], None).unwrap_err().to_string();
    assert_eq!(err, format!("{missing}: no such object (or no such bucket)"));
    let url = format!("{}/a.safetensors", no_ranges.base());
    let err = weightlift::format::open(&[PathBuf::from(&url)], None).unwrap_err().to_string();
    assert!(err.starts_with(&url) && err.contains("does not serve byte ranges"), "{err}");
    assert!(!err.contains('\n'), "{err}");
    if s3().is_some() {
        let err = weightlift::format::open(&[PathBuf::from("s3://bucket/no/such.safetensors")], None).unwrap_err();
        assert!(err.to_string().contains("no such object"), "{err}");
    }
}

#[test]
fn an_object_replaced_after_parsing_is_refused() {
    let Some(nginx) = servers::nginx(true) else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = generate(dir.path(), "a.safetensors", Layout::Llama, Container::Safetensors);
    let served = servers::put(&nginx.root, "a.safetensors", &local);
    let url = format!("{}/a.safetensors", nginx.base());
    let index = weightlift::format::open(&[PathBuf::from(&url)], None).unwrap();
    replace(&served);
    let err = engine().load(&index, Device::Cpu, &LoadOpts::default()).unwrap_err().to_string();
    assert!(err.contains("changed while it was being read"), "{err}");
}

#[test]
fn an_object_replaced_during_the_load_is_refused() {
    let Some(nginx) = servers::nginx(true) else { return };
    let proxy = servers::Proxy::start(nginx.port, Vec::new());
    let dir = tempfile::tempdir().unwrap();
    let local = generate(dir.path(), "a.safetensors", Layout::Llama, Container::Safetensors);
    let served = Arc::new(servers::put(&nginx.root, "a.safetensors", &local));
    let url = format!("{}/a.safetensors", proxy.base());
    let index = weightlift::format::open(&[PathBuf::from(&url)], None).unwrap();
    let before = proxy.ranged_gets.load(std::sync::atomic::Ordering::SeqCst);
    let target = served.clone();
    *proxy.after_get.lock().unwrap() = Some(Box::new(move |k| {
        // The load's second GET, and every one after it, reaches the server after the object was replaced.
        if k == before + 2 {
            replace(&target);
        }
    }));
    let result = engine().load(&index, Device::Cpu, &LoadOpts::default());
    let gets = proxy.ranged_gets.load(std::sync::atomic::Ordering::SeqCst);
    let err = result.map(|l| format!("{:?}", l.report.network)).expect_err(&format!("{gets} GETs")).to_string();
    assert!(err.contains("changed while it was being read"), "{err}");
}

/// Rewrites `path` with other bytes of the same length and a later modification time (nginx's ETag is made of
/// both).
fn replace(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let n = bytes.len();
    for b in &mut bytes[n - 4096..] {
        *b = b.wrapping_add(1);
    }
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, &bytes).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(100);
    std::fs::File::options().write(true).open(&tmp).unwrap().set_modified(later).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn a_packed_checkpoint_loads_from_a_url() {
    let Some(nginx) = servers::nginx(true) else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = generate(dir.path(), "m.safetensors", Layout::Llama, Container::Safetensors);
    let packed = dir.path().join("m.wlpack");
    let opts = weightlift_pack::PackOptions { plane_chunk: 256 << 10, ..weightlift_pack::PackOptions::default() };
    weightlift_pack::pack(&local, &packed, &opts, &|_: u64, _: u64| {}).unwrap();
    servers::put(&nginx.root, "m.wlpack", &packed);
    let url = PathBuf::from(format!("{}/m.wlpack", nginx.base()));
    assert!(weightlift::packed::is_pack_file(&url));
    let loaded = engine()
        .load_pack(&url, None, Device::Cpu, weightlift::packed::Decoder::Auto, &LoadOpts::default())
        .unwrap_or_else(|e| panic!("{}: {e}", url.display()));
    let index = weightlift::format::open(std::slice::from_ref(&local), None).unwrap();
    let file = std::fs::read(&local).unwrap();
    assert_eq!(loaded.tensors.len(), index.tensors.len());
    for t in &loaded.tensors {
        let e = index.get(&t.name).unwrap();
        let mut got = vec![0u8; t.data.len()];
        t.data.read_back(0, &mut got).unwrap();
        assert!(got == file[e.offset as usize..e.end() as usize], "{}", t.name);
    }
    let network = loaded.report.network.as_ref().expect("the report names the object's requests");
    let gets = network.gets.as_ref().expect("the report says how many GETs were in flight");
    assert!(gets.peak_in_flight >= 1 && gets.peak_in_flight <= gets.max, "{gets:?}");
}
