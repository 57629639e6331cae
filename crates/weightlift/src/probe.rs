//! What this machine offers weightlift, and what it would choose: CUDA devices and their PCIe links, io_uring,
//! O_DIRECT support and block size of a path's filesystem, how much of a file is in the page cache, cuFile.

use std::path::Path;

use serde_json::{Value, json};
use weightlift_io::OpenFile;
use weightlift_io::residency::Residency;

use crate::settings::Settings;

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
        Ok(c) => crate::cufile_status(c),
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
