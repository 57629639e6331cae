//! The `weightlift` binary end to end: user errors are one line with exit status 2, and generated checkpoints
//! inspect to what was asked for.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use weightlift::format::corpus;

fn weightlift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weightlift")).args(args).output().expect("run weightlift")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn hostile_files_fail_with_one_line_and_status_2() {
    let dir = tempfile::tempdir().unwrap();
    for case in corpus::hostile() {
        let sub = dir.path().join(case.name.replace(' ', "_"));
        std::fs::create_dir(&sub).unwrap();
        for (name, bytes) in &case.files {
            std::fs::write(sub.join(name), bytes).unwrap();
        }
        let path = sub.join(&case.files[0].0);
        let out = weightlift(&["inspect", path.to_str().unwrap()]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", case.name);
        assert_eq!(err.lines().count(), 1, "{}: {err}", case.name);
        assert!(err.starts_with("weightlift: error: "), "{}: {err}", case.name);
        assert!(err.contains(&*sub.to_string_lossy()), "{}: does not name the file: {err}", case.name);
        assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "{}: {err}", case.name);
        assert!(out.stdout.is_empty(), "{}", case.name);
    }
}

#[test]
fn usage_errors_are_status_2() {
    let out = weightlift(&["generate", "/tmp/x", "--size", "ten"]);
    assert_eq!(out.status.code(), Some(2));
    let out = weightlift(&["inspect", "/no/such/file.safetensors"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out).lines().count(), 1);
}

