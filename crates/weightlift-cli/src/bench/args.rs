//! The bench's command line: its cases and options.

use std::path::PathBuf;

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
