//! `weightlift bench`: measures the machine's ceilings and weightlift's loads in the same run, and prints each load
//! as GB/s and as a fraction of its ceiling. Figures, not pass/fail: a benchmark is not a test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use weightlift::format::TensorIndex;
use weightlift::{Device, Engine, LoadOpts, Loaded};

use crate::load::{EngineArgs, cache_dir, demo_checkpoint};
use crate::units;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint to load (default: a synthetic llama-style safetensors file of --size, generated once).
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Size of the generated checkpoint.
    #[arg(long, default_value = "1GiB", value_parser = units::parse_size)]
    pub size: u64,
    /// Timed runs per case (best and median are reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Directory for generated files (default: the cache directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Skip cold-cache cases even where caches can be dropped.
    #[arg(long)]
    pub no_cold: bool,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON results to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also draw the results as an SVG bar chart into this file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// GPU bench: number of tensors in the small-tensor checkpoint.
    #[arg(long, default_value_t = 20_000)]
    pub small_tensors: u64,
    /// GPU bench: size of the raw file.
    #[arg(long, default_value = "1GiB", value_parser = units::parse_size)]
    pub raw_size: u64,
    /// GPU bench: tmpfs directory standing in for a fast NVMe array (skipped if missing).
    #[arg(long, default_value = "/dev/shm")]
    pub shm: PathBuf,
    /// GPU bench: the Python script timing the usual loaders (default: bench/peers.py next to the binary or in the
    /// working directory).
    #[arg(long)]
    pub peers: Option<PathBuf>,
    /// GPU bench: do not time the Python loaders.
    #[arg(long)]
    pub no_peers: bool,
    /// GPU bench: run only these cases (comma-separated: cold, warm, tmpfs, small, raw).
    #[arg(long, value_delimiter = ',')]
    pub cases: Option<Vec<String>>,
}

impl Args {
    /// Whether the case called `name` was asked for.
    pub fn wants(&self, name: &str) -> bool {
        self.cases.as_ref().is_none_or(|c| c.iter().any(|w| w == name))
    }
}

/// A measured rate: every run's GB/s, best and median.
#[derive(Clone, Debug)]
pub struct Rate {
    pub runs: Vec<f64>,
}

impl Rate {
    pub fn best(&self) -> f64 {
        self.runs.iter().copied().fold(0.0, f64::max)
    }

