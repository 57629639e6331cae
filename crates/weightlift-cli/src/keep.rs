//! `weightlift keep`: run a keeper in the foreground (checkpoints held on a GPU for the loads of other
//! processes), or ask a running one what it holds.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use weightlift::keep::{self, Keeper, KeeperConfig, Reply};

use crate::load::SettingArgs;
use crate::units;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint files to load at once, folders (their .safetensors, .gguf and .wlpack files), or objects' URLs
    /// (s3://, gs://, https://; kept at the ETag they have now, fetched with this process's credentials); later
    /// loads of others are kept as they are asked for.
    pub paths: Vec<PathBuf>,
    /// The device to keep on: cuda:N, or cpu (shared host memory, for host loads).
    #[arg(long, default_value = "cuda:0")]
    pub device: String,
    /// Memory it may hold (e.g. 40GiB); least recently used checkpoints go first [default: 80 % of the device's
    /// free memory; cpu: half of the available memory].
    #[arg(long, value_parser = units::parse_size)]
    pub budget: Option<u64>,
    /// Its socket [default: $XDG_RUNTIME_DIR/weightlift/keep-cuda0.sock, else /tmp/weightlift-UID/…].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Print what the keeper at the socket holds, and exit.
    #[arg(long)]
    pub status: bool,
    /// With --status: one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub settings: SettingArgs,
}

fn files_of(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| p.display().to_string())?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    f.is_file()
                        && f.extension().is_some_and(|x| ["safetensors", "gguf", "wlpack"].iter().any(|e| x == *e))
                })
                .collect();
            found.sort();
            if found.is_empty() {
                anyhow::bail!("{}: no .safetensors, .gguf or .wlpack file in this folder", p.display());
            }
            out.extend(found);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

fn print_status(s: &Reply, json: bool) {
    if json {
        println!("{}", serde_json::to_string(s).unwrap_or_default());
        return;
    }
    if let Reply::Status { device, budget, used, entries, served, failed, .. } = s {
        println!(
            "keeper on {device}: {} of {} held, {} file(s), {served} load(s) served, {failed} file(s) not kept",
            units::bytes(*used),
            units::bytes(*budget),
            entries.len()
        );
        for e in entries {
            println!("  {:<8} {:>10}  {} lease(s)  {}", e.state, units::bytes(e.len), e.leases, e.path);
        }
    }
}

pub fn run(args: &Args) -> Result<()> {
    let device: weightlift::Device = args.device.parse().map_err(anyhow::Error::msg)?;
    let socket = match &args.socket {
        Some(s) => s.clone(),
        None => keep::default_socket(device)?,
    };
    if args.status {
        let s = keep::status(&socket)?;
        print_status(&s, args.json);
        return Ok(());
    }
    let files = files_of(&args.paths)?;
    let settings = weightlift::Settings::resolve(&args.settings.0)?.keeper(weightlift::KeeperSocket::Off);
    let keeper = Keeper::start(KeeperConfig { device, socket: Some(socket.clone()), budget: args.budget, settings })?;
    let start = Instant::now();
    keeper.keep(&files)?;
    keeper.wait_idle();
    let status = keeper.status();
    if let Reply::Status { used, entries, .. } = &status {
        let ready = entries.iter().filter(|e| e.state == "ready").count();
        if !files.is_empty() {
            println!(
                "kept {ready} of {} file(s), {} on {device}, in {:.2} s",
                files.len(),
                units::bytes(*used),
                start.elapsed().as_secs_f64()
            );
        }
        if ready < files.len() {
            eprintln!("weightlift: warning: some files were not kept (run with -v to see why)");
        }
    }
    println!(
        "keeping on {device} within {} at {}; loads onto {device} ask it first (setting keeper: auto, or WEIGHTLIFT_KEEPER={}); Ctrl-C stops it",
        units::bytes(keeper.budget()),
        socket.display(),
        socket.display()
    );
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    let signal = signals.forever().next();
    keeper.stop();
    eprintln!("weightlift: keeper stopped{}", signal.map(|s| format!(" (signal {s})")).unwrap_or_default());
    Ok(())
}
