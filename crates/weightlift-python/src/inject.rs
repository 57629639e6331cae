//! Fault injection for tests of the layers above the engine (a process of a distributed load failing mid-read, the
//! Python APIs under random faults): `WEIGHTLIFT_INJECT_EIO=PATH@OFFSET` makes every read covering byte `OFFSET` of
//! file `PATH` fail with EIO, in the loads that consult it: a checkpoint's loads, streams (`safe_open`) and rows,
//! `load_ranges`, `read_into` and `read_ranges_into`. Unset in normal use; a malformed value is an error, never
//! ignored.

use std::path::{Path, PathBuf};

use pyo3::PyResult;
use weightlift::io::fault::{Fault, FaultPlan};

use crate::errors;

pub const VARIABLE: &str = "WEIGHTLIFT_INJECT_EIO";

/// The faults the environment asks for in a load of `paths` (None when the variable is unset or names none of them).
pub fn from_env(paths: &[PathBuf]) -> PyResult<Option<FaultPlan>> {
    let Ok(value) = std::env::var(VARIABLE) else { return Ok(None) };
    let parsed = value.rsplit_once('@').and_then(|(p, o)| Some((PathBuf::from(p), o.trim().parse::<u64>().ok()?)));
    let Some((path, offset)) = parsed else {
        return Err(errors::invalid_argument(&format!("{VARIABLE}={value:?}: expected PATH@OFFSET")));
    };
    let target = canonical(&path);
    let faults: Vec<Fault> = paths
        .iter()
        .enumerate()
        .filter(|(_, p)| canonical(p) == target)
        .map(|(i, _)| Fault::Eio { file: i as u32, offset })
        .collect();
    Ok((!faults.is_empty()).then(|| FaultPlan::new(faults)))
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}