fn inspect_json(path: &Path) -> Value {
    let out = weightlift(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("inspect --json prints JSON")
}

#[test]
fn generated_layouts_inspect_consistently() {
    let dir = tempfile::tempdir().unwrap();
    for (layout, format, ext) in [
        ("llama", "safetensors", "safetensors"),
        ("many-small", "safetensors", "safetensors"),
        ("single-huge", "safetensors", "safetensors"),
        ("llama", "gguf", "gguf"),
        ("many-small", "gguf", "gguf"),
        ("single-huge", "gguf", "gguf"),
    ] {
        let path = dir.path().join(format!("{layout}.{ext}"));
        let out = weightlift(&[
            "generate",
            path.to_str().unwrap(),
            "--size",
            "3MiB",
            "--layout",
            layout,
            "--format",
            format,
            "--seed",
            "9",
            "--json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let gen_report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let v = inspect_json(&path);
        assert_eq!(v["format"], format);
        let tensors = v["tensors"].as_array().unwrap();
        assert_eq!(tensors.len() as u64, gen_report["tensors"].as_u64().unwrap(), "{layout} {format}");
        let sum: u64 = tensors.iter().map(|t| t["nbytes"].as_u64().unwrap()).sum();
        assert_eq!(sum, v["total_bytes"].as_u64().unwrap());
        assert_eq!(sum, gen_report["tensor_bytes"].as_u64().unwrap());
        let file_len = std::fs::metadata(&path).unwrap().len();
        assert!(tensors.iter().all(|t| t["offset"].as_u64().unwrap() + t["nbytes"].as_u64().unwrap() <= file_len));
    }
}

#[test]
fn aligned_generation_starts_every_tensor_on_4k() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.safetensors");
    let out = weightlift(&[
        "generate",
        path.to_str().unwrap(),
        "--layout",
        "many-small",
        "--tensors",
        "40",
        "--align",
        "4096",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = inspect_json(&path);
    assert_eq!(v["tensor_count"], 40);
    assert_eq!(v["aligned_4k"], 40);
}

#[test]
fn load_model_reports_architecture_parameters_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("model.safetensors");
    let out = weightlift(&["generate", weights.to_str().unwrap(), "--size", "2MiB", "--seed", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let config = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2}"#;
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let d = dir.path().to_str().unwrap();
    let out = weightlift(&["load", "--model", d, "--device", "cpu", "--verify", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let m = &v["model"];
    assert_eq!(m["architecture"], "LlamaForCausalLM");
    assert_eq!(m["layers"], 2);
    let elements: u64 = inspect_json(&weights)["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).product::<u64>())
        .sum();
    assert!(elements > 0);
    assert_eq!(m["parameters"].as_u64(), Some(elements));
    assert!(m["weights_ready_seconds"].as_f64().unwrap() > 0.0);
    assert_eq!(v["verified"], true);
    let out = weightlift(&["load", "--model", d, "--device", "cpu"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("LlamaForCausalLM (llama)"));

    // Weights weightlift cannot read, a folder without config.json, and --model beside paths: one line, status 2.
    std::fs::rename(&weights, dir.path().join("pytorch_model.bin")).unwrap();
    let out = weightlift(&["load", "--model", d, "--device", "cpu"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("pytorch_model.bin; weightlift reads safetensors"), "{}", stderr(&out));
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let out = weightlift(&["load", "--model", d, "--device", "cpu"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("config.json"), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1);
    let out = weightlift(&["load", "--model", d, "x.safetensors"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Runs weightlift with a deadline: a command that blocks fails the test instead of hanging it.
fn weightlift_within(args: &[&str], deadline: std::time::Duration) -> Output {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_weightlift"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run weightlift");
    let t0 = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t0.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("weightlift {args:?} blocked for {deadline:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().expect("collect output")
}

#[test]
fn fifos_sockets_devices_and_directories_fail_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.safetensors");
    let bare_fifo = dir.path().join("checkpoint");
    for f in [&fifo, &bare_fifo] {
        assert!(Command::new("mkfifo").arg(f).status().expect("run mkfifo").success());
    }
    let sock = dir.path().join("model.gguf");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let d = dir.path().to_str().unwrap();
    let (fifo, bare_fifo, sock) = (fifo.to_str().unwrap(), bare_fifo.to_str().unwrap(), sock.to_str().unwrap());
    let cases: &[(&[&str], &str, &str)] = &[
        (&["inspect", fifo], fifo, "is a FIFO"),
        (&["inspect", bare_fifo], bare_fifo, "is a FIFO"),
        (&["inspect", "--raw", "U8", fifo], fifo, "is a FIFO"),
        (&["load", "--device", "cpu", fifo], fifo, "is a FIFO"),
        (&["load", "--device", "cpu", "--raw", "U8", bare_fifo], bare_fifo, "is a FIFO"),
        (&["inspect", sock], sock, "is a socket"),
        (&["load", "--device", "cpu", sock], sock, "is a socket"),
        (&["inspect", "/dev/null"], "/dev/null", "is a character device"),
        (&["load", "--device", "cpu", "--raw", "U8", "/dev/zero"], "/dev/zero", "is a character device"),
        (&["inspect", d], d, "is a directory"),
        (&["load", "--device", "cpu", d], d, "is a directory"),
    ];
    for (args, path, what) in cases {
        let out = weightlift_within(args, std::time::Duration::from_secs(20));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(path) && err.contains(what), "{args:?}: {err}");
    }
}

/// `WEIGHTLIFT_CACHE` names the folder for generated checkpoints (and is no setting's variable: the page-cache
/// policy is `WEIGHTLIFT_PAGE_CACHE`).
#[test]
fn load_without_a_path_generates_into_weightlift_cache() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_weightlift"))
        .args(["load", "--device", "cpu", "--demo-size", "8MiB", "--json"])
        .env("WEIGHTLIFT_CACHE", dir.path())
        .output()
        .expect("run weightlift");
    assert!(o.status.success(), "{}", stderr(&o));
    let generated: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(!generated.is_empty(), "nothing generated in WEIGHTLIFT_CACHE");
    // A one-shot load reports its own fixed costs, which with the load make up the command's time.
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let c = &report["one_shot"];
    let part = |k: &str| c[k].as_f64().unwrap_or_else(|| panic!("one_shot.{k} missing: {c}"));
    let parts = part("parse_secs") + part("device_probe_secs") + part("engine_start_secs") + part("load_secs");
    assert!(parts <= part("command_secs") + 1e-6, "{c}");
    assert!(c["cuda_context_secs"].is_null(), "no CUDA on a CPU load: {c}");
    let bad = Command::new(env!("CARGO_BIN_EXE_weightlift"))
        .args(["load", "--device", "cpu", "--demo-size", "8MiB"])
        .env("WEIGHTLIFT_CACHE", dir.path())
        .env("WEIGHTLIFT_PAGE_CACHE", "sometimes")
        .output()
        .expect("run weightlift");
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("WEIGHTLIFT_PAGE_CACHE") || stderr(&bad).contains("cache"), "{}", stderr(&bad));
}

/// A safetensors file of one `len`-byte U8 tensor whose data is a hole (sparse): long to read in small pieces,
/// cheap on disk. For cancellation tests only (no byte of it is checked).
fn sparse_checkpoint(path: &Path, len: u64) {
    let mut header = format!(r#"{{"t":{{"dtype":"U8","shape":[{len}],"data_offsets":[0,{len}]}}}}"#).into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    std::fs::write(path, &bytes).unwrap();
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(bytes.len() as u64 + len).unwrap();
}

/// Ctrl-C during a load: the load is cancelled, its memory released, and the process exits with status 130 soon
/// after the signal.
#[test]
fn sigint_cancels_a_load_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse.safetensors");
    sparse_checkpoint(&path, 2 << 30);
    let mut child = Command::new(env!("CARGO_BIN_EXE_weightlift"))
        .args(["load", path.to_str().unwrap(), "--device", "cpu", "--threads", "1", "--chunk-bytes", "4KiB"])
        .args(["--cache", "bypass"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run weightlift");
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert!(child.try_wait().unwrap().is_none(), "the load finished before the signal: make it longer");
    let sent = std::time::Instant::now();
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(sent.elapsed() < std::time::Duration::from_secs(5), "no exit 5 s after SIGINT");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let took = sent.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    println!("exit {:?} {:.0} ms after SIGINT", status.code(), took.as_secs_f64() * 1e3);
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted"), "{err}");
}
