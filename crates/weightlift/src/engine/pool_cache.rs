//! The default pool of a device is the process's, shared by every engine (and other libraries): its release
//! threshold is kept at the largest `device_cache_bytes` of the engines alive that asked for one (never below what
//! it was before the first of them), and put back as it was when the last of them goes.

use std::collections::HashMap;
use std::sync::Mutex;

use weightlift_cuda::{CudaError, Gpu};

/// A device's threshold before any engine changed it, and the values of the engines alive that asked.
struct Asked {
    original: u64,
    keeps: Vec<u64>,
}

impl Asked {
    fn threshold(&self) -> u64 {
        self.keeps.iter().copied().fold(self.original, u64::max)
    }
}

static CACHES: Mutex<Option<HashMap<u32, Asked>>> = Mutex::new(None);

pub(super) fn join(g: &Gpu, keep: u64) -> Result<(), CudaError> {
    let mut all = CACHES.lock().unwrap_or_else(|p| p.into_inner());
    let map = all.get_or_insert_with(HashMap::new);
    let original = match map.get(&g.ordinal()) {
        Some(a) => a.original,
        None => g.freed_memory_kept()?,
    };
    let asked = map.entry(g.ordinal()).or_insert(Asked { original, keeps: Vec::new() });
    asked.keeps.push(keep);
    g.keep_freed_memory(asked.threshold())
}

pub(super) fn leave(g: &Gpu, keep: u64) -> Result<(), CudaError> {
    let mut all = CACHES.lock().unwrap_or_else(|p| p.into_inner());
    let Some(map) = all.as_mut() else { return Ok(()) };
    let Some(asked) = map.get_mut(&g.ordinal()) else { return Ok(()) };
    if let Some(i) = asked.keeps.iter().position(|&k| k == keep) {
        asked.keeps.swap_remove(i);
    }
    let value = asked.threshold();
    if asked.keeps.is_empty() {
        map.remove(&g.ordinal());
    }
    g.keep_freed_memory(value)
}
