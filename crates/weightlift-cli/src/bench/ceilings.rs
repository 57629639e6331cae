//! The machine's ceilings, measured in the same run as the loads: the page cache and disk through `dd`, cache
//! dropping, the checksums every timed load is verified against afterwards, and what a measured rate is.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use weightlift::Loaded;
use weightlift::format::TensorIndex;

/// Whether this process may drop the page cache (root, writable /proc/sys/vm/drop_caches).
pub fn can_drop_caches() -> bool {
    std::fs::OpenOptions::new().write(true).open("/proc/sys/vm/drop_caches").is_ok()
}

pub fn drop_caches() -> Result<()> {
    Command::new("sync").status().context("sync")?;
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("dropping caches (needs root)")?;
    Ok(())
}

/// Reads a file once so it is in the page cache.
pub fn warm(path: &Path) -> Result<()> {
    dd(path, &[])?;
    Ok(())
}

/// Runs `dd if=PATH of=/dev/null bs=16M EXTRA...` and returns (bytes, seconds) as dd reports them.
fn dd(path: &Path, extra: &[&str]) -> Result<(u64, f64)> {
    let out = Command::new("dd")
        .arg(format!("if={}", path.display()))
        .args(["of=/dev/null", "bs=16M"])
        .args(extra)
        .env("LC_ALL", "C")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("running dd")?;
    if !out.status.success() {
        bail!("dd failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    // "1073741824 bytes (1.1 GB, 1.0 GiB) copied, 0.21 s, 5.1 GB/s"
    let line = text.lines().find(|l| l.contains("copied")).context("unexpected dd output")?;
    let bytes: u64 = line.split_whitespace().next().and_then(|w| w.parse().ok()).context("dd byte count")?;
    let secs: f64 = line
        .split(", ")
        .find(|p| p.trim_end().ends_with(" s"))
        .and_then(|p| p.trim().trim_end_matches(" s").parse().ok())
        .context("dd seconds")?;
    Ok((bytes, secs))
}

/// `dd bs=16M` of a file already in the page cache: the warm ceiling of one reader.
pub fn warm_dd(path: &Path, runs: usize) -> Result<Rate> {
    warm(path)?;
    let mut r = Vec::new();
    for _ in 0..runs {
        let (b, s) = dd(path, &[])?;
        r.push(b as f64 / s / 1e9);
    }
    Ok(Rate { runs: r })
}

/// `streams` parallel `dd iflag=direct` over stripes of the file after dropping caches: the cold ceiling.
pub fn cold_parallel_dd(path: &Path, streams: u64, runs: usize) -> Result<Rate> {
    let len = std::fs::metadata(path)?.len();
    let blocks = len.div_ceil(16 << 20);
    let per = blocks.div_ceil(streams);
    let mut r = Vec::new();
    for _ in 0..runs {
        drop_caches()?;
        let t = Instant::now();
        let children: Vec<_> = (0..streams)
            .filter(|i| i * per < blocks)
            .map(|i| {
                Command::new("dd")
                    .arg(format!("if={}", path.display()))
                    .args(["of=/dev/null", "bs=16M", "iflag=direct"])
                    .arg(format!("skip={}", i * per))
                    .arg(format!("count={per}"))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
            })
            .collect::<std::io::Result<_>>()?;
        for mut c in children {
            if !c.wait()?.success() {
                bail!("dd iflag=direct failed on {}", path.display());
            }
        }
        r.push(len as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    Ok(Rate { runs: r })
}

/// `dd if=/dev/zero of=PATH bs=16M count=… oflag=direct`: the disk's direct write rate.
pub fn dd_write_direct(path: &Path, bytes: u64, runs: usize) -> Result<Rate> {
    let count = bytes.div_ceil(16 << 20);
    let mut r = Vec::new();
    for _ in 0..runs {
        let _ = std::fs::remove_file(path);
        let t = Instant::now();
        let ok = Command::new("dd")
            .args(["if=/dev/zero", "bs=16M", "oflag=direct"])
            .arg(format!("of={}", path.display()))
            .arg(format!("count={count}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?
            .success();
        if !ok {
            bail!("dd oflag=direct failed on {}", path.display());
        }
        r.push((count << 24) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    let _ = std::fs::remove_file(path);
    Ok(Rate { runs: r })
}

/// Checksum of every tensor of `index` as the file holds it (plain reads, outside any timing).
pub fn file_checksum(index: &TensorIndex) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let files: Vec<std::fs::File> =
        index.files.iter().map(|f| std::fs::File::open(&f.path)).collect::<std::io::Result<_>>()?;
    let mut acc = 0u64;
    let mut buf = Vec::new();
    for t in &index.tensors {
        buf.resize(t.nbytes as usize, 0);
        files[t.file].read_exact_at(&mut buf, t.offset)?;
        acc = acc.rotate_left(7) ^ weightlift::verify::checksum(&buf);
    }
    Ok(acc)
}

/// The same checksum over loaded tensors (copying device memory back where needed).
pub fn loaded_checksum(loaded: &Loaded) -> Result<u64> {
    let mut acc = 0u64;
    let mut buf = Vec::new();
    for t in &loaded.tensors {
        buf.resize(t.data.len(), 0);
        t.data.read_back(0, &mut buf)?;
        acc = acc.rotate_left(7) ^ weightlift::verify::checksum(&buf);
    }
    Ok(acc)
}

/// A measured rate: every run's GB/s, best and median.
#[derive(Clone, Debug)]
pub struct Rate {
    pub runs: Vec<f64>,
}

impl Rate {
    pub fn best(&self) -> f64 {
        self.runs.iter().copied().fold(0.0, f64::max)
    }

    pub fn median(&self) -> f64 {
        let mut v = self.runs.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        match v.len() {
            0 => 0.0,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    pub fn json(&self) -> Value {
        json!({"best": self.best(), "median": self.median(), "runs": self.runs})
    }
}
