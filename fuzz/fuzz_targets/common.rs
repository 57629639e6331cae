//! The readers parse files, so each input is written to a file and read back through the same path a user's
//! checkpoint takes. `scripts/fuzz` points `TMPDIR` at memory-backed storage and removes it afterwards.

#![allow(dead_code)] // each target uses its own part of this module

use std::collections::HashSet;
use std::path::PathBuf;

use weightlift_format::{Format, TensorIndex};

pub fn scratch(name: &str, data: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weightlift-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join(name);
    std::fs::write(&path, data).expect("write input");
    path
}

/// What every index a reader accepts must satisfy, whatever the input: names unique, each tensor's size equal to
/// its dtype × shape, every tensor inside its file's data section, no two tensors of a file overlapping, and (for
/// safetensors) the data section covered exactly.
pub fn check_index(index: &TensorIndex) {
    let mut names = HashSet::new();
    for t in &index.tensors {
        assert!(names.insert(t.name.as_str()), "duplicate tensor {:?} accepted", t.name);
        assert_eq!(t.dtype.byte_size(&t.shape).ok(), Some(t.nbytes), "{:?}: size disagrees with dtype × shape", t.name);
        let file = index.files.get(t.file).expect("tensor names an existing file");
        let end = t.offset.checked_add(t.nbytes).expect("tensor end overflows");
        assert!(t.offset >= file.data_start && end <= file.len, "{:?} lies outside its file's data", t.name);
    }
    for (i, file) in index.files.iter().enumerate() {
        let mut ranges: Vec<(u64, u64)> =
            index.tensors.iter().filter(|t| t.file == i).map(|t| (t.offset, t.offset + t.nbytes)).collect();
        ranges.sort_unstable();
        for pair in ranges.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "tensors overlap at {}", pair[1].0);
        }
        if file.format == Format::Safetensors && !is_aligned_layout(file) {
            let covered: u64 = ranges.iter().map(|(a, b)| b - a).sum();
            assert_eq!(covered, file.len - file.data_start, "safetensors data section not covered exactly");
        }
    }
}

/// Aligned files hide their padding tensors, so their coverage has gaps by design.
fn is_aligned_layout(file: &weightlift_format::SourceFile) -> bool {
    match &file.metadata {
        weightlift_format::Metadata::Safetensors(m) => m.contains_key(weightlift_format::safetensors::ALIGN_KEY),
        _ => false,
    }
}
