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

/// Every file in `dir`, sorted (to see what a command left behind).
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

fn small_checkpoint(dir: &Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    let out = weightlift(&["generate", path.to_str().unwrap(), "--size", "2MiB", "--seed", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    path
}

/// A command that must fail as a user error: status 2, one line `weightlift: error: …` mentioning `what`.
fn assert_user_error(out: &Output, args: &[&str], what: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("weightlift: error: ") && err.contains(what), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

/// No writer ever replaces its input (by any name: the same path, a hard link) or something that is not a regular
/// file (a FIFO, a folder, a device node).
#[test]
fn no_writer_replaces_its_input_or_a_non_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = small_checkpoint(dir.path(), "a.safetensors");
    let original = std::fs::read(&a).unwrap();
    let hard = dir.path().join("hard.safetensors");
    std::fs::hard_link(&a, &hard).unwrap();
    let p = dir.path().join("p.wlpack");
    let out = weightlift(&["pack", a.to_str().unwrap(), p.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let packed = std::fs::read(&p).unwrap();
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let (a, hard, p, fifo) = (a.to_str().unwrap(), hard.to_str().unwrap(), p.to_str().unwrap(), fifo.to_str().unwrap());
    let d = dir.path().to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["pack", a, a], "is the same file as the input"),
        (&["pack", a, hard], "is the same file as the input"),
        (&["unpack", p, p], "is the same file as the input"),
        (&["checksum", a, "-o", a], "is the same file as the input"),
        (&["checksum", a, "-o", hard], "is the same file as the input"),
        (&["pack", a, fifo], "is a FIFO"),
        (&["unpack", p, fifo], "is a FIFO"),
        (&["checksum", a, "-o", fifo], "is a FIFO"),
        (&["generate", fifo, "--size", "1MiB"], "is a FIFO"),
        (&["pack", a, d], "is a directory"),
    ];
    for (args, what) in cases {
        let out = weightlift_within(args, std::time::Duration::from_secs(30));
        assert_user_error(&out, args, what);
    }
    assert!(std::fs::read(a).unwrap() == original, "the checkpoint was overwritten");
    assert!(std::fs::read(p).unwrap() == packed, "the pack was overwritten");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(fifo).unwrap().file_type().is_fifo());
    assert_eq!(listing(dir.path()), ["a.safetensors", "fifo", "hard.safetensors", "p.wlpack"]);
    // A device node, where one can be made (root in a container): `pack X /dev/full` must not replace it.
    let dev = dir.path().join("full");
    if Command::new("mknod").arg(&dev).args(["c", "1", "7"]).status().is_ok_and(|s| s.success()) {
        for args in [&["pack", a, dev.to_str().unwrap()][..], &["unpack", p, dev.to_str().unwrap()]] {
            assert_user_error(&weightlift(args), args, "is a character device");
        }
        assert!(std::fs::symlink_metadata(&dev).unwrap().file_type().is_char_device(), "the device was replaced");
    } else {
        println!("skipped the device-node case: mknod is not allowed here");
    }
}

/// Two packs to one output at once each write their own temporary file: both succeed, the last rename wins, and
/// what is left is a whole, valid pack.
#[test]
fn concurrent_packs_to_one_output_leave_a_valid_pack() {
    let dir = tempfile::tempdir().unwrap();
    let a = small_checkpoint(dir.path(), "a.safetensors");
    let p = dir.path().join("p.wlpack");
    let start = || {
        Command::new(env!("CARGO_BIN_EXE_weightlift"))
            .args(["pack", a.to_str().unwrap(), p.to_str().unwrap(), "--threads", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    for _ in 0..3 {
        let (one, two) = (start(), start());
        for child in [one, two] {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{}", stderr(&out));
        }
        let check = weightlift(&["unpack", "--check", p.to_str().unwrap(), "unused"]);
        assert!(check.status.success(), "{}", stderr(&check));
        assert_eq!(listing(dir.path()), ["a.safetensors", "p.wlpack"]);
    }
}

/// Pack options out of range are refused, not clamped without a word.
#[test]
fn pack_options_out_of_range_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = small_checkpoint(dir.path(), "a.safetensors");
    let (a, p) = (a.to_str().unwrap(), dir.path().join("p.wlpack"));
    let p = p.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["pack", a, p, "--plane-chunk", "0"], "plane chunk 0"),
        (&["pack", a, p, "--plane-chunk", "1TiB"], "plane chunk"),
        (&["pack", a, p, "--level", "99"], "level 99"),
        (&["pack", a, p, "--level", "0"], "level 0"),
        (&["pack", a, p, "--codec", "deflate", "--level", "12"], "level 12 for deflate"),
    ];
    for (args, what) in cases {
        assert_user_error(&weightlift(args), args, what);
    }
    assert_eq!(listing(dir.path()), ["a.safetensors"]);
}

/// Command-line mistakes read like every other error: one line, `weightlift: error: …`, status 2.
#[test]
fn command_line_errors_are_one_line_with_status_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["generate", "/tmp/never.safetensors", "--size", "abc"], "--size"),
        (&["generate", "/tmp/never.safetensors", "--size", "-1"], "-1"),
        (&["generate", "/tmp/never.safetensors", "--layout", "bogus"], "bogus"),
        (&["load", "--count", "5"], "--raw"),
        (&["inspect"], "PATHS"),
        (&["no-such-command"], "no-such-command"),
        (&[], "a command is needed"),
        (&["inspect", "x.safetensors", "--no-such-flag"], "--no-such-flag"),
    ];
    for (args, what) in cases {
        assert_user_error(&weightlift(args), args, what);
    }
    assert!(!Path::new("/tmp/never.safetensors").exists());
    let help = weightlift(&["--help"]);
    assert!(help.status.success() && String::from_utf8_lossy(&help.stdout).contains("Usage"));
    let version = weightlift(&["--version"]);
    assert!(version.status.success() && String::from_utf8_lossy(&version.stdout).contains("weightlift"));
}

