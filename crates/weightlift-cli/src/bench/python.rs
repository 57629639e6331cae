//! The shapes users meet through the Python package (per-tensor `safe_open`, restarts, first loads, the one-shot
//! CLI, host loads against `np.fromfile`) and the loaders they use today, timed by a Python script in a child
//! process on the same files, so that both land in one results file.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use weightlift::Device;

use super::args::Args;
use super::ceilings::can_drop_caches;

fn script(args: &Args) -> Option<PathBuf> {
    if let Some(p) = &args.peers {
        return Some(p.clone());
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let candidates = [dir.join("../bench/shapes.py"), dir.join("bench/shapes.py"), PathBuf::from("bench/shapes.py")];
    candidates.into_iter().find(|p| p.exists())
}

/// Runs the script on `file` (and its tmpfs copy); its JSON, or why it did not run.
pub fn run(args: &Args, file: &Path, shm: Option<&Path>, device: Device, runs: usize, log: &dyn Fn(&str)) -> Value {
    let Some(script) = script(args) else {
        return json!({"skipped": "bench/shapes.py not found"});
    };
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut cmd = Command::new(&python);
    cmd.arg(&script)
        .arg("--file")
        .arg(file)
        .arg("--device")
        .arg(device.to_string())
        .arg("--runs")
        .arg(runs.to_string());
    if let Ok(exe) = std::env::current_exe() {
        cmd.arg("--weightlift-bin").arg(exe);
    }
    if let Some(s) = shm {
        cmd.arg("--shm-file").arg(s);
    }
    if args.no_cold || !can_drop_caches() {
        // The families that need the page cache dropped are left out.
        cmd.arg("--cases").arg("warm,tmpfs,first-load,cli,sharded,host");
    }
    log(&format!("  timing the Python shapes and peers with {} {}", python, script.display()));
    match cmd.output() {
        Ok(out) if out.status.success() => serde_json::from_slice(&out.stdout).unwrap_or_else(
            |e| json!({"skipped": format!("unreadable output: {e}"), "stderr": String::from_utf8_lossy(&out.stderr)}),
        ),
        Ok(out) => {
            json!({"skipped": format!("exit status {}", out.status), "stderr": String::from_utf8_lossy(&out.stderr)})
        }
        Err(e) => json!({"skipped": format!("cannot run {python}: {e}")}),
    }
}
