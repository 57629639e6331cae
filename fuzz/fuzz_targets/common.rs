//! The readers parse files, so each input is written to a file in memory-backed storage and read back through the
//! same path a user's checkpoint takes.

use std::path::PathBuf;

pub fn scratch(name: &str, data: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weightlift-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join(name);
    std::fs::write(&path, data).expect("write input");
    path
}
