//! `weightlift`: inspect, generate, load, bench and probe checkpoints. The command is [`run`]; the `weightlift`
//! binary and the Python package's `weightlift` command (`python -m weightlift`) both call it.
#![forbid(unsafe_code)]

// Every line to stdout goes through `out::line`: a closed stdout ends the program quietly instead of panicking.
// Defined before the modules so that they use this, not std's.
macro_rules! println {
    () => { $crate::out::line(format_args!("")) };
    ($($arg:tt)*) => { $crate::out::line(format_args!($($arg)*)) };
}

mod bench;
mod inspect;
mod keep;
mod load;
mod model;
mod out;
mod packing;
mod units;

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use weightlift::format::synth;

#[derive(Parser, Debug)]
#[command(
    name = "weightlift",
    version,
    about = "Move tensors from storage to GPU memory at the hardware limit",
    after_help = "Settings: every engine option also reads its WEIGHTLIFT_* environment variable (see `weightlift load --help`)."
)]
struct Cli {
    /// Log what the engine decides and warns about to stderr (-v: decisions, -vv: per-load detail); RUST_LOG
    /// overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

/// Sends the engine's `tracing` events to stderr: warnings always, more with `-v`.
fn install_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "weightlift={level},weightlift_io={level},weightlift_cuda={level},weightlift_nvme={level}"
        ))
    });
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).try_init();
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show which bytes of a checkpoint are which tensor (safetensors, shard index, GGUF, raw).
    Inspect(inspect::Args),
    /// Write a synthetic checkpoint of seeded random data.
    Generate(GenerateArgs),
    /// Load every tensor of a checkpoint (a synthetic one if none is given) and report how fast.
    Load(load::Args),
    /// Measure the machine's ceilings and weightlift's loads against them, in one run.
    Bench(bench::Args),
    /// Show what this machine offers (CUDA devices, PCIe links, io_uring, cuFile, O_DIRECT) and what weightlift
    /// would choose for PATH.
    Probe(ProbeArgs),
    /// Pack a checkpoint into a .wlpack: byte planes compressed per chunk for GPU decompression, xxh3 per chunk.
    Pack(packing::PackArgs),
    /// Give back the original files of a .wlpack, byte for byte (every chunk's checksum checked).
    Unpack(packing::UnpackArgs),
    /// Write (or check) a manifest of xxh3 checksums of every tensor of a plain checkpoint.
    Checksum(packing::ChecksumArgs),
    /// Copy a local file to object storage (s3://, gs://, az://), in parts of 16 MiB, for loads from there.
    /// Credentials and endpoint as for loads (docs/object-storage.md).
    Upload(UploadArgs),
    /// Keep checkpoints on a GPU for the loads of other processes (a restart then loads them at the rate of GPU
    /// memory); `--status` asks a running keeper what it holds. docs/keeper.md says how it works.
    Keep(keep::Args),
}

