//! What this machine offers weightlift, and what it would choose: CUDA devices and their PCIe links, io_uring,
//! O_DIRECT support and block size of a path's filesystem, how much of a file is in the page cache, cuFile.

use std::path::Path;

use serde_json::{Value, json};
use weightlift_io::OpenFile;
use weightlift_io::residency::Residency;

use crate::settings::Settings;

/// Whether NVIDIA's cuFile library loads here, where from and what was tried, and how its driver opened.
/// Serialized, it is `probe()`'s `"cufile"`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CufileReport {
    /// Whether a cuFile library loaded.
    pub found: bool,
    /// The name or path that loaded.
    pub library: Option<String>,
    /// Every name or path tried, in order.
    pub tried: Vec<String>,
    /// Why the last attempt to load failed.
    pub error: Option<String>,
    /// How the driver moves data, or why it did not open; absent when no library loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<CufileMode>,
    /// The opened driver's version and properties.
    #[serde(flatten)]
    pub driver: Option<CufileDriverReport>,
}

/// How cuFile's driver moves data here, or why it did not open. Serialized as one line (`"peer-to-peer: …"`,
/// `"compat: …"`, `"driver not opened: …"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CufileMode {
    /// nvidia-fs (or P2PDMA) moves data between storage and GPU memory directly; why cuFile says so.
    PeerToPeer(String),
    /// Through host bounce buffers; why.
    Compat(String),
    /// The library loaded, its driver did not open; the error.
    NotOpened(String),
}

impl std::fmt::Display for CufileMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CufileMode::PeerToPeer(d) => write!(f, "peer-to-peer: {d}"),
            CufileMode::Compat(d) => write!(f, "compat: {d}"),
            CufileMode::NotOpened(e) => write!(f, "driver not opened: {e}"),
        }
    }
}

impl serde::Serialize for CufileMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// An opened cuFile driver's version and properties (`cuFileGetVersion`, `cuFileDriverGetProperties`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CufileDriverReport {
    /// As `cuFileGetVersion` reports it (1150 for 1.15), where the library has that call.
    pub version: Option<i32>,
    /// The nvidia-fs driver's version, `major.minor`.
    pub nvfs_version: String,
    /// The largest single direct read cuFile issues, in bytes.
    pub max_direct_io_size: usize,
    /// cuFile's feature flags (`fflags`).
    pub feature_flags: u32,
}

/// Whether NVIDIA's cuFile library can be loaded here, where from, what was tried, and how its driver opened (this
/// loads the library and opens the driver, as a cuFile load would).
pub fn cufile_status(settings: &Settings) -> CufileReport {
    let explicit = settings.cufile_lib.value.as_deref();
    let (loc, _) = weightlift_cuda::cufile::locate(explicit);
    let mut report = CufileReport {
        found: loc.found.is_some(),
        library: loc.found,
        tried: loc.tried,
        error: loc.error,
        mode: None,
        driver: None,
    };
    if report.found {
        match weightlift_cuda::cufile::driver(explicit) {
            Ok(c) => {
                report.mode = Some(match &c.mode {
                    weightlift_cuda::cufile::CufileMode::PeerToPeer(d) => CufileMode::PeerToPeer(d.clone()),
                    weightlift_cuda::cufile::CufileMode::Compat(d) => CufileMode::Compat(d.clone()),
                });
                report.driver = Some(CufileDriverReport {
                    version: c.version,
                    nvfs_version: format!("{}.{}", c.props.nvfs_major, c.props.nvfs_minor),
                    max_direct_io_size: c.props.max_direct_io_size,
                    feature_flags: c.props.fflags,
                });
            }
            Err(e) => report.mode = Some(CufileMode::NotOpened(e.to_string())),
        }
    }
    report
}

/// A JSON description of the machine (and of `path`, if given). Never fails: what cannot be probed says why.
pub fn probe(path: Option<&Path>) -> Value {
    let _restore = weightlift_cuda::ContextRestore::save(); // opening each device binds its context here
    let cuda = probe_cuda();
    let uring = match weightlift_io::uring_available() {
        Ok(()) => json!({"available": true}),
        Err(why) => json!({"available": false, "reason": why}),
    };
    let config = Settings::from_env();
    let settings = match &config {
        Ok(c) => Value::Object(
            c.describe()
                .into_iter()
                .map(|(k, v, s)| (k.to_string(), json!({"value": v, "source": s.to_string()})))
                .collect(),
        ),
        Err(e) => json!({"error": e.to_string()}),
    };
    let read_engine = match (&config, weightlift_io::uring_available()) {
        (Ok(c), _) if c.backend.value == crate::settings::Backend::Pread => "pread (requested)".to_string(),
        (_, Ok(())) => "uring (io_uring available)".to_string(),
        (_, Err(why)) => format!("pread (io_uring unavailable: {why})"),
    };
    // The same decision a GPU load makes (it may load cuFile, as a load would).
    let gpu_path = match &config {
        Ok(c) => match crate::path::decide(c) {
            Ok((kind, reason, _)) => json!({"path": format!("{kind:?}").to_lowercase(), "reason": reason}),
            Err(e) => json!({"error": e.to_string()}),
        },
        Err(e) => json!({"error": e.to_string()}),
    };
    let cufile = match &config {
        Ok(c) => serde_json::to_value(cufile_status(c)).unwrap_or_else(|e| json!({"error": e.to_string()})),
        Err(e) => json!({"error": e.to_string()}),
    };
    let file = path.map(probe_file);
    json!({
        "weightlift": env!("CARGO_PKG_VERSION"),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "cuda": cuda,
        "io_uring": uring,
        "cufile": cufile,
        "backend": read_engine,
        "gpu_path": gpu_path,
        "settings": settings,
        "file": file,
    })
}

