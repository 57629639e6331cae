//! `weightlift`: inspect, generate, load, bench and probe checkpoints.
#![forbid(unsafe_code)]

mod bench;
mod bench_gpu;
mod inspect;
mod load;
mod plot;
mod units;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use weightlift_format::synth;

#[derive(Parser, Debug)]
#[command(
    name = "weightlift",
    version,
    about = "Move tensors from storage to GPU memory at the hardware limit",
    after_help = "Settings: every engine option also reads its WEIGHTLIFT_* environment variable (see `weightlift load --help`)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Generate(args) => generate(&args),
        Command::Load(args) => load::run(&args),
        Command::Bench(args) => bench::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weightlift: error: {e:#}");
            ExitCode::from(2)
        }
    }
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
