//! Durable writes against real writer processes: one killed with SIGKILL in the middle of its write leaves its
//! temporary file behind, and the next write to the same path removes it; a live writer's temporary file is left
//! alone. The writer is this test binary run again with `WEIGHTLIFT_TEST_WRITER` set (see `writer_child`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weightlift_io::durable::write_atomically;

const CHILD_ENV: &str = "WEIGHTLIFT_TEST_WRITER";

/// In the child: writes 1 MiB of a save to the path in `WEIGHTLIFT_TEST_WRITER`, then waits, mid-write, to be
/// killed. In a normal test run (variable unset) it does nothing.
#[test]
fn writer_child() {
    let Some(path) = std::env::var_os(CHILD_ENV) else { return };
    let _ = write_atomically(Path::new(&path), |out| {
        out.write_all(&vec![0x5Au8; 1 << 20])?;
        out.flush()?;
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    unreachable!("the writer is killed before it finishes");
}

/// Starts a writer process and waits until its temporary file holds its first mebibyte.
#[allow(clippy::zombie_processes)] // the child is returned; every caller kills it and waits for it
fn start_writer(path: &Path) -> (Child, PathBuf) {
    let dir = path.parent().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "writer_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, path)
        .stdout(Stdio::null())
        .spawn()
        .expect("start the writer");
    let prefix = format!("{}.weightlift-tmp-{}-", path.file_name().unwrap().to_string_lossy(), child.id());
    let t0 = Instant::now();
    loop {
        let found = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix)));
        if let Some(tmp) = found.filter(|t| std::fs::metadata(t).is_ok_and(|m| m.len() >= 1 << 20)) {
            return (child, tmp);
        }
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the writer never wrote its temporary file");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_killed_writers_temp_file_is_removed_by_the_next_save() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    write_atomically(&path, |w| w.write_all(b"old")).unwrap();
    let (mut child, tmp) = start_writer(&path);
    child.kill().unwrap(); // SIGKILL: no cleanup runs in the writer
    child.wait().unwrap();
    assert!(tmp.exists(), "the killed writer left no temporary file: nothing to test");
    assert_eq!(std::fs::read(&path).unwrap(), b"old", "a killed write must leave the old file");

    write_atomically(&path, |w| w.write_all(b"new")).unwrap();
    assert!(!tmp.exists(), "{} survived the next save", tmp.display());
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn a_live_writers_temp_file_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let (mut child, tmp) = start_writer(&path);
    write_atomically(&path, |w| w.write_all(b"concurrent")).unwrap();
    let still_there = tmp.exists();
    let alive = child.try_wait().unwrap().is_none();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(alive, "the writer exited early");
    assert!(still_there, "a live writer's temporary file was removed");
    assert_eq!(std::fs::read(&path).unwrap(), b"concurrent");
    write_atomically(&path, |w| w.write_all(b"after")).unwrap();
    assert!(!tmp.exists(), "the writer is dead now: its file should have gone");
}
