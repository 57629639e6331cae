//! `weightlift bench --device cuda:N`: in one run, the pinned host→device ceiling and the cold disk ceiling, then
//! weightlift's loads (a llama-like checkpoint from cold disk, page cache and tmpfs; many small tensors; a raw file;
//! cuFile; GPU-initiated NVMe; writes) and the Python shapes and peers on the same files.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use weightlift::format::{DType, RawSpec, TensorIndex, synth};
use weightlift::{Backend, Device, Engine, LoadOpts};

use super::args::Args;
use super::case::{Case, time_loads};
use super::ceilings::{Rate, can_drop_caches, drop_caches, file_checksum, warm};
use super::ceilings::{cold_parallel_dd, dd_write_direct, warm_dd};
use super::report::{finish, host_json, settings_json};
use crate::load::cache_dir;
use crate::units;

/// Generates `path` from `spec` unless a file of the expected kind is already there.
fn ensure(path: &Path, spec: synth::Spec, log: &dyn Fn(&str)) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    let t = Instant::now();
    let s = synth::generate(path, &spec)?;
    log(&format!(
        "  generated {} ({} tensors, {}) in {:.1} s",
        path.display(),
        s.tensors,
        units::bytes(s.tensor_bytes),
        t.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// The files of the run.
struct Files {
    llama: PathBuf,
    small: PathBuf,
    raw: PathBuf,
    shm: Option<PathBuf>,
}

fn files(args: &Args, dir: &Path, log: &dyn Fn(&str)) -> Result<Files> {
    let size = args.size.unwrap_or(4 << 30);
    let llama = args.file.clone().unwrap_or_else(|| dir.join(format!("llama-{size}.safetensors")));
    let small = dir.join(format!("small-{}.safetensors", args.small_tensors));
    let raw = dir.join(format!("raw-{}.bin", args.raw_size));
    let make = |layout, container, size, path: &Path| {
        ensure(path, synth::Spec { layout, container, size, seed: 7, align: None }, log)
    };
    if args.file.is_none() {
        make(synth::Layout::Llama, synth::Container::Safetensors, size, &llama)?;
    }
    if args.wants("small") {
        make(synth::Layout::ManySmall { tensors: Some(args.small_tensors) }, synth::Container::Safetensors, 0, &small)?;
    }
    if args.wants("raw") || args.wants("nvme") || args.wants("write") {
        make(synth::Layout::SingleHuge, synth::Container::Raw, args.raw_size, &raw)?;
    }
    let shm = if args.shm.is_dir() && (args.wants("tmpfs") || args.wants("python")) {
        let d = args.shm.join("weightlift-bench");
        std::fs::create_dir_all(&d)?;
        let p = d.join(llama.file_name().unwrap_or_default());
        if std::fs::metadata(&p).map(|m| m.len()).ok() != std::fs::metadata(&llama).map(|m| m.len()).ok() {
            std::fs::copy(&llama, &p).with_context(|| format!("copying the checkpoint to {}", p.display()))?;
        }
        Some(p)
    } else {
        log(&format!("  tmpfs case skipped: {} is not a directory (or not asked for)", args.shm.display()));
        None
    };
    Ok(Files { llama, small, raw, shm })
}

/// The pinned copy ceiling, the copy pattern of a load, and the disk's ceilings.
fn ceilings(
    args: &Args,
    gpu: &weightlift::cuda::Gpu,
    llama: &Path,
    log: &dyn Fn(&str),
) -> Result<(serde_json::Map<String, Value>, f64, Option<f64>)> {
    let runs = args.runs.max(1);
    let mut c = serde_json::Map::new();
    let h2d = Rate { runs: weightlift::cuda::pinned_h2d_gbps(gpu, 1 << 30, 5)? };
    log(&format!("  ceiling: pinned host→device copy {:.2} GB/s (1 GiB, best of 5)", h2d.best()));
    c.insert("pinned_h2d".into(), h2d.json());
    let mut patterns = Vec::new();
    for chunk_mib in [2usize, 4, 8] {
        for streams in [1usize, 8] {
            let gbps = weightlift::cuda::chunked_h2d_gbps(gpu, 1 << 30, chunk_mib << 20, streams, 3)?;
            patterns.push(json!({"chunk_bytes": chunk_mib << 20, "streams": streams, "gbps": gbps}));
        }
    }
    c.insert("chunked_h2d".into(), Value::Array(patterns));
    c.insert("warm_dd_bs16M".into(), warm_dd(llama, runs)?.json());
    let cold = if !args.no_cold && can_drop_caches() && (args.wants("cold") || args.wants("python")) {
        let r = cold_parallel_dd(llama, 8, runs)?;
        log(&format!("  ceiling: cold disk, 8 × dd iflag=direct {:.2} GB/s", r.best()));
        c.insert("cold_dd_direct_x8".into(), r.json());
        Some(r.best())
    } else {
        log("  cold cases skipped: dropping the page cache needs root (or --no-cold was given)");
        None
    };
    Ok((c, h2d.best(), cold))
}

/// The first load of a fresh engine (lanes start, staging is mapped and pinned, the CUDA path is decided) against
/// the second, both warm.
fn first_loads(engine: &Engine, index: &TensorIndex, device: Device, llama: &Path) -> Result<Value> {
    warm(llama)?;
    let first = engine.load(index, device, &LoadOpts::default())?;
    let (first_secs, first_alloc) = (first.report.seconds, first.report.alloc_secs);
    let first_times = first.report.to_json()["times"].clone();
    drop(first);
    let second = engine.load(index, device, &LoadOpts::default())?;
    Ok(json!({
        "first_secs": first_secs, "second_secs": second.report.seconds, "ratio": first_secs / second.report.seconds,
        "first_alloc_secs": first_alloc, "second_alloc_secs": second.report.alloc_secs,
        "first_times": first_times, "second_times": second.report.to_json()["times"],
        "peak_staging_bytes": second.report.io.peak_staging_bytes,
    }))
}

pub fn run(args: &Args, ordinal: u32) -> Result<()> {
    let device = Device::Cuda(ordinal);
    let runs = args.runs.max(1);
    let log = |msg: &str| {
        if !args.json {
            eprintln!("{msg}");
        }
    };
    let dir = args.dir.clone().unwrap_or_else(|| cache_dir().join("bench"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let f = files(args, &dir, &log)?;
    let t_engine = Instant::now();
    let engine = Engine::new(args.engine.settings()?)?;
    let engine_start_secs = t_engine.elapsed().as_secs_f64();
    let gpu = engine.gpu(ordinal)?;
    let info = gpu.info().clone();
    log(&format!(
        "bench → {device}: {} ({}), PCIe {}",
        info.name,
        info.pci_bus_id,
        info.pcie_link.as_deref().unwrap_or("?")
    ));
    let (ceilings, h2d, cold) = ceilings(args, &gpu, &f.llama, &log)?;
    let open = |p: &Path, raw: Option<RawSpec>| weightlift::format::open(&[p.to_path_buf()], raw);
    let llama_index = open(&f.llama, None)?;
    let llama_sum = file_checksum(&llama_index)?;
    let setup = first_loads(&engine, &llama_index, device, &f.llama)?;
    log(&format!("  first load of the engine against the second: {setup}"));
    let mut cases: Vec<Case> = Vec::new();
    let mut add = |c: Case| {
        log(&format!("  {}: best {:.2} GB/s", c.name, c.rate.best()));
        cases.push(c);
    };
    for c in page_cache_cases(args, &engine, device, &f, &llama_index, llama_sum, cold, h2d)? {
        add(c);
    }
    let raw_index = open(&f.raw, Some(RawSpec { dtype: DType::U8, count: None })).ok();
    let mut notes = serde_json::Map::new();
    if args.wants("gds") {
        match gds_case(args, &llama_index, device, runs, llama_sum, &f.llama, h2d) {
            Ok(c) => add(c),
            Err(e) => {
                log(&format!("  cuFile case did not run: {e:#}"));
                notes.insert("cufile_case_error".into(), json!(format!("{e:#}")));
            }
        }
    }
    if let Some(idx) = raw_index.as_ref().filter(|_| args.wants("nvme")) {
        for c in nvme_cases(args, &engine, idx, &f.raw, device, runs, h2d, &log)? {
            add(c);
        }
    }
    if let Some(idx) = raw_index.as_ref().filter(|_| args.wants("write")) {
        add(write_case(args, &engine, idx, &dir, device, runs, &log)?);
    }
    let python = if args.wants("python") {
        super::python::run(args, &f.llama, f.shm.as_deref(), device, runs, &log)
    } else {
        json!({"skipped": "not asked for"})
    };
    let result = json!({
        "device": device.to_string(),
        "gpu": {"name": info.name, "pci_bus_id": info.pci_bus_id, "pcie_link": info.pcie_link, "total_bytes": info.total_bytes,
                "compute_capability": [info.compute_capability.0, info.compute_capability.1], "driver_version": info.driver_version},
        "host": host_json(),
        "files": {"llama": describe(&f.llama, &llama_index), "tmpfs": f.shm},
        "runs": runs,
        "settings": settings_json(&engine),
        "ceilings": ceilings,
        "notes": notes,
        "engine_start_secs": engine_start_secs,
        "engine_setup": setup,
        "gpu_path": engine.gpu_path(ordinal).map(|p| json!({"path": format!("{:?}", p.kind), "reason": p.reason, "resolve_secs": p.resolve_secs})).unwrap_or_else(|e| json!({"error": e.to_string()})),
        "cases": cases.iter().map(Case::json).collect::<Vec<_>>(),
        "python": python,
    });
    finish(args, &result, &cases)
}

/// The whole-file cases read from the disk or the page cache: cold, warm, tmpfs, many small tensors, a raw file.
#[allow(clippy::too_many_arguments)]
fn page_cache_cases(
    args: &Args,
    engine: &Engine,
    device: Device,
    f: &Files,
    llama_index: &TensorIndex,
    llama_sum: u64,
    cold: Option<f64>,
    h2d: f64,
) -> Result<Vec<Case>> {
    let runs = args.runs.max(1);
    let open = |p: &Path, raw: Option<RawSpec>| weightlift::format::open(&[p.to_path_buf()], raw);
    let mut cases = Vec::new();
    if let Some(c) = cold.filter(|_| args.wants("cold")) {
        let (rate, detail) = time_loads(engine, llama_index, device, runs, llama_sum, drop_caches)?;
        cases.push(Case::new("llama, cold disk".into(), rate, "8 × dd iflag=direct", Some(c), detail));
    }
    if args.wants("warm") {
        let (rate, detail) = time_loads(engine, llama_index, device, runs, llama_sum, || warm(&f.llama))?;
        cases.push(Case::new("llama, warm page cache".into(), rate, "pinned host→device", Some(h2d), detail));
    }
    if let Some(p) = f.shm.as_ref().filter(|_| args.wants("tmpfs")) {
        let idx = open(p, None)?;
        let (rate, detail) = time_loads(engine, &idx, device, runs, llama_sum, || Ok(()))?;
        cases.push(Case::new("llama, tmpfs".into(), rate, "pinned host→device", Some(h2d), detail));
    }
    if args.wants("small") {
        let idx = open(&f.small, None)?;
        let (rate, detail) = time_loads(engine, &idx, device, runs, file_checksum(&idx)?, || warm(&f.small))?;
        cases.push(Case::new(
            format!("{} small tensors, warm", args.small_tensors),
            rate,
            "pinned host→device",
            Some(h2d),
            detail,
        ));
    }
    if let Some(idx) = open(&f.raw, Some(RawSpec { dtype: DType::U8, count: None })).ok().filter(|_| args.wants("raw"))
    {
        let (rate, detail) = time_loads(engine, &idx, device, runs, file_checksum(&idx)?, || warm(&f.raw))?;
        cases.push(Case::new(
            format!("raw {}, warm", units::bytes(args.raw_size)),
            rate,
            "pinned host→device",
            Some(h2d),
            detail,
        ));
    }
    Ok(cases)
}

/// The warm load through cuFile. cuFile may refuse this machine's files (it needs udev attributes of the block
/// device); that is a finding to record, not a reason to lose the rest of the run.
fn gds_case(
    args: &Args,
    index: &TensorIndex,
    device: Device,
    runs: usize,
    sum: u64,
    llama: &Path,
    h2d: f64,
) -> Result<Case> {
    let engine = Engine::new(args.engine.settings()?.backend(Backend::Gds))?;
    let path = engine.gpu_path(match device {
        Device::Cuda(n) => n,
        _ => 0,
    })?;
    let (rate, detail) = time_loads(&engine, index, device, runs, sum, || warm(llama))?;
    Ok(Case::new(format!("llama, warm page cache, {}", path.reason), rate, "pinned host→device", Some(h2d), detail))
}

/// GPU-initiated NVMe against the software controller, beside the pipeline: sequential (the raw file) and 4 KiB
/// random reads (IOPS), every byte of the random reads checked against the file.
#[allow(clippy::too_many_arguments)] // the run's context, passed as is
fn nvme_cases(
    args: &Args,
    engine: &Engine,
    raw_index: &TensorIndex,
    raw: &Path,
    device: Device,
    runs: usize,
    h2d: f64,
    log: &dyn Fn(&str),
) -> Result<Vec<Case>> {
    let nvme = Engine::new(args.engine.settings()?.backend(Backend::NvmeSim))?;
    let sum = file_checksum(raw_index)?;
    let (rate, detail) = time_loads(&nvme, raw_index, device, runs, sum, || warm(raw))?;
    let mut out = vec![Case::new(
        format!("raw {}, warm, GPU-initiated NVMe (software controller)", units::bytes(args.raw_size)),
        rate,
        "pinned host→device",
        Some(h2d),
        detail,
    )];
    let reads: u64 = 20_000;
    let span = args.raw_size / 4096;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let ranges: Vec<weightlift::ByteRange> = (0..reads)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            weightlift::ByteRange::new(0, (x % span) * 4096, 4096, i * 4096)
        })
        .collect();
    let gpu = engine.gpu(match device {
        Device::Cuda(n) => n,
        _ => 0,
    })?;
    gpu.bind()?; // the raw driver calls below need the device's context current on this thread
    let stream = gpu.stream(0)?;
    let mut dest = weightlift::cuda::DeviceBuffer::alloc(&gpu, (reads * 4096) as usize, &stream)?;
    let file = std::fs::read(raw)?;
    for (label, e) in [("io_uring pipeline", engine), ("GPU-initiated NVMe", &nvme)] {
        warm(raw)?;
        let mut iops = Vec::new();
        let mut last = Value::Null;
        for _ in 0..runs {
            let r = e.read_into_buffer(weightlift::Sources::Paths(&[raw.to_path_buf()]), &ranges, &mut dest)?;
            iops.push(reads as f64 / r.seconds);
            last = r.to_json();
        }
        let mut got = vec![0u8; (reads * 4096) as usize];
        dest.read_back(0, &mut got)?;
        for &weightlift::ByteRange { offset: off, len, dest_offset: at, .. } in &ranges {
            if got[at as usize..(at + len) as usize] != file[off as usize..(off + len) as usize] {
                anyhow::bail!("{label}: a 4 KiB read at offset {off} differs from the file");
            }
        }
        let best = iops.iter().copied().fold(0.0, f64::max);
        log(&format!("  4 KiB random reads, {label}: {best:.0} IOPS"));
        let rate = Rate { runs: iops.iter().map(|i| i * 4096.0 / 1e9).collect() };
        out.push(Case::new(
            format!("4 KiB random reads → cuda, {label} ({best:.0} IOPS)"),
            rate,
            "none",
            None,
            json!({"iops_runs": iops, "last": last}),
        ));
    }
    Ok(out)
}

/// A device tensor written to disk (O_DIRECT, fsync), checked against the file it came from.
fn write_case(
    args: &Args,
    engine: &Engine,
    raw_index: &TensorIndex,
    dir: &Path,
    device: Device,
    runs: usize,
    log: &dyn Fn(&str),
) -> Result<Case> {
    let target = dir.join("write-test.bin");
    let ceiling = dd_write_direct(&target, args.raw_size, runs)?;
    log(&format!("  ceiling: dd oflag=direct bs=16M write {:.2} GB/s", ceiling.best()));
    let loaded = engine.load(raw_index, device, &LoadOpts::default())?;
    let data = &loaded.tensors[0].data;
    let mut rates = Vec::new();
    for _ in 0..runs {
        let _ = std::fs::remove_file(&target);
        let t = Instant::now();
        let n = engine.write_tensor(&target, 0, data, true)?;
        rates.push(n as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    let written =
        weightlift::format::open(std::slice::from_ref(&target), Some(RawSpec { dtype: DType::U8, count: None }))?;
    if file_checksum(&written)? != file_checksum(raw_index)? {
        anyhow::bail!("the written file differs from the raw file it came from");
    }
    let _ = std::fs::remove_file(&target);
    Ok(Case::new(
        format!("write {} cuda → disk (O_DIRECT, fsync)", units::bytes(args.raw_size)),
        Rate { runs: rates },
        "dd oflag=direct",
        Some(ceiling.best()),
        json!({"ceiling_runs": ceiling.runs}),
    ))
}

fn describe(path: &Path, index: &TensorIndex) -> Value {
    json!({"path": path, "tensors": index.tensors.len(), "tensor_bytes": index.total_bytes()})
}
