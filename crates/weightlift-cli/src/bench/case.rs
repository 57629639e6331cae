//! One load case of the bench, held against its ceiling, and the timed loads that measure it.

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use weightlift::format::TensorIndex;
use weightlift::{Device, Engine, LoadOpts};

use super::ceilings::{Rate, loaded_checksum};

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
