//! `weightlift bench`: measures the machine's ceilings and weightlift's loads in the same run, and prints each load
//! as GB/s and as a fraction of its ceiling (and of the best peer, where peers ran). Figures, not pass/fail: a
//! benchmark is not a test. One module per case family: [`ceilings`] (dd, cache dropping, checksums), [`host`]
//! (loads into host memory), [`gpu`] (loads into device memory, cuFile, GPU-initiated NVMe, writes), [`python`]
//! (the shapes users meet through the Python package, and the peers, in a child Python process).

mod ceilings;
mod gpu;
mod host;
mod python;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use weightlift::format::TensorIndex;
use weightlift::{Device, Engine, LoadOpts};

pub use ceilings::{can_drop_caches, drop_caches, file_checksum, loaded_checksum, warm};

use crate::load::EngineArgs;
use crate::units;

/// Every case the bench knows, the device kind it needs, and what it measures.
pub const CASES: &[(&str, &str, &str)] = &[
    ("cold", "any", "a llama-like checkpoint after dropping the page cache, against 8 parallel `dd iflag=direct`"),
    ("warm", "any", "the same from the page cache (GPU: against the pinned host→device copy; host: against `dd`)"),
    ("tmpfs", "gpu", "the same file on tmpfs, standing in for a fast NVMe array"),
    ("small", "gpu", "20,000 tensors of 4 KiB–1 MiB, warm"),
    ("raw", "gpu", "one raw file, warm"),
    ("gds", "gpu", "the warm load through cuFile, where cuFile opens"),
    ("nvme", "gpu", "GPU-initiated NVMe against the software controller: sequential and 4 KiB random reads"),
    ("write", "gpu", "a device tensor written to disk (O_DIRECT, fsync), against `dd oflag=direct`"),
    (
        "python",
        "any",
        "the Python shapes (safe_open per key, restarts, first loads, CLI, host vs np.fromfile) and peers",
    ),
];

fn case_names() -> Vec<&'static str> {
    CASES.iter().map(|c| c.0).collect()
}

#[derive(clap::Args, Debug)]
#[command(after_help = cases_help())]
pub struct Args {
    /// Checkpoint to load (default: a synthetic llama-style safetensors file of --size, generated once).
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Size of the generated checkpoint (default: 4 GiB onto a GPU, 1 GiB into host memory).
    #[arg(long, value_parser = units::parse_size)]
    pub size: Option<u64>,
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
    /// Number of tensors in the small-tensor checkpoint.
    #[arg(long, default_value_t = 20_000)]
    pub small_tensors: u64,
    /// Size of the raw file.
    #[arg(long, default_value = "1GiB", value_parser = units::parse_size)]
    pub raw_size: u64,
    /// tmpfs directory standing in for a fast NVMe array (the tmpfs case is skipped if missing).
    #[arg(long, default_value = "/dev/shm")]
    pub shm: PathBuf,
    /// The Python script timing the shapes and peers (default: bench/shapes.py next to the binary or in the
    /// working directory).
    #[arg(long)]
    pub peers: Option<PathBuf>,
    /// Run only these cases (comma-separated; see the list below).
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(case_names()))]
    pub cases: Option<Vec<String>>,
}

fn cases_help() -> String {
    let mut s = String::from("Cases:\n");
    for (name, kind, what) in CASES {
        s += &format!("  {name:<7} ({kind}) {what}\n");
    }
    s
}

impl Args {
    /// Whether the case called `name` was asked for.
    pub fn wants(&self, name: &str) -> bool {
        debug_assert!(CASES.iter().any(|c| c.0 == name), "unknown bench case {name}");
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
    pub fn new(name: String, rate: Rate, ceiling: &str, ceiling_gbps: Option<f64>, extra: Value) -> Case {
        Case { name, rate, ceiling: ceiling.to_string(), ceiling_gbps, extra }
    }

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

/// Times `runs` loads of `index` onto `device` (with `before` run ahead of each, untimed), checking the checksum of
/// the last load after timing. Returns the rate and the last report.
pub fn time_loads(
    engine: &Engine,
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
    let (device, why) = args.engine.device()?;
    match device {
        Device::Cuda(n) => gpu::run(args, n),
        _ => host::run(args, device, &why),
    }
}

/// The engine's settings, each with where its value came from.
pub fn settings_json(engine: &Engine) -> Value {
    let rows: Vec<Value> = engine
        .settings()
        .describe()
        .into_iter()
        .map(|(k, v, s)| json!({"name": k, "value": v, "source": s.to_string()}))
        .collect();
    Value::Array(rows)
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
