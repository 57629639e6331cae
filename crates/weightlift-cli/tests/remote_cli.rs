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

/// The tensor lines of `inspect --json`'s output (names, dtypes, shapes, offsets), as text.
fn serde_json_tensors(stdout: &[u8]) -> String {
    let text = String::from_utf8_lossy(stdout);
    let start = text.find("\"tensors\"").unwrap_or_else(|| panic!("no tensors in {text}"));
    text[start..].to_string()
}
