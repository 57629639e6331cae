//! Helpers shared by the integration tests.

/// Whether a CUDA device is usable here; says why `test` is skipped when not.
pub fn gpu_or_skip(test: &str) -> bool {
    match weightlift_cuda::available() {
        Ok(_) => true,
        Err(why) => {
            eprintln!("skipping {test}: {why}");
            false
        }
    }
}