/// A reader that goes away (`weightlift inspect --json X | head -c 100`, `weightlift probe | head -1`) ends the
/// command quietly, as ripgrep does: no panic, no message, status 0.
#[test]
fn a_closed_stdout_ends_quietly() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wide.safetensors");
    let out = weightlift(&["generate", path.to_str().unwrap(), "--layout", "many-small", "--tensors", "20000"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for args in [&["inspect", "--json", path.to_str().unwrap()][..], &["probe"], &["inspect", path.to_str().unwrap()]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_weightlift"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 1];
        let _ = child.stdout.take().unwrap().read(&mut first); // read a byte, then close the pipe
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}

/// Whether `child` has a file open that it is writing in `dir`: unnamed (`/proc/PID/fd/N` reads
/// `DIR/#INODE (deleted)`) or, on a filesystem without `O_TMPFILE`, `NAME.weightlift-tmp-…`.
fn writing_in(dir: &Path, child: &std::process::Child) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fd", child.id())) else { return false };
    fds.flatten().filter_map(|fd| std::fs::read_link(fd.path()).ok()).any(|link| {
        let name = link.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        link.parent() == Some(dir) && (name.starts_with('#') || name.contains(".weightlift-tmp-"))
    })
}

/// Waits until `child` writes its output in `dir` (or ends: then the command was too quick).
fn wait_for_temp(dir: &Path, child: &mut std::process::Child) {
    let t0 = std::time::Instant::now();
    while !writing_in(dir, child) {
        assert!(child.try_wait().unwrap().is_none(), "the command ended before it was interrupted: make it longer");
        assert!(t0.elapsed() < std::time::Duration::from_secs(60), "no temporary file after 60 s");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn signal(child: &std::process::Child, sig: &str) {
    assert!(Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap().success());
}

/// SIGINT or SIGTERM during `pack` or `unpack` exits with a message (as a load does); a SIGKILL, which no cleanup
/// can catch, leaves nothing behind either (the file being written has no name until it is complete).
#[test]
fn an_interrupted_pack_or_unpack_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("sparse.safetensors");
    sparse_checkpoint(&input, 1 << 30);
    let small = small_checkpoint(dir.path(), "small.safetensors");
    let out = dir.path().join("p.wlpack");
    let (input, small, out) = (input.to_str().unwrap(), small.to_str().unwrap(), out.to_str().unwrap());
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_weightlift"))
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    for (sig, code) in [("-INT", 130), ("-TERM", 143)] {
        let mut child = run(&["pack", input, out, "--threads", "1", "--codec", "raw"]);
        wait_for_temp(dir.path(), &mut child);
        signal(&child, sig);
        let o = child.wait_with_output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{sig}: {err}");
        assert!(err.contains("interrupted") && err.lines().count() == 1, "{sig}: {err}");
        assert_eq!(listing(dir.path()), ["small.safetensors", "sparse.safetensors"], "{sig}");
    }
    let mut child = run(&["pack", input, out, "--threads", "1", "--codec", "raw"]);
    wait_for_temp(dir.path(), &mut child);
    signal(&child, "-KILL");
    let _ = child.wait();
    assert_eq!(listing(dir.path()), ["small.safetensors", "sparse.safetensors"], "SIGKILL");
    let o = weightlift(&["pack", small, out]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(listing(dir.path()), ["p.wlpack", "small.safetensors", "sparse.safetensors"]);
    // Unpack, interrupted.
    let o = weightlift(&["pack", input, out, "--codec", "zstd"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let unpacked = dir.path().join("back.safetensors");
    let mut child = run(&["unpack", out, unpacked.to_str().unwrap(), "--threads", "1"]);
    wait_for_temp(dir.path(), &mut child);
    signal(&child, "-TERM");
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(143), "{}", stderr(&o));
    assert_eq!(listing(dir.path()), ["p.wlpack", "small.safetensors", "sparse.safetensors"]);
    let mut child = run(&["unpack", out, unpacked.to_str().unwrap(), "--threads", "1"]);
    wait_for_temp(dir.path(), &mut child);
    signal(&child, "-KILL");
    let _ = child.wait();
    assert_eq!(listing(dir.path()), ["p.wlpack", "small.safetensors", "sparse.safetensors"], "SIGKILL");
}

/// `checksum --verify` of a copy that differs names the file checked, not the one the manifest was made from.
#[test]
fn checksum_verify_names_the_file_checked() {
    let dir = tempfile::tempdir().unwrap();
    let a = small_checkpoint(dir.path(), "a.safetensors");
    let m = dir.path().join("a.xxh3.json");
    let o = weightlift(&["checksum", a.to_str().unwrap(), "-o", m.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let copy = dir.path().join("copy.safetensors");
    let mut bytes = std::fs::read(&a).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xFF;
    std::fs::write(&copy, &bytes).unwrap();
    let args = ["checksum", copy.to_str().unwrap(), "-o", m.to_str().unwrap(), "--verify"];
    let o = weightlift(&args);
    assert_user_error(&o, &args, "copy.safetensors");
    assert!(!stderr(&o).contains("a.safetensors"), "{}", stderr(&o));
}

/// A GGUF file whose metadata repeats a key is reported as a repeated metadata key, not a tensor.
#[test]
fn a_duplicate_gguf_metadata_key_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let case = corpus::hostile().into_iter().find(|c| c.name == "gguf duplicate metadata key").unwrap();
    let path = dir.path().join(&case.files[0].0);
    std::fs::write(&path, &case.files[0].1).unwrap();
    let args = ["inspect", path.to_str().unwrap()];
    let o = weightlift(&args);
    assert_user_error(&o, &args, "metadata key \"k\" appears twice");
    assert!(!stderr(&o).contains("tensor"), "{}", stderr(&o));
}

/// The peak resident memory of a command, from GNU time's `%M` (KiB), or `None` where there is no such tool.
fn peak_rss_kib(args: &[&str]) -> Option<(Output, u64)> {
    let probe = Command::new("/usr/bin/time").args(["-f", "%M", "true"]).output().ok()?;
    if !probe.status.success() {
        return None;
    }
    let out = Command::new("/usr/bin/time")
        .args(["-f", "peak-rss-kib %M", env!("CARGO_BIN_EXE_weightlift")])
        .args(args)
        .output()
        .ok()?;
    let err = stderr(&out);
    let kib = err.lines().find_map(|l| l.strip_prefix("peak-rss-kib ")).and_then(|v| v.trim().parse().ok())?;
    Some((out, kib))
}

/// A 16 MiB GGUF file whose metadata is one array of 16 M `uint8`: `inspect`, `inspect --json` and `load` stay
/// within a small multiple of the file (they took 32 to 176 times it), and `--json` summarizes the array.
#[test]
fn a_long_gguf_metadata_array_costs_about_its_size_in_every_command() {
    use weightlift::format::gguf::{self, GgufArray, GgufValue};
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, n: usize| {
        let path = dir.path().join(name);
        let kv = vec![("big".to_string(), GgufValue::Array(GgufArray::U8(vec![7; n])))];
        std::fs::write(&path, gguf::layout(&kv, &[]).unwrap().header).unwrap();
        path.to_str().unwrap().to_string()
    };
    let (p, small) = (write("big.gguf", 16 << 20), write("small.gguf", 16));
    let (p, small) = (p.as_str(), small.as_str());
    if peak_rss_kib(&["--version"]).is_none() {
        println!("skipped the memory bounds: no GNU time at /usr/bin/time");
        return;
    }
    for command in [&["inspect"][..], &["inspect", "--json"], &["load", "--device", "cpu"]] {
        let peak = |path: &str| {
            let args: Vec<&str> = command.iter().copied().chain([path]).collect();
            let (out, kib) = peak_rss_kib(&args).unwrap();
            assert!(out.status.success(), "{args:?}: {}", stderr(&out));
            kib
        };
        let (big, baseline) = (peak(p), peak(small));
        let extra = big.saturating_sub(baseline) * 1024;
        println!("{command:?}: peak RSS {big} KiB, {extra} bytes more than for a 16-element array");
        assert!(extra < 3 * (16 << 20), "{command:?}: {extra} bytes for a 16 MiB file");
    }
    let json: Value = serde_json::from_slice(&weightlift(&["inspect", "--json", p]).stdout).unwrap();
    let big = &json["files"][0]["metadata"]["big"];
    assert_eq!((big["len"].as_u64(), big["type"].as_str()), (Some(16 << 20), Some("uint8")), "{big}");
}

/// `inspect` through a shard index of 200,000 tensors takes about as long as the shard alone (it did not finish in
/// 30 s: a lookup per weight-map entry went through a list).
#[test]
fn a_shard_index_of_200k_tensors_inspects_in_about_the_time_of_its_shard() {
    let dir = tempfile::tempdir().unwrap();
    let case = corpus::wide_shard_index();
    for (name, bytes) in &case.files {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let timed = |path: &Path| {
        let t0 = std::time::Instant::now();
        let out = weightlift_within(&["inspect", path.to_str().unwrap()], std::time::Duration::from_secs(120));
        (out, t0.elapsed().as_secs_f64())
    };
    let (alone, shard_secs) = timed(&dir.path().join("s.safetensors"));
    assert!(alone.status.success(), "{}", stderr(&alone));
    let (out, index_secs) = timed(&dir.path().join(&case.files[0].0));
    assert_user_error(&out, &["inspect", "model.safetensors.index.json"], "zz.missing");
    assert!(index_secs < 5.0 * shard_secs + 2.0, "the index took {index_secs:.2} s, its shard alone {shard_secs:.2} s");
}

/// `load --checksums` checks each tensor against the manifest `weightlift checksum` wrote beside its file: a whole
/// file passes (and says what it checked), a changed byte fails naming its tensor, a missing manifest says how to
/// write one.
#[test]
fn load_checks_tensors_against_their_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let a = small_checkpoint(dir.path(), "a.safetensors");
    let a = a.to_str().unwrap();
    let o = weightlift(&["checksum", a]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(dir.path().join("a.safetensors.xxh3.json").exists());
    let o = weightlift(&["load", a, "--checksums", "--device", "cpu", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let checks = &report["checks"];
    assert!(checks["chunks"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(checks["bytes"].as_u64(), report["bytes"].as_u64(), "{report}");

    let index = weightlift::format::open(&[std::path::PathBuf::from(a)], None).unwrap();
    let last = index.tensors.iter().max_by_key(|t| t.offset).unwrap();
    let mut bytes = std::fs::read(a).unwrap();
    let at = (last.offset + last.nbytes / 2) as usize;
    bytes[at] ^= 0x40;
    std::fs::write(a, &bytes).unwrap();
    let o = weightlift(&["load", a, "--checksums", "--device", "cpu"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains(&last.name) && !stderr(&o).contains("panicked"), "{}", stderr(&o));
    let o = weightlift(&["load", a, "--device", "cpu"]);
    assert!(o.status.success(), "without --checksums nothing is checked: {}", stderr(&o));

    std::fs::remove_file(dir.path().join("a.safetensors.xxh3.json")).unwrap();
    let args = ["load", a, "--checksums", "--device", "cpu"];
    let o = weightlift(&args);
    assert!(!o.status.success() && stderr(&o).contains("weightlift checksum"), "{}", stderr(&o));
}