    pub fn median(&self) -> f64 {
        let mut v = self.runs.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        match v.len() {
            0 => 0.0,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    pub fn json(&self) -> Value {
        json!({"best": self.best(), "median": self.median(), "runs": self.runs})
    }
}

/// One load case and the ceiling it is held against.
pub struct Case {
    pub name: String,
    pub rate: Rate,
    pub ceiling: String,
    pub ceiling_gbps: Option<f64>,
    pub extra: Value,
}

impl Case {
    pub fn ratio(&self) -> Option<f64> {
        self.ceiling_gbps.filter(|c| *c > 0.0).map(|c| self.rate.best() / c)
    }

    pub fn json(&self) -> Value {
        json!({
            "name": self.name, "gbps": self.rate.best(), "median_gbps": self.rate.median(), "runs_gbps": self.rate.runs,
            "ceiling": self.ceiling, "ceiling_gbps": self.ceiling_gbps, "ratio": self.ratio(), "detail": self.extra,
        })
    }
}

/// Whether this process may drop the page cache (root, writable /proc/sys/vm/drop_caches).
pub fn can_drop_caches() -> bool {
    std::fs::OpenOptions::new().write(true).open("/proc/sys/vm/drop_caches").is_ok()
}

pub fn drop_caches() -> Result<()> {
    Command::new("sync").status().context("sync")?;
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("dropping caches (needs root)")?;
    Ok(())
}

/// Reads a file once so it is in the page cache.
pub fn warm(path: &Path) -> Result<()> {
    dd(path, &[], None)?;
    Ok(())
}

/// Runs `dd if=PATH of=/dev/null bs=16M EXTRA...` and returns (bytes, seconds) as dd reports them.
fn dd(path: &Path, extra: &[String], _label: Option<&str>) -> Result<(u64, f64)> {
    let out = Command::new("dd")
        .arg(format!("if={}", path.display()))
        .arg("of=/dev/null")
        .arg("bs=16M")
        .args(extra)
        .env("LC_ALL", "C")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("running dd")?;
    if !out.status.success() {
        bail!("dd failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    // "1073741824 bytes (1.1 GB, 1.0 GiB) copied, 0.21 s, 5.1 GB/s"
    let line = text.lines().find(|l| l.contains("copied")).context("unexpected dd output")?;
    let bytes: u64 = line.split_whitespace().next().and_then(|w| w.parse().ok()).context("dd byte count")?;
    let secs: f64 = line
        .split(", ")
        .find(|p| p.trim_end().ends_with(" s"))
        .and_then(|p| p.trim().trim_end_matches(" s").parse().ok())
        .context("dd seconds")?;
    Ok((bytes, secs))
}

/// `dd bs=16M` of a file already in the page cache: the warm ceiling.
pub fn warm_dd(path: &Path, runs: usize) -> Result<Rate> {
    warm(path)?;
    let mut r = Vec::new();
    for _ in 0..runs {
        let (b, s) = dd(path, &[], None)?;
        r.push(b as f64 / s / 1e9);
    }
    Ok(Rate { runs: r })
}

/// `streams` parallel `dd iflag=direct` over stripes of the file after dropping caches: the cold ceiling.
pub fn cold_parallel_dd(path: &Path, streams: u64, runs: usize) -> Result<Rate> {
    let len = std::fs::metadata(path)?.len();
    let blocks = len.div_ceil(16 << 20);
    let per = blocks.div_ceil(streams);
    let mut r = Vec::new();
    for _ in 0..runs {
        drop_caches()?;
        let t = Instant::now();
        let children: Vec<_> = (0..streams)
            .filter(|i| i * per < blocks)
            .map(|i| {
                Command::new("dd")
                    .arg(format!("if={}", path.display()))
                    .args(["of=/dev/null", "bs=16M", "iflag=direct"])
                    .arg(format!("skip={}", i * per))
                    .arg(format!("count={per}"))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
            })
            .collect::<std::io::Result<_>>()?;
        for mut c in children {
            if !c.wait()?.success() {
                bail!("dd iflag=direct failed on {}", path.display());
            }
        }
        r.push(len as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    Ok(Rate { runs: r })
}

/// Checksum of every tensor of `index` as the file holds it (plain reads, outside any timing).
pub fn file_checksum(index: &TensorIndex) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let files: Vec<std::fs::File> =
        index.files.iter().map(|f| std::fs::File::open(&f.path)).collect::<std::io::Result<_>>()?;
    let mut acc = 0u64;
    let mut buf = Vec::new();
    for t in &index.tensors {
        buf.resize(t.nbytes as usize, 0);
        files[t.file].read_exact_at(&mut buf, t.offset)?;
        acc = acc.rotate_left(7) ^ weightlift::verify::checksum(&buf);
    }
    Ok(acc)
}

/// The same checksum over loaded tensors (copying device memory back where needed).
pub fn loaded_checksum(loaded: &Loaded) -> Result<u64> {
    let mut acc = 0u64;
    let mut buf = Vec::new();
    for t in &loaded.tensors {
        buf.resize(t.data.len(), 0);
        t.data.read_back(0, &mut buf)?;
        acc = acc.rotate_left(7) ^ weightlift::verify::checksum(&buf);
    }
    Ok(acc)
}

/// Times `runs` loads of `index` onto `device` (with `before` run ahead of each, untimed), checking the checksum of
/// the last load after timing. Returns the rate and the last report.
pub fn time_loads(
    engine: &mut Engine,
    index: &TensorIndex,
    device: Device,
    runs: usize,
    expected: u64,
    mut before: impl FnMut() -> Result<()>,
) -> Result<(Rate, Value)> {
    let mut rates = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        before()?;
        // The previous load's memory is freed first, as an application reloading a model would.
        drop(last.take());
        let loaded = engine.load(index, device, &LoadOpts::default())?;
        rates.push(loaded.report.gbps());
        last = Some(loaded);
    }
    let loaded = last.context("no runs")?;
    let got = loaded_checksum(&loaded)?;
    if got != expected {
        bail!("checksum mismatch after timing: loaded {got:016x}, file {expected:016x}");
    }
    Ok((Rate { runs: rates }, loaded.report.to_json()))
}

pub fn run(args: &Args) -> Result<()> {
    let (device, _) = args.engine.device()?;
    if let Device::Cuda(n) = device {
        return crate::bench_gpu::run(args, n);
    }
    let runs = args.runs.max(1);
    let dir = args.dir.clone().unwrap_or_else(cache_dir);
    let file = match &args.file {
        Some(f) => f.clone(),
        None => demo_checkpoint(&dir, args.size, args.json)?,
    };
    let index = weightlift::format::open(std::slice::from_ref(&file), None)?;
    let (device, why) = args.engine.device()?;
    let config = args.engine.config()?;
    let mut engine = Engine::new(config)?;
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
    let cold_ceiling = if cold {
        let r = cold_parallel_dd(&file, 8, runs)?;
        log(&format!("  ceiling: cold 8 × dd iflag=direct {:.2} GB/s", r.best()));
        ceilings.insert("cold_dd_direct_x8".into(), r.json());
        Some(r)
    } else {
        log("  cold cases skipped: dropping the page cache needs root (or --no-cold was given)");
        None
    };

    let mut cases = Vec::new();
    let (rate, detail) = time_loads(&mut engine, &index, device, runs, expected, || warm(&file))?;
    cases.push(Case {
        name: format!("warm page cache → {device}"),
        rate,
        ceiling: "warm dd bs=16M".into(),
        ceiling_gbps: Some(warm_ceiling.best()),
        extra: detail,
    });
    if let Some(c) = &cold_ceiling {
        let (rate, detail) = time_loads(&mut engine, &index, device, runs, expected, drop_caches)?;
        cases.push(Case {
            name: format!("cold disk → {device}"),
            rate,
            ceiling: "8 × dd iflag=direct".into(),
            ceiling_gbps: Some(c.best()),
            extra: detail,
        });
    }

    let result = json!({
        "device": device.to_string(),
        "device_reason": why,
        "host": host_json(),
        "file": file, "file_bytes": std::fs::metadata(&file)?.len(), "tensor_bytes": index.total_bytes(),
        "tensors": index.tensors.len(), "runs": runs,
        "ceilings": ceilings,
        "cases": cases.iter().map(Case::json).collect::<Vec<_>>(),
    });
    finish(args, &result, &cases)
}

/// Writes the JSON (and SVG) outputs and prints the table or the JSON.
pub fn finish(args: &Args, result: &Value, cases: &[Case]) -> Result<()> {
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(result)?)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    if let Some(svg) = &args.svg {
        let title = format!("weightlift bench → {}", result["device"].as_str().unwrap_or("?"));
        std::fs::write(svg, crate::plot::svg(&title, cases)).with_context(|| format!("writing {}", svg.display()))?;
    }
    if args.json {
        println!("{result}");
    } else {
        print_table(cases);
    }
    Ok(())
}

pub fn print_table(cases: &[Case]) {
    let width = cases.iter().map(|c| c.name.chars().count()).max().unwrap_or(10).max(10);
    println!("{:<width$} {:>9} {:>9} {:>10}  ceiling", "case", "best GB/s", "median", "× ceiling");
    for c in cases {
        let ratio = c.ratio().map_or("-".to_string(), |r| format!("{r:.3}"));
        let ceiling = c.ceiling_gbps.map_or("-".to_string(), |g| format!("{g:.2} GB/s"));
        let (best, median) = (c.rate.best(), c.rate.median());
        println!("{:<width$} {best:>9.2} {median:>9.2} {ratio:>10}  {} ({ceiling})", c.name, c.ceiling);
    }
}

pub fn host_json() -> Value {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().next().map(|l| l.split_whitespace().nth(1).unwrap_or("0").parse::<u64>().unwrap_or(0) * 1024)
        })
        .unwrap_or(0);
    json!({"cpus": cpus, "cpu_model": cpu_model, "kernel": kernel.trim(), "mem_bytes": mem, "io_uring": weightlift::io::uring_available().err().unwrap_or_else(|| "available".into())})
}
