//! Faults between the loader and an object's server, injected by a proxy in front of nginx: transient ones are
//! retried from where the body stopped (every byte still equal to the file), lasting ones end in an error naming
//! the URL and byte range. One test: the request settings are process-wide, and each case sets its own.

mod servers;

use std::path::PathBuf;
use std::time::Duration;

use servers::Fault;
use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::remote::{Config, configure};
use weightlift::{Device, Engine, LoadOpts, Settings};

#[test]
fn transient_faults_are_retried_and_lasting_ones_name_the_url_and_range() {
    let Some(nginx) = servers::nginx(true) else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("a.safetensors");
    synth::generate(
        &local,
        &Spec { layout: Layout::Llama, container: Container::Safetensors, size: 12 << 20, seed: 3, align: None },
    )
    .unwrap();
    servers::put(&nginx.root, "a.safetensors", &local);
    let file = std::fs::read(&local).unwrap();
    let engine = Engine::new(Settings::default().chunk_bytes(256 << 10).staging_bytes(2 << 20)).unwrap();
    configure(Config { retries: 8, timeout: Duration::from_millis(1500), ..Config::default() });

    let transient = vec![
        Fault::Unavailable,
        Fault::Throttled,
        Fault::Reset,
        Fault::Truncate,
        Fault::Slow(Duration::from_secs(3)),
        Fault::Unavailable,
    ];
    let proxy = servers::Proxy::start(nginx.port, Vec::new());
    let url = format!("{}/a.safetensors", proxy.base());
    let index = weightlift::format::open(&[PathBuf::from(&url)], None).unwrap();
    *proxy.faults.lock().unwrap() = transient.clone();
    let loaded = engine.load(&index, Device::Cpu, &LoadOpts::default()).unwrap();
    for (t, got) in index.tensors.iter().zip(&loaded.tensors) {
        let mut out = vec![0u8; t.nbytes as usize];
        got.data.read_back(0, &mut out).unwrap();
        assert!(out[..] == file[t.offset as usize..(t.offset + t.nbytes) as usize], "{}", t.name);
    }
    assert!(proxy.faults.lock().unwrap().is_empty(), "every fault was met");
    let net = loaded.report.network.as_ref().unwrap();
    // Each fault cost one retry of the GET it met (resumed where its body stopped).
    assert_eq!(net.retries, transient.len() as u64, "{net:?}");

    let lasting = servers::Proxy::start(nginx.port, Vec::new());
    let url = format!("{}/a.safetensors", lasting.base());
    let index = weightlift::format::open(&[PathBuf::from(&url)], None).unwrap();
    *lasting.faults.lock().unwrap() = vec![Fault::Unavailable; 64];
    let err = engine.load(&index, Device::Cpu, &LoadOpts::default()).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{url}: bytes ")), "{err}");
    assert!(err.contains("failed after 8 retries") && err.contains("503"), "{err}");
    configure(Config::default());
}
