//! The `weightlift` binary end to end: user errors are one line with exit status 2, and generated checkpoints
//! inspect to what was asked for.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use weightlift_format::corpus;

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
