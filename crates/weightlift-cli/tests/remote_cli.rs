//! The CLI on objects: `inspect` and `load` of s3:// and http:// URLs served on 127.0.0.1, and the one-line
//! errors of wrong credentials and missing objects.

#[path = "../../weightlift/tests/servers/mod.rs"]
mod servers;

use std::process::{Command, Output};

use weightlift_format::synth::{self, Container, Layout, Spec};

fn weightlift(args: &[&str], env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_weightlift"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run weightlift")
}

fn s3_env(server: &servers::Server, secret: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", server.base()),
        ("AWS_ACCESS_KEY_ID", servers::ACCESS_KEY.into()),
        ("AWS_SECRET_ACCESS_KEY", secret.into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ALLOW_HTTP", "true".into()),
    ]
}

#[test]
fn inspect_and_load_read_buckets_and_errors_are_one_line() {
    let Some(s3) = servers::s3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("m.safetensors");
    let spec = Spec { layout: Layout::Llama, container: Container::Safetensors, size: 3 << 20, seed: 5, align: None };
    synth::generate(&local, &spec).unwrap();
    servers::put(&s3.root.join("bucket"), "m.safetensors", &local);
    let env = s3_env(&s3, servers::SECRET_KEY);

    let from_file = weightlift(&["inspect", "--json", local.to_str().unwrap()], &[]);
    let from_bucket = weightlift(&["inspect", "--json", "s3://bucket/m.safetensors"], &env);
    assert!(from_bucket.status.success(), "{}", String::from_utf8_lossy(&from_bucket.stderr));
    let tensors = |o: &Output| serde_json_tensors(&o.stdout);
    assert_eq!(tensors(&from_bucket), tensors(&from_file));

    let load = weightlift(&["load", "--device", "cpu", "--json", "s3://bucket/m.safetensors"], &env);
    let out = String::from_utf8_lossy(&load.stdout);
    assert!(load.status.success(), "{out}{}", String::from_utf8_lossy(&load.stderr));
    assert!(out.contains("\"network\"") && out.contains("\"requests\""), "{out}");

    let wrong = weightlift(&["inspect", "s3://bucket/m.safetensors"], &s3_env(&s3, "not-the-secret"));
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(wrong.status.code(), Some(2), "{err}");
    assert!(err.contains("s3://bucket/m.safetensors: access denied"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let missing = weightlift(&["load", "--device", "cpu", "s3://bucket/none.safetensors"], &env);
    let err = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(missing.status.code(), Some(2), "{err}");
    assert!(err.contains("s3://bucket/none.safetensors: no such object"), "{err}");
}

#[test]
fn load_keeps_a_local_copy_with_the_flag_or_the_variable() {
    let Some(s3) = servers::s3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("m.safetensors");
    let spec = Spec { layout: Layout::Llama, container: Container::Safetensors, size: 3 << 20, seed: 6, align: None };
    synth::generate(&local, &spec).unwrap();
    servers::put(&s3.root.join("bucket"), "m.safetensors", &local);
    let cache = dir.path().join("cache");
    let url = "s3://bucket/m.safetensors";
    // The `network` part of the load's JSON report.
    let load = |flags: &[&str], env: &[(&str, String)]| {
        let args = [&["load", "--device", "cpu", "--json"][..], flags, &[url]].concat();
        let out = weightlift(&args, env);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        let report: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        report["network"].clone()
    };
    let env = s3_env(&s3, servers::SECRET_KEY);
    let first = load(&["--remote-cache-dir", cache.to_str().unwrap()], &env);
    assert_eq!(first["copies_written"], serde_json::json!([url]), "{first}");
    let copy = cache.join("s3/bucket/m.safetensors");
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(&local).unwrap(), "the copy differs from the file");
    let mut with_variable = env.clone();
    with_variable.push(("WEIGHTLIFT_REMOTE_CACHE_DIR", cache.display().to_string()));
    let second = load(&[], &with_variable);
    assert_eq!(second["cached"], serde_json::json!([url]), "{second}");
    assert_eq!(second["bytes"], serde_json::json!(0), "{second}");
}

/// The tensor lines of `inspect --json`'s output (names, dtypes, shapes, offsets), as text.
fn serde_json_tensors(stdout: &[u8]) -> String {
    let text = String::from_utf8_lossy(stdout);
    let start = text.find("\"tensors\"").unwrap_or_else(|| panic!("no tensors in {text}"));
    text[start..].to_string()
}

#[test]
fn sigint_stops_a_load_waiting_on_a_slow_server() {
    let Some(nginx) = servers::nginx(true) else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("m.safetensors");
    let spec = Spec { layout: Layout::Llama, container: Container::Safetensors, size: 24 << 20, seed: 6, align: None };
    synth::generate(&local, &spec).unwrap();
    servers::put(&nginx.root, "m.safetensors", &local);
    // The header's GET passes; every GET of the load then waits 30 s before the server sees it.
    let proxy = servers::Proxy::start(nginx.port, Vec::new());
    let hold = proxy.faults.clone();
    *proxy.after_get.lock().unwrap() = Some(Box::new(move |k| {
        if k == 1 {
            *hold.lock().unwrap() = vec![servers::Fault::Slow(std::time::Duration::from_secs(30)); 64];
        }
    }));
    let url = format!("{}/m.safetensors", proxy.base());
    let mut child = Command::new(env!("CARGO_BIN_EXE_weightlift"))
        .args(["load", &url, "--device", "cpu"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run weightlift");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(child.try_wait().unwrap().is_none(), "the load finished before the signal");
    let sent = std::time::Instant::now();
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(sent.elapsed() < std::time::Duration::from_secs(5), "no exit 5 s after SIGINT");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    println!("exit {:?} {:.0} ms after SIGINT", status.code(), sent.elapsed().as_secs_f64() * 1e3);
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted"), "{err}");
}

#[test]
fn upload_puts_every_byte_and_refuses_what_it_cannot_write() {
    let Some(s3) = servers::s3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("m.safetensors");
    // 40 MiB: three parts of 16 MiB, the last one short.
    let spec = Spec { layout: Layout::Llama, container: Container::Safetensors, size: 40 << 20, seed: 9, align: None };
    synth::generate(&local, &spec).unwrap();
    let env = s3_env(&s3, servers::SECRET_KEY);

    let up = weightlift(&["upload", local.to_str().unwrap(), "s3://bucket/up/m.safetensors"], &env);
    let out = String::from_utf8_lossy(&up.stdout);
    assert!(up.status.success(), "{out}{}", String::from_utf8_lossy(&up.stderr));
    assert!(out.starts_with("uploaded ") && out.contains("s3://bucket/up/m.safetensors"), "{out}");
    // The server's own copy of the object, byte for byte.
    let stored = std::fs::read(s3.root.join("bucket/up/m.safetensors")).unwrap();
    assert!(stored == std::fs::read(&local).unwrap(), "the uploaded object differs from the file");

    let missing = weightlift(&["upload", dir.path().join("none").to_str().unwrap(), "s3://bucket/x"], &env);
    let err = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(missing.status.code(), Some(2), "{err}");
    assert!(err.contains("none") && err.trim_end().lines().count() == 1, "{err}");

    let http = weightlift(&["upload", local.to_str().unwrap(), "http://127.0.0.1:1/m"], &env);
    let err = String::from_utf8_lossy(&http.stderr);
    assert_eq!(http.status.code(), Some(2), "{err}");
    assert!(err.contains("not an object URL to write to"), "{err}");

    let denied = weightlift(&["upload", local.to_str().unwrap(), "s3://bucket/y"], &s3_env(&s3, "not-the-secret"));
    let err = String::from_utf8_lossy(&denied.stderr);
    assert_eq!(denied.status.code(), Some(2), "{err}");
    assert!(err.contains("s3://bucket/y: access denied (HTTP 403"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}