#[derive(clap::Args, Debug)]
struct ProbeArgs {
    /// A file (or directory) whose filesystem and page-cache residency to probe.
    path: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct GenerateArgs {
    /// Output file.
    out: PathBuf,
    /// Tensor bytes to generate (e.g. 1GiB, 512MiB, 1000000).
    #[arg(long, default_value = "1GiB", value_parser = units::parse_size)]
    size: u64,
    #[arg(long, value_enum, default_value_t = LayoutArg::Llama)]
    layout: LayoutArg,
    #[arg(long, value_enum, default_value_t = FormatArg::Safetensors)]
    format: FormatArg,
    /// Seed of the random data (the same seed gives the same file).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Start every tensor at a multiple of this many bytes (safetensors: padding tensors; GGUF: general.alignment).
    #[arg(long, value_parser = units::parse_size)]
    align: Option<u64>,
    /// For --layout many-small: the number of tensors (overrides --size).
    #[arg(long)]
    tensors: Option<u64>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct UploadArgs {
    /// The local file.
    file: PathBuf,
    /// Where it goes: s3://bucket/key, gs://bucket/key or az://container/key.
    url: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LayoutArg {
    Llama,
    ManySmall,
    SingleHuge,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum FormatArg {
    Safetensors,
    Gguf,
    Raw,
}

/// A command-line mistake in the form of every other error: one line, `weightlift: error: …`, status 2. Help and
/// the version go to stdout with status 0.
fn usage_error(e: &clap::Error) -> u8 {
    use clap::error::ErrorKind as K;
    match e.kind() {
        K::DisplayHelp | K::DisplayVersion => {
            println!("{}", e.render().to_string().trim_end());
            return 0;
        }
        K::DisplayHelpOnMissingArgumentOrSubcommand | K::MissingSubcommand => {
            eprintln!("weightlift: error: a command is needed (see `weightlift --help`)");
        }
        _ => eprintln!("weightlift: error: {}", one_line(&e.render().to_string())),
    }
    2
}

/// clap's message up to its usage, on one line: `invalid value 'abc' for '--size <SIZE>': … (see --help)`.
fn one_line(rendered: &str) -> String {
    let text: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let mut line = String::new();
    for (i, piece) in text.iter().enumerate() {
        line.push_str(match i {
            0 => "",
            _ if piece.starts_with("tip:") => "; ",
            _ => " ",
        });
        line.push_str(piece);
    }
    format!("{} (see --help)", line.trim_start_matches("error: "))
}

/// Runs the command line `args` (the program's name first) and returns its exit status: 0, 2 for an error (its
/// message on stderr), 130 when interrupted. `--help` and `--version` print and return 0.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    install_logging(cli.verbose);
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Generate(args) => generate(&args),
        Command::Load(args) => match &args.model {
            Some(dir) => model::run(dir, &args),
            None => load::run(&args),
        },
        Command::Bench(args) => bench::run(&args),
        Command::Probe(args) => probe(&args),
        Command::Pack(args) => packing::pack(&args),
        Command::Unpack(args) => packing::unpack(&args),
        Command::Checksum(args) => packing::checksum(&args),
        Command::Upload(args) => upload(&args),
        Command::Keep(args) => keep::run(&args),
    };
    match result {
        Ok(()) => 0,
        Err(e) if e.downcast_ref::<load::Interrupted>().is_some() => {
            eprintln!("weightlift: {e}");
            130
        }
        Err(e) => {
            eprintln!("weightlift: error: {e:#}");
            2
        }
    }
}

fn upload(args: &UploadArgs) -> Result<()> {
    use anyhow::Context;
    use weightlift::remote;
    if !remote::is_url(&args.url) || args.url.starts_with("http") {
        anyhow::bail!("{}: not an object URL to write to (s3://, gs://, az://)", args.url);
    }
    let len = std::fs::metadata(&args.file).with_context(|| args.file.display().to_string())?.len();
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(units::bar_style("uploading [{bar:40}] {bytes}/{total_bytes} {rate} eta {eta}"));
    let start = std::time::Instant::now();
    let sent = remote::upload_with_progress(&args.file, &args.url, &|n| bar.set_position(n));
    bar.finish_and_clear();
    let sent = sent?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "uploaded {} to {} in {secs:.2} s ({}/s)",
        units::bytes(sent),
        args.url,
        units::bytes((sent as f64 / secs.max(1e-9)) as u64)
    );
    Ok(())
}

fn probe(args: &ProbeArgs) -> Result<()> {
    let v = weightlift::probe::probe(args.path.as_deref());
    if args.json {
        println!("{v}");
        return Ok(());
    }
    let s = |v: &serde_json::Value| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
    println!("weightlift {} on Linux {}, {} CPUs", s(&v["weightlift"]), s(&v["kernel"]), v["cpus"]);
    if v["cuda"]["available"] == true {
        println!("CUDA: driver supports CUDA {}", s(&v["cuda"]["driver_cuda_version"]));
        for d in v["cuda"]["devices"].as_array().into_iter().flatten() {
            println!(
                "  cuda:{} {} ({}), PCIe {}, compute {}, {:.1} of {:.1} GiB free",
                d["ordinal"],
                s(&d["name"]),
                s(&d["pci_bus_id"]),
                s(&d["pcie_link"]),
                s(&d["compute_capability"]),
                d["free_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 30) as f64,
                d["total_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 30) as f64
            );
        }
    } else {
        println!("CUDA: unavailable ({})", s(&v["cuda"]["reason"]));
    }
    let cf = &v["cufile"];
    if cf["found"] == true {
        let mode = cf.get("mode").map(s).unwrap_or_else(|| "not opened".into());
        println!("cuFile: {} — {}", s(&cf["library"]), mode);
    } else {
        println!("cuFile: not found (tried {})", cf["tried"].as_array().map_or(0, Vec::len));
    }
    match v["io_uring"]["available"].as_bool() {
        Some(true) => println!("io_uring: available"),
        _ => println!("io_uring: unavailable ({})", s(&v["io_uring"]["reason"])),
    }
    println!("read engine: {}", s(&v["backend"]));
    match v["gpu_path"].get("reason") {
        Some(r) => println!("GPU path: {}", s(r)),
        None => println!("GPU path: {}", s(&v["gpu_path"]["error"])),
    }
    if let Some(f) = v["file"].as_object() {
        if let Some(e) = f.get("error") {
            println!("{}: {}", s(&f["path"]), s(e));
        } else {
            println!(
                "{}: {} bytes, O_DIRECT {} (logical block {} B), {} bytes in the page cache → {}",
                s(&f["path"]),
                f["len"],
                if f["o_direct"] == true { "yes".to_string() } else { format!("no: {}", s(&f["o_direct_refused"])) },
                f["logical_block_size"],
                f["resident_bytes"],
                s(&f["would_read"])
            );
        }
    }
    println!("settings:");
    for (k, val) in v["settings"].as_object().into_iter().flatten() {
        println!("  {k} = {} ({})", s(&val["value"]), s(&val["source"]));
    }
    Ok(())
}

fn generate(args: &GenerateArgs) -> Result<()> {
    let layout = match args.layout {
        LayoutArg::Llama => synth::Layout::Llama,
        LayoutArg::ManySmall => synth::Layout::ManySmall { tensors: args.tensors },
        LayoutArg::SingleHuge => synth::Layout::SingleHuge,
    };
    let container = match args.format {
        FormatArg::Safetensors => synth::Container::Safetensors,
        FormatArg::Gguf => synth::Container::Gguf,
        FormatArg::Raw => synth::Container::Raw,
    };
    if args.tensors.is_some() && !matches!(args.layout, LayoutArg::ManySmall) {
        anyhow::bail!("--tensors applies to --layout many-small only");
    }
    let spec = synth::Spec { layout, container, size: args.size, seed: args.seed, align: args.align };
    out::remove_partial_output_on_interrupt("generate")?;
    let start = std::time::Instant::now();
    let s = synth::generate(&args.out, &spec)?;
    let secs = start.elapsed().as_secs_f64();
    if args.json {
        let v = serde_json::json!({
            "path": s.path, "tensors": s.tensors, "tensor_bytes": s.tensor_bytes, "file_len": s.file_len,
            "seed": args.seed, "seconds": secs,
        });
        println!("{v}");
    } else {
        println!(
            "wrote {}: {} tensors, {} of tensor data, {} file, in {:.2} s",
            s.path.display(),
            s.tensors,
            units::bytes(s.tensor_bytes),
            units::bytes(s.file_len),
            secs
        );
    }
    Ok(())
}
