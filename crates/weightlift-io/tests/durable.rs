//! Durable writes against real writer processes: one killed with SIGKILL in the middle of its write leaves
//! nothing behind (its temporary file has no name until the write is complete) and the old file whole; a live
//! writer and another save to the same path do not disturb each other. The writer is this test binary run again
//! with `WEIGHTLIFT_TEST_WRITER` set (see `writer_child`). The named temporary files of filesystems without
//! `O_TMPFILE`, and their removal by the next write, are tested in `weightlift-format`'s `output.rs`.

use std::io::Write;
use std::path::Path;
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

/// The size of the file `pid` is writing in `dir`, unnamed (`/proc/PID/fd/N` reads `DIR/#INODE (deleted)`) or
/// named `NAME.weightlift-tmp-…`, if it has one open.
fn temp_size(pid: u32, dir: &Path) -> Option<u64> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    fds.flatten().find_map(|fd| {
        let link = std::fs::read_link(fd.path()).ok()?;
        let ours = link.parent() == Some(dir)
            && link.file_name()?.to_str().is_some_and(|n| n.contains(".weightlift-tmp-") || n.starts_with('#'));
        ours.then(|| std::fs::metadata(fd.path()).ok().map(|m| m.len())).flatten()
    })
}

/// Starts a writer process and waits until its temporary file holds its first mebibyte.
#[allow(clippy::zombie_processes)] // the child is returned; every caller kills it and waits for it
fn start_writer(path: &Path) -> Child {
    let dir = path.parent().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "writer_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, path)
        .stdout(Stdio::null())
        .spawn()
        .expect("start the writer");
    let t0 = Instant::now();
    while temp_size(child.id(), dir).is_none_or(|n| n < 1 << 20) {
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the writer never wrote its temporary file");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

#[test]
fn a_killed_writer_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    write_atomically(&path, |w| w.write_all(b"old")).unwrap();
    let mut child = start_writer(&path);
    child.kill().unwrap(); // SIGKILL: no cleanup runs in the writer
    child.wait().unwrap();
    assert_eq!(listing(dir.path()), ["model.safetensors"], "a killed writer left a file behind");
    assert_eq!(std::fs::read(&path).unwrap(), b"old", "a killed write must leave the old file");
    write_atomically(&path, |w| w.write_all(b"new")).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
    assert_eq!(listing(dir.path()), ["model.safetensors"]);
}

#[test]
fn a_live_writer_and_another_save_do_not_disturb_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let mut child = start_writer(&path);
    write_atomically(&path, |w| w.write_all(b"concurrent")).unwrap();
    let still_writing = temp_size(child.id(), dir.path()).is_some();
    let alive = child.try_wait().unwrap().is_none();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(alive, "the writer exited early");
    assert!(still_writing, "a live writer lost its temporary file");
    assert_eq!(std::fs::read(&path).unwrap(), b"concurrent");
    assert_eq!(listing(dir.path()), ["model.safetensors"]);
}
