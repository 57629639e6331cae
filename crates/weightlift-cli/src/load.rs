//! `weightlift load`: load every tensor of a checkpoint and report what happened and how fast.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use weightlift::format::synth;
use weightlift::format::{DType, RawSpec, TensorIndex};
use weightlift::io::{Backend, DirectMode};
use weightlift::{Config, Device, Engine, LoadOpts};

use crate::inspect::parse_dtype;
use crate::units;

/// Settings shared by `load` and `bench`; each overrides its `WEIGHTLIFT_*` variable.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// Where tensors go: auto (cuda:0 if a GPU is usable, else cpu), cpu, cuda, cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Largest single read and staging slot size [env: WEIGHTLIFT_CHUNK_BYTES].
    #[arg(long, value_parser = units::parse_size)]
    pub chunk_bytes: Option<u64>,
    /// Reads in flight per I/O thread [env: WEIGHTLIFT_QUEUE_DEPTH].
    #[arg(long)]
    pub queue_depth: Option<u32>,
    /// Bound on staging memory [env: WEIGHTLIFT_STAGING_BYTES].
    #[arg(long, value_parser = units::parse_size)]
    pub staging_bytes: Option<u64>,
    /// I/O threads [env: WEIGHTLIFT_THREADS].
    #[arg(long)]
    pub threads: Option<u32>,
    /// O_DIRECT policy: auto, always, never [env: WEIGHTLIFT_DIRECT].
    #[arg(long, value_parser = parse_direct)]
    pub direct: Option<DirectMode>,
    /// Read engine: auto, uring, pread, gds, nvme-sim [env: WEIGHTLIFT_IO].
    #[arg(long = "io", visible_alias = "backend", value_parser = parse_backend)]
    pub backend: Option<Backend>,
}

fn parse_direct(s: &str) -> Result<DirectMode, String> {
    s.parse()
}

fn parse_backend(s: &str) -> Result<Backend, String> {
    s.parse()
}

impl EngineArgs {
    pub fn config(&self) -> Result<Config> {
        let mut c = Config::from_env()?;
        let mut io = c.io;
        if let Some(v) = self.chunk_bytes {
            io = io.chunk_bytes(v);
        }
        if let Some(v) = self.queue_depth {
            io = io.queue_depth(v);
        }
        if let Some(v) = self.staging_bytes {
            io = io.staging_bytes(v);
        }
        if let Some(v) = self.threads {
            io = io.threads(v);
        }
        if let Some(v) = self.direct {
            io = io.direct(v);
        }
        if let Some(v) = self.backend {
            io = io.backend(v);
        }
        io.validate()?;
        c.io = io;
        Ok(c)
    }

    /// The device to load onto, and why.
    pub fn device(&self) -> Result<(Device, String)> {
        if self.device.eq_ignore_ascii_case("auto") {
            return Ok(match weightlift_cuda::available() {
                Ok(d) => (Device::Cuda(0), format!("auto: {} CUDA device(s) found, using cuda:0", d.devices)),
                Err(why) => (Device::Cpu, format!("auto: no usable GPU ({why}); loading into host memory")),
            });
        }
        let d: Device = self.device.parse().map_err(anyhow::Error::msg)?;
        Ok((d, format!("{d} requested")))
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint files (safetensors, shard index, GGUF, or raw with --raw). Without any, a synthetic llama-style
    /// checkpoint is generated once in the cache directory and loaded.
    pub paths: Vec<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Compare every loaded byte with a second, plain read of the files.
    #[arg(long)]
    pub verify: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Read the files as raw tensors of this dtype.
    #[arg(long, value_name = "DTYPE", value_parser = parse_dtype)]
    pub raw: Option<DType>,
    /// With --raw: elements to take from each file (default: all).
    #[arg(long, requires = "raw")]
    pub count: Option<u64>,
    /// Size of the synthetic checkpoint generated when no path is given.
    #[arg(long, default_value = "1GiB", value_parser = units::parse_size)]
    pub demo_size: u64,
    /// For GPU loads: skip measuring the pinned host→device copy ceiling after the load.
    #[arg(long)]
    pub no_ceiling: bool,
}

/// The cache directory for generated checkpoints: `$WEIGHTLIFT_CACHE`, else `$XDG_CACHE_HOME/weightlift`, else
/// `~/.cache/weightlift`, else the temporary directory.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("WEIGHTLIFT_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("weightlift");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache").join("weightlift");
    }
    std::env::temp_dir().join("weightlift")
}

