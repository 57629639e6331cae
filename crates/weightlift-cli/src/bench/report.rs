//! What the bench writes and prints: the JSON and SVG outputs, the table, the machine and the settings.

use anyhow::{Context, Result};
use serde_json::{Value, json};
use weightlift::Engine;

use super::args::Args;
use super::case::Case;

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
        std::fs::write(svg, super::plot::svg(&title, cases)).with_context(|| format!("writing {}", svg.display()))?;
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
