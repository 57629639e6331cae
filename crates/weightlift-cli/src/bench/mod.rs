//! `weightlift bench`: measures the machine's ceilings and weightlift's loads in the same run, and prints each load
//! as GB/s and as a fraction of its ceiling (and of the best peer, where peers ran). Figures, not pass/fail: a
//! benchmark is not a test. One module per case family: [`ceilings`] (dd, cache dropping, checksums, rates), [`host`]
//! (loads into host memory), [`gpu`] (loads into device memory, cuFile, GPU-initiated NVMe, writes), [`python`]
//! (the shapes users meet through the Python package, and the peers, in a child Python process); below them
//! [`args`] (the command line), [`case`] (a case and its timed loads), [`report`] and [`plot`] (the outputs).
//! This file is the front: it picks the family.

mod args;
mod case;
mod ceilings;
mod gpu;
mod host;
mod plot;
mod python;
mod report;

use anyhow::Result;
use weightlift::Device;

pub use args::Args;

pub fn run(args: &Args) -> Result<()> {
    let (device, why) = args.engine.device()?;
    match device {
        Device::Cuda(n) => gpu::run(args, n),
        _ => host::run(args, device, &why),
    }
}