/// A synthetic llama-style safetensors checkpoint of `size` bytes in `dir`, generated unless already there.
pub fn demo_checkpoint(dir: &std::path::Path, size: u64, quiet: bool) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(format!("synthetic-llama-{size}-bytes.safetensors"));
    if !path.exists() {
        let t = Instant::now();
        let spec = synth::Spec {
            layout: synth::Layout::Llama,
            container: synth::Container::Safetensors,
            size,
            seed: 0,
            align: None,
        };
        let s = synth::generate(&path, &spec)?;
        if !quiet {
            eprintln!(
                "no checkpoint given: generated a synthetic llama-style checkpoint ({} tensors, {}) at {} in {:.1} s",
                s.tensors,
                units::bytes(s.tensor_bytes),
                path.display(),
                t.elapsed().as_secs_f64()
            );
        }
    } else if !quiet {
        eprintln!("no checkpoint given: loading the synthetic checkpoint {}", path.display());
    }
    Ok(path)
}

pub fn run(args: &Args) -> Result<()> {
    let paths = if args.paths.is_empty() {
        vec![demo_checkpoint(&cache_dir(), args.demo_size, args.json)?]
    } else {
        args.paths.clone()
    };
    let raw = args.raw.map(|dtype| RawSpec { dtype, count: args.count });
    let index = weightlift::format::open(&paths, raw)?;
    let (device, why) = args.engine.device()?;
    let mut engine = Engine::new(args.engine.config()?)?;
    let mut loaded = with_progress(index.total_bytes(), |progress| {
        engine.load(&index, device, &LoadOpts { progress: Some(progress), ..LoadOpts::default() })
    })?;
    if args.verify {
        verify(&index, &loaded)?;
        loaded.report.verified = Some(true);
    }
    if let (Device::Cuda(n), false) = (device, args.no_ceiling) {
        let gpu = engine.gpu(n)?;
        let rates = weightlift_cuda::pinned_h2d_gbps(&gpu, 256 << 20, 3)?;
        loaded.report.ceiling_gbps = Some(rates.iter().copied().fold(0.0, f64::max));
    }
    if args.json {
        let mut v = loaded.report.to_json();
        v["device_reason"] = why.into();
        println!("{v}");
    } else {
        println!("{}", loaded.report.summary());
        println!("  device: {why}");
    }
    Ok(())
}

pub fn verify(index: &TensorIndex, loaded: &weightlift::Loaded) -> Result<()> {
    weightlift::verify::compare_with_file(index, |i, off, out| loaded.tensors[i].data.read_back(off, out))?;
    Ok(())
}

/// Runs `f` with a byte counter; on a terminal, shows a progress bar once the work has taken a second.
pub fn with_progress<T>(total: u64, f: impl FnOnce(&AtomicU64) -> T) -> T {
    let progress = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        if std::io::stderr().is_terminal() {
            s.spawn(|| {
                let start = Instant::now();
                let mut bar: Option<indicatif::ProgressBar> = None;
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                    if bar.is_none() && start.elapsed() >= Duration::from_secs(1) {
                        let b = indicatif::ProgressBar::new(total);
                        if let Ok(style) = indicatif::ProgressStyle::with_template(
                            "{spinner} {bytes}/{total_bytes} [{bar:40}] {binary_bytes_per_sec} eta {eta}",
                        ) {
                            b.set_style(style.progress_chars("=> "));
                        }
                        bar = Some(b);
                    }
                    if let Some(b) = &bar {
                        b.set_position(progress.load(Ordering::Relaxed).min(total));
                    }
                }
                if let Some(b) = bar {
                    b.finish_and_clear();
                }
            });
        }
        let out = f(&progress);
        done.store(true, Ordering::Relaxed);
        out
    })
}
