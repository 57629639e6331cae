//! `weightlift bench --device cuda:N`: in one run, the pinned host→device ceiling and the cold disk ceiling, then
//! weightlift's loads (a llama-like checkpoint from cold disk, page cache and tmpfs; many small tensors; a raw file)
//! and, where the machine's Python has them, the loaders users run today on the same files.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use weightlift::format::{DType, RawSpec, TensorIndex, synth};
use weightlift::{Device, Engine, LoadOpts};

use crate::bench::{
    Args, Case, Rate, can_drop_caches, cold_parallel_dd, drop_caches, file_checksum, finish, host_json, time_loads,
    warm, warm_dd,
};
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

fn peers_script(args: &Args) -> Option<PathBuf> {
    if let Some(p) = &args.peers {
        return Some(p.clone());
    }
    let exe = std::env::current_exe().ok()?;
    let candidates = [
        exe.parent()?.join("../bench/peers.py"),
        exe.parent()?.join("bench/peers.py"),
        PathBuf::from("bench/peers.py"),
    ];
    candidates.into_iter().find(|p| p.exists())
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
    let size = if args.size == 1 << 30 { 4 << 30 } else { args.size };
    let llama = args.file.clone().unwrap_or_else(|| dir.join(format!("llama-{size}.safetensors")));
    let small = dir.join(format!("small-{}.safetensors", args.small_tensors));
    let raw = dir.join(format!("raw-{}.bin", args.raw_size));
    let make = |layout, container, size, path: &Path| {
        ensure(path, synth::Spec { layout, container, size, seed: 7, align: None }, &log)
    };
    if args.file.is_none() {
        make(synth::Layout::Llama, synth::Container::Safetensors, size, &llama)?;
    }
    make(synth::Layout::ManySmall { tensors: Some(args.small_tensors) }, synth::Container::Safetensors, 0, &small)?;
    make(synth::Layout::SingleHuge, synth::Container::Raw, args.raw_size, &raw)?;
    let shm_llama = if args.shm.is_dir() {
        let d = args.shm.join("weightlift-bench");
        std::fs::create_dir_all(&d)?;
        let p = d.join(llama.file_name().unwrap_or_default());
        if std::fs::metadata(&p).map(|m| m.len()).ok() != std::fs::metadata(&llama).map(|m| m.len()).ok() {
            std::fs::copy(&llama, &p).with_context(|| format!("copying the checkpoint to {}", p.display()))?;
        }
        Some(p)
    } else {
        log(&format!("  tmpfs case skipped: {} is not a directory", args.shm.display()));
        None
    };

    let mut engine = Engine::new(args.engine.config()?)?;
    let gpu = engine.gpu(ordinal)?;
    let info = gpu.info().clone();
    log(&format!(
        "bench → {device}: {} ({}), PCIe {}",
        info.name,
        info.pci_bus_id,
        info.pcie_link.as_deref().unwrap_or("?")
    ));

    // Ceilings, measured now.
    let mut ceilings = serde_json::Map::new();
    let h2d = Rate { runs: weightlift_cuda::pinned_h2d_gbps(&gpu, 1 << 30, 5)? };
    log(&format!("  ceiling: pinned host→device copy {:.2} GB/s (1 GiB, best of 5)", h2d.best()));
    ceilings.insert("pinned_h2d".into(), h2d.json());
    // The copy pattern of a load (many chunks over several streams), without reads: what the DMA side allows.
    let mut patterns = Vec::new();
    for chunk_mib in [1usize, 2, 4, 8] {
        for streams in [1usize, 4, 16] {
            let gbps = weightlift_cuda::chunked_h2d_gbps(&gpu, 1 << 30, chunk_mib << 20, streams, 3)?;
            patterns.push(json!({"chunk_bytes": chunk_mib << 20, "streams": streams, "gbps": gbps}));
        }
    }
    log(&format!("  copy patterns (1 GiB in chunks over streams): {}", Value::Array(patterns.clone())));
    ceilings.insert("chunked_h2d".into(), Value::Array(patterns));
    let warm_ceiling = warm_dd(&llama, runs)?;
    ceilings.insert("warm_dd_bs16M".into(), warm_ceiling.json());
    let cold = !args.no_cold && can_drop_caches();
    let cold_ceiling = if cold {
        let r = cold_parallel_dd(&llama, 8, runs)?;
        log(&format!("  ceiling: cold disk, 8 × dd iflag=direct {:.2} GB/s", r.best()));
        ceilings.insert("cold_dd_direct_x8".into(), r.json());
        Some(r)
    } else {
        log("  cold cases skipped: dropping the page cache needs root (or --no-cold was given)");
        None
    };

    let open = |p: &Path, raw: Option<RawSpec>| weightlift::format::open(&[p.to_path_buf()], raw);
    let llama_index = open(&llama, None)?;
    let small_index = open(&small, None)?;
    let raw_index = open(&raw, Some(RawSpec { dtype: DType::U8, count: None }))?;
    let sums = [file_checksum(&llama_index)?, file_checksum(&small_index)?, file_checksum(&raw_index)?];

    // Set-up cost of the engine once the CUDA context exists: the first load's allocation, planning, staging
    // (mmap + cuMemHostRegister) and ring set-up.
    warm(&llama)?;
    let first = engine.load(&llama_index, device, &LoadOpts::default())?;
    let setup = json!({
        "alloc_secs": first.report.alloc_secs, "plan_secs": first.report.io.plan_secs, "staging_and_rings_secs": first.report.io.setup_secs,
        "total_secs": first.report.alloc_secs + first.report.io.plan_secs + first.report.io.setup_secs,
        "peak_staging_bytes": first.report.io.peak_staging_bytes,
    });
    drop(first);
    log(&format!("  engine set-up on the first load: {}", setup));

    let mut cases: Vec<Case> = Vec::new();
    let mut add = |name: String, rate: Rate, ceiling: &str, ceiling_gbps: Option<f64>, extra: Value| {
        log(&format!("  {name}: best {:.2} GB/s", rate.best()));
        cases.push(Case { name, rate, ceiling: ceiling.into(), ceiling_gbps, extra });
    };
    let h2d_best = Some(h2d.best());
    if let Some(c) = cold_ceiling.as_ref().filter(|_| args.wants("cold")) {
        let (rate, detail) = time_loads(&mut engine, &llama_index, device, runs, sums[0], drop_caches)?;
        add("llama, cold disk".into(), rate, "8 × dd iflag=direct", Some(c.best()), detail);
    }
    if args.wants("warm") {
        let (rate, detail) = time_loads(&mut engine, &llama_index, device, runs, sums[0], || warm(&llama))?;
        add("llama, warm page cache".into(), rate, "pinned host→device", h2d_best, detail);
    }
    if let Some(p) = shm_llama.as_ref().filter(|_| args.wants("tmpfs")) {
        let idx = open(p, None)?;
        let (rate, detail) = time_loads(&mut engine, &idx, device, runs, sums[0], || Ok(()))?;
        add("llama, tmpfs".into(), rate, "pinned host→device", h2d_best, detail);
    }
    if args.wants("small") {
        let (rate, detail) = time_loads(&mut engine, &small_index, device, runs, sums[1], || warm(&small))?;
        add(format!("{} small tensors, warm", args.small_tensors), rate, "pinned host→device", h2d_best, detail);
    }
    if args.wants("raw") {
        let (rate, detail) = time_loads(&mut engine, &raw_index, device, runs, sums[2], || warm(&raw))?;
        add(format!("raw {}, warm", units::bytes(args.raw_size)), rate, "pinned host→device", h2d_best, detail);
    }

    // cuFile on this machine: its load rate beside the pipeline's, which is what `auto` weighs.
    let gds = weightlift_cuda::cufile::driver();
    if args.wants("gds") {
        match &gds {
            Ok(cf) => {
                let config = args.engine.config()?;
                let mut gds_engine =
                    Engine::new(weightlift::Config { io: config.io.backend(weightlift::io::Backend::Gds) })?;
                let mode = if cf.is_peer_to_peer() { "peer-to-peer" } else { "compat mode" };
                // cuFile may refuse this machine's files (it needs udev attributes of the block device); that is a
                // finding to record, not a reason to lose the rest of the run.
                match time_loads(&mut gds_engine, &llama_index, device, runs, sums[0], || warm(&llama)) {
                    Ok((rate, detail)) => add(
                        format!("llama, warm page cache, cuFile ({mode})"),
                        rate,
                        "pinned host→device",
                        h2d_best,
                        detail,
                    ),
                    Err(e) => {
                        log(&format!("  cuFile case failed: {e:#}"));
                        ceilings.insert("cufile_case_error".into(), json!(format!("{e:#}")));
                    }
                }
            }
            Err(e) => log(&format!("  cuFile case skipped: {e}")),
        }
    }
    if args.wants("nvme") {
        // GPU-initiated NVMe against the software controller, beside the io_uring pipeline: sequential (the raw
        // file) and 4 KiB random reads (IOPS).
        let config = args.engine.config()?;
        let mut nvme =
            Engine::new(weightlift::Config { io: config.io.clone().backend(weightlift::io::Backend::NvmeSim) })?;
        let (rate, detail) = time_loads(&mut nvme, &raw_index, device, runs, sums[2], || warm(&raw))?;
        add(
            format!("raw {}, warm, GPU-initiated NVMe (software controller)", units::bytes(args.raw_size)),
            rate,
            "pinned host→device",
            h2d_best,
            detail,
        );
        let reads: u64 = 20_000;
        let span = args.raw_size / 4096;
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let ranges: Vec<(usize, u64, u64, u64)> = (0..reads)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (0, (x % span) * 4096, 4096, i * 4096)
            })
            .collect();
        let stream = gpu.stream(0)?;
        let mut dest = weightlift_cuda::DeviceBuffer::alloc(&gpu, (reads * 4096) as usize, &stream)?;
        for (label, engine) in [("io_uring pipeline", &mut engine), ("GPU-initiated NVMe", &mut nvme)] {
            warm(&raw)?;
            let mut iops = Vec::new();
            let mut last = Value::Null;
            for _ in 0..runs {
                let r = engine.read_ranges_into(std::slice::from_ref(&raw), &ranges, &mut dest)?;
                iops.push(reads as f64 / r.seconds);
                last = r.to_json();
            }
            // Every byte of the last run, against the file.
            let file = std::fs::read(&raw)?;
            let mut got = vec![0u8; (reads * 4096) as usize];
            dest.read_back(0, &mut got)?;
            for &(_, off, len, at) in &ranges {
                if got[at as usize..(at + len) as usize] != file[off as usize..(off + len) as usize] {
                    anyhow::bail!("{label}: a 4 KiB read at offset {off} differs from the file");
                }
            }
            let best = iops.iter().copied().fold(0.0, f64::max);
            log(&format!("  4 KiB random reads, {label}: {best:.0} IOPS"));
            let rate = Rate { runs: iops.iter().map(|i| i * 4096.0 / 1e9).collect() };
            add(
                format!("4 KiB random reads → cuda, {label} ({best:.0} IOPS)"),
                rate,
                "none",
                None,
                json!({"iops_runs": iops, "last": last}),
            );
        }
    }
    if args.wants("write") {
        let target = dir.join("write-test.bin");
        let ceiling = dd_write_direct(&target, args.raw_size, runs)?;
        log(&format!("  ceiling: dd oflag=direct bs=16M write {:.2} GB/s", ceiling.best()));
        ceilings.insert("dd_write_direct".into(), ceiling.json());
        let loaded = engine.load(&raw_index, device, &LoadOpts::default())?;
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
        if file_checksum(&written)? != sums[2] {
            anyhow::bail!("the written file differs from the raw file it came from");
        }
        add(
            format!("write {} cuda → disk (O_DIRECT, fsync)", units::bytes(args.raw_size)),
            Rate { runs: rates },
            "dd oflag=direct",
            Some(ceiling.best()),
            json!({}),
        );
        let _ = std::fs::remove_file(&target);
    }

    let peers = if args.no_peers {
        json!({"skipped": "--no-peers"})
    } else {
        run_peers(args, &llama, shm_llama.as_deref(), device, runs, &log)
    };
    if let Some(results) = peers["results"].as_array() {
        for r in results {
            let case = r["case"].as_str().unwrap_or("?");
            let rate = Rate {
                runs: r["runs_gbps"]
                    .as_array()
                    .map(|v| v.iter().filter_map(Value::as_f64).collect())
                    .unwrap_or_default(),
            };
            let (ceiling, gbps) = match case {
                "cold" => ("8 × dd iflag=direct", cold_ceiling.as_ref().map(Rate::best)),
                _ => ("pinned host→device", h2d_best),
            };
            let case_name = if case == "cold" {
                "cold disk"
            } else if case == "warm" {
                "warm page cache"
            } else {
                case
            };
            add(
                format!("peer: {}, llama, {case_name}", r["method"].as_str().unwrap_or("?")),
                rate,
                ceiling,
                gbps,
                json!({"peer": true}),
            );
        }
    }

    let result = json!({
        "device": device.to_string(),
        "gpu": {"name": info.name, "pci_bus_id": info.pci_bus_id, "pcie_link": info.pcie_link, "total_bytes": info.total_bytes,
                "compute_capability": [info.compute_capability.0, info.compute_capability.1], "driver_version": info.driver_version},
        "host": host_json(),
        "files": {"llama": describe(&llama, &llama_index), "small": describe(&small, &small_index), "raw": describe(&raw, &raw_index),
                  "llama_tmpfs": shm_llama},
        "runs": runs,
        "settings": args.engine.config()?.io.describe().iter().map(|(k, v, s)| json!({"name": k, "value": v, "source": s.to_string()})).collect::<Vec<_>>(),
        "ceilings": ceilings,
        "engine_setup": setup,
        "cufile": weightlift::cufile_status(),
        "gpu_path_auto": match &gds {
            Ok(c) if c.is_peer_to_peer() => "cuFile (peer-to-peer)".to_string(),
            Ok(c) => format!("io_uring pipeline: cuFile runs in compat mode ({:?})", c.mode),
            Err(e) => format!("io_uring pipeline: no cuFile ({e})"),
        },
        "cases": cases.iter().map(Case::json).collect::<Vec<_>>(),
        "peers": peers,
    });
    finish(args, &result, &cases)
}

