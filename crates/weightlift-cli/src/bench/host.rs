//! Loads into host memory: the storage engine alone, against `dd` (warm, one reader) and 8 parallel
//! `dd iflag=direct` (cold), plus the Python shapes where asked.

use anyhow::Result;
use serde_json::json;
use weightlift::{Device, Engine};

use super::args::Args;
use super::case::{Case, time_loads};
use super::ceilings::{can_drop_caches, drop_caches, file_checksum, warm};
use super::ceilings::{cold_parallel_dd, warm_dd};
use super::report::{finish, host_json, settings_json};
use crate::load::{cache_dir, demo_checkpoint};
use crate::units;

pub fn run(args: &Args, device: Device, why: &str) -> Result<()> {
    let runs = args.runs.max(1);
    let dir = args.dir.clone().unwrap_or_else(cache_dir);
    let file = match &args.file {
        Some(f) => f.clone(),
        None => demo_checkpoint(&dir, args.size.unwrap_or(1 << 30), args.json)?,
    };
    let index = weightlift::format::open(std::slice::from_ref(&file), None)?;
    let engine = Engine::new(args.engine.settings()?)?;
    let expected = file_checksum(&index)?;
    let cold = !args.no_cold && can_drop_caches();
    let log = |msg: &str| {
        if !args.json {
            eprintln!("{msg}");
        }
    };
    log(&format!(
        "bench: {} ({}, {} tensors) → {device}",
        file.display(),
        units::bytes(index.total_bytes()),
        index.tensors.len()
    ));
    let mut ceilings = serde_json::Map::new();
    let warm_ceiling = warm_dd(&file, runs)?;
    log(&format!("  ceiling: warm dd bs=16M {:.2} GB/s (best of {runs})", warm_ceiling.best()));
    ceilings.insert("warm_dd_bs16M".into(), warm_ceiling.json());
    let cold_ceiling = if cold && args.wants("cold") {
        let r = cold_parallel_dd(&file, 8, runs)?;
        log(&format!("  ceiling: cold 8 × dd iflag=direct {:.2} GB/s", r.best()));
        ceilings.insert("cold_dd_direct_x8".into(), r.json());
        Some(r)
    } else {
        log("  cold cases skipped: dropping the page cache needs root (or --no-cold was given)");
        None
    };

    let mut cases = Vec::new();
    if args.wants("warm") {
        let (rate, detail) = time_loads(&engine, &index, device, runs, expected, || warm(&file))?;
        cases.push(Case::new(
            format!("warm page cache → {device}"),
            rate,
            "warm dd bs=16M",
            Some(warm_ceiling.best()),
            detail,
        ));
    }
    if let Some(c) = &cold_ceiling {
        let (rate, detail) = time_loads(&engine, &index, device, runs, expected, drop_caches)?;
        cases.push(Case::new(format!("cold disk → {device}"), rate, "8 × dd iflag=direct", Some(c.best()), detail));
    }
    let python = if args.wants("python") {
        super::python::run(args, &file, None, device, runs, &log)
    } else {
        json!({"skipped": "not asked for"})
    };
    let result = json!({
        "device": device.to_string(),
        "device_reason": why,
        "host": host_json(),
        "file": file, "file_bytes": std::fs::metadata(&file)?.len(), "tensor_bytes": index.total_bytes(),
        "tensors": index.tensors.len(), "runs": runs,
        "settings": settings_json(&engine),
        "ceilings": ceilings,
        "cases": cases.iter().map(Case::json).collect::<Vec<_>>(),
        "python": python,
    });
    finish(args, &result, &cases)
}