/// CUDA devices and their links, or why there are none.
fn probe_cuda() -> Value {
    match weightlift_cuda::available() {
        Ok(d) => {
            let devices: Vec<Value> = (0..d.devices)
                .map(|i| match weightlift_cuda::Gpu::open(i) {
                    Ok(g) => {
                        let info = g.info();
                        let (free, total) = g.mem_info().unwrap_or((0, 0));
                        json!({
                            "ordinal": i, "name": info.name, "pci_bus_id": info.pci_bus_id, "pcie_link": info.pcie_link,
                            "compute_capability": format!("{}.{}", info.compute_capability.0, info.compute_capability.1),
                            "total_bytes": total, "free_bytes": free,
                        })
                    }
                    Err(e) => json!({"ordinal": i, "error": e.to_string()}),
                })
                .collect();
            json!({"available": true, "driver_cuda_version": format!("{}.{}", d.version / 1000, d.version % 1000 / 10), "devices": devices})
        }
        Err(why) => json!({"available": false, "reason": why}),
    }
}

/// How `path` would be read: O_DIRECT support, block size, page-cache residency.
fn probe_file(path: &Path) -> Value {
    let path = Some(path);
    // A directory is probed through a small file created in it (its filesystem is what matters).
    let scratch = path.filter(|p| p.is_dir()).and_then(|d| {
        let f = d.join(format!(".weightlift-probe-{}", std::process::id()));
        std::fs::write(&f, [0u8; 4096]).ok().map(|()| f)
    });
    let target = scratch.as_deref().or(path);
    let file = target.map(|p| match OpenFile::open_device(p, true) {
        Ok(f) => {
            let resident = f.local().and_then(|l| Residency::probe(l, f.len)).map(|r| r.resident_bytes());
            json!({
                "path": p, "len": f.len, "o_direct": f.supports_direct(), "o_direct_refused": f.direct_refused,
                "logical_block_size": f.block, "dio_mem_align": f.mem_align, "resident_bytes": resident,
                "would_read": match (f.supports_direct(), resident) {
                    (false, _) => "buffered (no O_DIRECT here)",
                    (true, Some(r)) if r * 2 >= f.len && f.len > 0 => "buffered (mostly in the page cache)",
                    (true, _) => "O_DIRECT (mostly not in the page cache)",
                },
            })
        }
        Err(e) => json!({"path": p, "error": e.to_string()}),
    });
    let file = match (scratch.as_ref(), file) {
        (Some(s), Some(mut f)) => {
            let _ = std::fs::remove_file(s);
            f["path"] = json!(path);
            f["probed_with"] = json!("a 4 KiB file created and removed in the directory");
            Some(f)
        }
        (_, f) => f,
    };
    file.unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cufile_report_serializes_as_probe_has_always_said_it() {
        let opened = CufileReport {
            found: true,
            library: Some("libcufile.so.0".into()),
            tried: vec!["libcufile.so".into(), "libcufile.so.0".into()],
            error: None,
            mode: Some(CufileMode::Compat("nvidia-fs not loaded".into())),
            driver: Some(CufileDriverReport {
                version: Some(1150),
                nvfs_version: "2.17".into(),
                max_direct_io_size: 16 << 20,
                feature_flags: 5,
            }),
        };
        assert_eq!(
            serde_json::to_value(&opened).unwrap(),
            json!({"found": true, "library": "libcufile.so.0", "tried": ["libcufile.so", "libcufile.so.0"],
                   "error": null, "mode": "compat: nvidia-fs not loaded", "version": 1150, "nvfs_version": "2.17",
                   "max_direct_io_size": 16777216, "feature_flags": 5})
        );
        let missing = CufileReport {
            found: false,
            library: None,
            tried: vec!["libcufile.so".into()],
            error: Some("not found".into()),
            mode: None,
            driver: None,
        };
        assert_eq!(
            serde_json::to_value(&missing).unwrap(),
            json!({"found": false, "library": null, "tried": ["libcufile.so"], "error": "not found"})
        );
        let refused = CufileMode::NotOpened("cuFileDriverOpen: 5030".into());
        assert_eq!(serde_json::to_value(&refused).unwrap(), json!("driver not opened: cuFileDriverOpen: 5030"));
    }
}