/// `dd if=/dev/zero of=PATH bs=16M count=… oflag=direct`: the disk's direct write rate.
fn dd_write_direct(path: &Path, bytes: u64, runs: usize) -> Result<Rate> {
    let count = bytes.div_ceil(16 << 20);
    let mut r = Vec::new();
    for _ in 0..runs {
        let _ = std::fs::remove_file(path);
        let t = Instant::now();
        let ok = Command::new("dd")
            .args(["if=/dev/zero", "bs=16M", "oflag=direct"])
            .arg(format!("of={}", path.display()))
            .arg(format!("count={count}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()?
            .success();
        if !ok {
            anyhow::bail!("dd oflag=direct failed on {}", path.display());
        }
        r.push((count << 24) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    let _ = std::fs::remove_file(path);
    Ok(Rate { runs: r })
}

fn describe(path: &Path, index: &TensorIndex) -> Value {
    json!({"path": path, "tensors": index.tensors.len(), "tensor_bytes": index.total_bytes()})
}

fn run_peers(args: &Args, llama: &Path, shm: Option<&Path>, device: Device, runs: usize, log: &dyn Fn(&str)) -> Value {
    let Some(script) = peers_script(args) else {
        return json!({"skipped": "bench/peers.py not found"});
    };
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut cmd = Command::new(&python);
    cmd.arg(&script)
        .arg("--file")
        .arg(llama)
        .arg("--device")
        .arg(device.to_string())
        .arg("--runs")
        .arg(runs.to_string());
    if let Some(s) = shm {
        cmd.arg("--shm-file").arg(s);
    }
    if args.no_cold || !can_drop_caches() {
        cmd.arg("--cases").arg("warm,tmpfs");
    }
    log(&format!("  timing the usual loaders with {} {}", python, script.display()));
    match cmd.output() {
        Ok(out) if out.status.success() => serde_json::from_slice(&out.stdout).unwrap_or_else(
            |e| json!({"skipped": format!("unreadable output: {e}"), "stderr": String::from_utf8_lossy(&out.stderr)}),
        ),
        Ok(out) => {
            json!({"skipped": format!("exit status {}", out.status), "stderr": String::from_utf8_lossy(&out.stderr)})
        }
        Err(e) => json!({"skipped": format!("cannot run {python}: {e}")}),
    }
}
