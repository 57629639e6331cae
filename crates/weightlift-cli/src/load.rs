//! `weightlift load`: load every tensor of a checkpoint and report what happened and how fast.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use weightlift::format::synth;
use weightlift::format::{DType, RawSpec, TensorIndex};
use weightlift::settings::SETTINGS;
use weightlift::{Device, Engine, LoadOpts, Overrides, Settings};

use crate::inspect::parse_dtype;
use crate::units;

/// Every engine setting as a flag (`--chunk-bytes 8MiB`, `--backend pread`), generated from the settings table:
/// name, help, accepted values and default come from `weightlift::settings::SETTINGS`, and the values go to the
/// engine as overrides (parsed and checked there, once).
#[derive(Debug, Clone, Default)]
pub struct SettingArgs(pub Overrides);

fn flag(name: &str) -> String {
    name.replace('_', "-")
}

impl clap::FromArgMatches for SettingArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut o = Overrides::new();
        for doc in SETTINGS {
            if let Some(v) = m.get_one::<String>(doc.name) {
                o.set(doc.name, v.clone());
            }
        }
        Ok(SettingArgs(o))
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for SettingArgs {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for doc in SETTINGS {
            let mut arg = clap::Arg::new(doc.name)
                .long(flag(doc.name))
                .value_name(if doc.values.is_empty() { "VALUE" } else { "MODE" })
                .help(format!("{} [env: {}] [default: {}]", doc.meaning, doc.env, doc.default))
                .help_heading("Engine settings");
            if !doc.values.is_empty() {
                arg = arg.value_parser(clap::builder::PossibleValuesParser::new(doc.values.iter().copied()));
            }
            cmd = cmd.arg(arg);
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// Where tensors go, and the engine settings; shared by `load` and `bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// Where tensors go: auto (cuda:0 if a GPU is usable, else cpu), cpu, cpu:pinned, cuda, cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    #[command(flatten)]
    pub settings: SettingArgs,
}

impl EngineArgs {
    /// Defaults, then `WEIGHTLIFT_*` variables, then the flags given.
    pub fn settings(&self) -> Result<Settings> {
        Ok(Settings::resolve(&self.settings.0)?)
    }

    /// The device to load onto, and why.
    pub fn device(&self) -> Result<(Device, String)> {
        if self.device.eq_ignore_ascii_case("auto") {
            return Ok(match weightlift::cuda::available() {
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
    /// Checkpoint files (safetensors, shard index, GGUF, a packed checkpoint made by `weightlift pack`, or raw with
    /// --raw). Without any, a synthetic llama-style checkpoint is generated once in the cache directory and loaded.
    pub paths: Vec<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Compare every loaded byte with a second, plain read of the files.
    #[arg(long)]
    pub verify: bool,
    /// Check every tensor against the checksum manifest beside its file (`<file>.xxh3.json`, written by
    /// `weightlift checksum`) as it lands, overlapped with the rest of the load: a mismatch fails the load naming
    /// tensor and chunk. (A packed checkpoint's chunks are always checked.)
    #[arg(long)]
    pub checksums: bool,
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
    /// A transformers model folder (config.json with model.safetensors or model.safetensors.index.json): report the
    /// architecture (from config.json), the parameter count (elements of the tensors in the safetensors headers)
    /// and the time until every weight is loaded on the device. "Ready" here means the weights are in device
    /// memory; the Python model object around them is built by weightlift.transformers.from_pretrained, which
    /// adds transformers' model construction (the CLI cannot build a Python model).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["paths", "raw"])]
    pub model: Option<PathBuf>,
    /// For a packed checkpoint: `auto` (the GPU for device loads where NVRTC loads, and nvCOMP for packs of its
    /// codecs; else the CPU), `gpu` or `cpu`.
    #[arg(long, default_value = "auto", value_parser = parse_decoder)]
    pub decoder: weightlift::Decoder,
}

fn parse_decoder(s: &str) -> std::result::Result<weightlift::Decoder, String> {
    weightlift::Decoder::parse(s).map_err(|e| e.to_string())
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

/// `weightlift load` of checkpoint files (a model folder, `--model`, is `model::run`'s).
pub fn run(args: &Args) -> Result<()> {
    let paths = if args.paths.is_empty() {
        vec![demo_checkpoint(&cache_dir(), args.demo_size, args.json)?]
    } else {
        args.paths.clone()
    };
    if let ([path], None) = (paths.as_slice(), args.raw)
        && weightlift::is_pack_file(path)
    {
        return run_pack(path, args);
    }
    let raw = args.raw.map(|dtype| RawSpec { dtype, count: args.count });
    let mut costs = OneShot::default();
    let start = Instant::now();
    let index = costs.time(|c| &mut c.parse_secs, || weightlift::format::open(&paths, raw))?;
    let (device, why) = costs.time(|c| &mut c.device_probe_secs, || args.engine.device())?;
    let settings = args.engine.settings()?;
    let engine = costs.time(|c| &mut c.engine_start_secs, || Engine::new(settings))?;
    if let Device::Cuda(n) = device {
        let t = Instant::now();
        engine.gpu(n)?;
        costs.cuda_context_secs = Some(t.elapsed().as_secs_f64());
    }
    let checks = manifest_checks(&index, args.checksums)?;
    let interrupt = Interrupt::watch()?;
    let loaded = with_progress(index.total_bytes(), |progress| {
        let opts = LoadOpts {
            progress: Some(progress),
            cancel: Some(interrupt.flag()),
            checks: checks.as_ref(),
            ..LoadOpts::default()
        };
        engine.load(&index, device, &opts)
    });
    let mut loaded = interrupt.outcome(loaded)?;
    costs.load_secs = loaded.report.seconds;
    costs.command_secs = start.elapsed().as_secs_f64();
    if args.verify {
        verify(&index, &loaded)?;
        loaded.report.verified = Some(true);
    }
    loaded.report.ceiling_gbps = ceiling(&engine, device, args.no_ceiling)?;
    if args.json {
        let mut v = loaded.report.to_json();
        v["device_reason"] = why.into();
        v["one_shot"] = costs.json();
        println!("{v}");
    } else {
        println!("{}", loaded.report.summary());
        println!("  device: {why}");
        println!("  {}", costs.line());
    }
    Ok(())
}

/// With `--checksums`: the expected checksums of every tensor of `index`, from its files' manifests.
pub fn manifest_checks(index: &TensorIndex, wanted: bool) -> Result<Option<weightlift::Checks>> {
    if !wanted {
        return Ok(None);
    }
    let all: Vec<usize> = (0..index.tensors.len()).collect();
    Ok(Some(weightlift::Checks::from_manifests(index, &all)?))
}

/// For GPU loads (unless `--no-ceiling`): the pinned host→device copy rate of this machine (GB/s, best of 3).
fn ceiling(engine: &Engine, device: Device, skip: bool) -> Result<Option<f64>> {
    let Device::Cuda(n) = device else { return Ok(None) };
    if skip {
        return Ok(None);
    }
    let rates = weightlift::cuda::pinned_h2d_gbps(&engine.gpu(n)?, 256 << 20, 3)?;
    Ok(Some(rates.iter().copied().fold(0.0, f64::max)))
}

/// `load` of a packed checkpoint: its chunks stream through the engine and are decoded (every chunk's checksum
/// checked, so `--verify` has nothing to add but is accepted).
fn run_pack(path: &std::path::Path, args: &Args) -> Result<()> {
    let start = Instant::now();
    let index = weightlift::format::wlpack::read(path)?;
    let (device, why) = args.engine.device()?;
    let engine = Engine::new(args.engine.settings()?)?;
    let interrupt = Interrupt::watch()?;
    let raw: u64 = index.tensors().map(|t| t.nbytes).sum();
    let loaded = with_progress(raw, |progress| {
        let opts = LoadOpts { progress: Some(progress), cancel: Some(interrupt.flag()), ..LoadOpts::default() };
        engine.load_pack(path, None, device, args.decoder, &opts)
    });
    let mut loaded = interrupt.outcome(loaded)?;
    loaded.report.ceiling_gbps = ceiling(&engine, device, args.no_ceiling)?;
    let command_secs = start.elapsed().as_secs_f64();
    if args.json {
        let mut v = loaded.report.to_json();
        v["device_reason"] = why.into();
        v["command_secs"] = command_secs.into();
        println!("{v}");
    } else {
        println!("{}", loaded.report.summary());
        println!("  device: {why}");
        println!("  command: {command_secs:.3} s in all");
    }
    Ok(())
}

/// What a one-shot `weightlift load` spends besides the load itself (before any verification or ceiling
/// measurement): parsing the headers, probing the device, starting the engine, creating the CUDA context.
#[derive(Default)]
struct OneShot {
    parse_secs: f64,
    device_probe_secs: f64,
    engine_start_secs: f64,
    cuda_context_secs: Option<f64>,
    load_secs: f64,
    command_secs: f64,
}

impl OneShot {
    /// Runs `f`, adding its time to the field `field` picks.
    fn time<T, E>(
        &mut self,
        field: impl FnOnce(&mut OneShot) -> &mut f64,
        f: impl FnOnce() -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let t = Instant::now();
        let r = f();
        *field(self) += t.elapsed().as_secs_f64();
        r
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "parse_secs": self.parse_secs, "device_probe_secs": self.device_probe_secs,
            "engine_start_secs": self.engine_start_secs, "cuda_context_secs": self.cuda_context_secs,
            "load_secs": self.load_secs, "command_secs": self.command_secs,
        })
    }

    fn line(&self) -> String {
        let context = self.cuda_context_secs.map(|s| format!(", CUDA context {s:.3} s")).unwrap_or_default();
        format!(
            "one-shot costs: parse {:.3} s, device probe {:.3} s, engine start {:.3} s{context}, load {:.3} s; \
             {:.3} s in all",
            self.parse_secs, self.device_probe_secs, self.engine_start_secs, self.load_secs, self.command_secs
        )
    }
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
                        // Its clock starts with the load's, so that the bytes of the first second are not read
                        // as a burst.
                        let b = indicatif::ProgressBar::new(total).with_elapsed(start.elapsed()).with_style(
                            crate::units::bar_style("{spinner} {bytes}/{total_bytes} [{bar:40}] {rate} eta {eta}"),
                        );
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

/// The CLI's exit on Ctrl-C: a load in progress is cancelled (its reads drained, its memory released) and the
/// process exits with status 130 (128 + SIGINT), as shells expect.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted: the load was cancelled and its memory released")
    }
}

impl std::error::Error for Interrupted {}

/// SIGINT turned into a cancel flag for the duration of a load: the first Ctrl-C cancels it, a second one exits at
/// once (status 130). Outside a load, Ctrl-C keeps its default effect.
struct Interrupt {
    flag: std::sync::Arc<AtomicBool>,
    ids: [signal_hook::SigId; 2],
}

impl Interrupt {
    fn watch() -> Result<Interrupt> {
        use signal_hook::{consts::SIGINT, flag};
        let f = std::sync::Arc::new(AtomicBool::new(false));
        // Registered first, so that it sees the flag as the previous Ctrl-C left it.
        let second =
            flag::register_conditional_shutdown(SIGINT, 130, f.clone()).context("installing a SIGINT handler")?;
        let first = flag::register(SIGINT, f.clone()).context("installing a SIGINT handler")?;
        Ok(Interrupt { flag: f, ids: [second, first] })
    }

    fn flag(&self) -> &AtomicBool {
        &self.flag
    }

    /// The load's result, or [`Interrupted`] when Ctrl-C cancelled it.
    fn outcome<T>(&self, r: weightlift::Result<T>) -> Result<T> {
        match r {
            Err(e) if e.is_cancelled() && self.flag.load(Ordering::Relaxed) => Err(Interrupted.into()),
            Err(e) => Err(e.into()),
            Ok(v) => Ok(v),
        }
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        for id in self.ids {
            signal_hook::low_level::unregister(id);
        }
    }
}
