//! Helpers shared by the integration tests.

/// Whether a CUDA device is usable here; says why `test` is skipped when not.
#[allow(dead_code)] // not every test binary that shares these helpers needs a GPU
pub fn gpu_or_skip(test: &str) -> bool {
    match weightlift_cuda::available() {
        Ok(_) => true,
        Err(why) => {
            eprintln!("skipping {test}: {why}");
            false
        }
    }
}

/// Every tensor of `loaded` (a packed load, say) against the bytes of the checkpoint it came from (`original`, a
/// safetensors file read with `std::fs::read`), found by name: dtype, shape and every byte.
#[allow(dead_code)] // not every test binary that shares these helpers loads packs
pub fn check_against(original: &std::path::Path, loaded: &weightlift::Loaded) {
    let file = std::fs::read(original).unwrap();
    let index = weightlift_format::safetensors::read(original).unwrap();
    assert!(!loaded.tensors.is_empty(), "nothing loaded");
    for t in &loaded.tensors {
        let e = index.tensors.iter().find(|e| e.name == t.name).unwrap_or_else(|| panic!("{} not in the file", t.name));
        assert_eq!((t.dtype, &t.shape), (e.dtype, &e.shape), "{}", t.name);
        let mut got = vec![0u8; t.data.len()];
        t.data.read_back(0, &mut got).unwrap();
        assert!(got == file[e.offset as usize..e.end() as usize], "{}: bytes differ", t.name);
    }
}
