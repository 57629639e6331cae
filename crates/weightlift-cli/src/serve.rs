//! `weightlift serve`: the load server (see `weightlift::server`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{Context, Result};
use weightlift::{Device, Engine, ServerMode, Settings};

use crate::load::SettingArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Socket to listen on [default: $XDG_RUNTIME_DIR/weightlift/server.sock, else /tmp/weightlift-UID/server.sock,
    /// where clients look with the setting server=auto].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Devices whose staging and streams are set up before serving (repeat the flag for several); loads onto other
    /// devices set theirs up as they come.
    #[arg(long = "prepare", value_name = "DEVICE", default_values_t = vec!["cuda:0".to_string()])]
    pub prepare: Vec<String>,
    #[command(flatten)]
    pub settings: SettingArgs,
}

pub fn run(args: &Args) -> Result<()> {
    // The server reads for others: it never hands its own loads to a server.
    let settings = Settings::resolve(&args.settings.0)?.server(ServerMode::Off);
    let engine = Arc::new(Engine::new(settings)?);
    let socket = args.socket.clone().unwrap_or_else(weightlift::server::default_socket);
    // Before the socket exists, so that a signal from then on stops the server and removes it.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing a signal handler")?;
    }
    let server = weightlift::server::Server::bind(engine.clone(), &socket)?;
    for d in &args.prepare {
        let device: Device = d.parse().map_err(anyhow::Error::msg)?;
        let t = Instant::now();
        engine.prepare(device).with_context(|| format!("setting {device} up"))?;
        eprintln!("weightlift serve: {device} set up in {:.3} s", t.elapsed().as_secs_f64());
    }
    let devices: Vec<String> = server.devices().iter().map(|(uuid, n)| format!("cuda:{n} (GPU-{uuid})")).collect();
    println!("weightlift serve: listening on {} for {}; Ctrl-C stops", server.socket().display(), devices.join(", "));
    server.run(&stop)?;
    eprintln!("weightlift serve: stopped");
    Ok(())
}
