//! What a load did, how fast, and why it took the path it took.

use std::fmt;
use std::path::PathBuf;

use serde_json::{Value, json};
use weightlift_io::{IoReport, ReadEngineUsed};

mod stats;

pub use stats::{CheckStats, NetworkBefore, NetworkStats, NvmeStats, PackStats, StreamStats};

use crate::device::Device;
use crate::settings::Source;

/// The data path a load took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathUsed {
    /// weightlift's pipeline (reads into pinned staging, async copies), with this kernel interface.
    Pipeline(ReadEngineUsed),
    /// NVIDIA cuFile.
    Cufile,
    /// GPU-initiated NVMe commands against the software controller.
    NvmeSim,
    /// Memory of a keeper (`weightlift keep`), copied or mapped: no file was read.
    Keeper,
}

impl fmt::Display for PathUsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathUsed::Pipeline(e) => e.fmt(f),
            PathUsed::Cufile => f.write_str("gds"),
            PathUsed::NvmeSim => f.write_str("nvme-sim"),
            PathUsed::Keeper => f.write_str("keeper"),
        }
    }
}

/// The report of one load.
#[derive(Clone, Debug)]
pub struct Report {
    /// Where the tensors were loaded.
    pub device: Device,
    /// The files read.
    pub files: Vec<PathBuf>,
    /// Tensors delivered.
    pub tensors: usize,
    /// Tensor bytes delivered.
    pub bytes: u64,
    /// Wall time of the whole load (opening files, allocating, planning, reading, copying).
    pub seconds: f64,
    /// Time spent allocating destinations (overlapped with the reads on the GPU pipeline).
    pub alloc_secs: f64,
    /// For device loads of whole tensors: where their memory came from ("pool": the device's stream-ordered pool;
    /// otherwise the name of the caller's allocator, e.g. "torch").
    pub device_memory: Option<String>,
    /// The path taken and why.
    pub path: PathUsed,
    /// Why that path was taken.
    pub path_reason: String,
    /// What the pipeline (or the path standing in for it) did.
    pub io: IoReport,
    /// The settings in use and where each came from.
    pub settings: Vec<(&'static str, String, Source)>,
    /// Whether the loaded bytes were compared with a second read of the files (None: not checked).
    pub verified: Option<bool>,
    /// For device loads: the device.
    pub gpu: Option<weightlift_cuda::GpuInfo>,
    /// For device loads: longest time a lane's stream spent from its first copy to the end of its last.
    pub copy_span_secs: Option<f64>,
    /// The pinned host→device copy rate measured on this machine (GB/s), when measured.
    pub ceiling_gbps: Option<f64>,
    /// For GPU-initiated NVMe loads: commands issued and kernel time.
    pub nvme: Option<NvmeStats>,
    /// For streaming loads: bytes read ahead that no caller took.
    pub stream: Option<StreamStats>,
    /// For packed checkpoints: stored and raw bytes, and the decoder that ran.
    pub pack: Option<PackStats>,
    /// For loads given expected checksums: what was hashed, where, and how much of it during the load.
    pub checks: Option<CheckStats>,
    /// For loads from objects (URLs): what their requests did.
    pub network: Option<NetworkStats>,
    /// Whether a keeper served the load, or why not where one was asked (`None`: none was asked).
    pub keeper: Option<String>,
}

impl Report {
    /// A report of `tensors` tensors of `bytes` bytes from `files` onto `device`.
    pub(crate) fn new(device: Device, files: &[PathBuf], tensors: usize, bytes: u64, io: IoReport) -> Report {
        let path = PathUsed::Pipeline(io.read_engine);
        let path_reason = io.read_engine_reason.clone();
        Report {
            device,
            files: files.to_vec(),
            tensors,
            bytes,
            seconds: 0.0,
            alloc_secs: 0.0,
            device_memory: None,
            path,
            path_reason,
            io,
            settings: Vec::new(),
            verified: None,
            gpu: None,
            copy_span_secs: None,
            ceiling_gbps: None,
            nvme: None,
            stream: None,
            pack: None,
            checks: None,
            network: None,
            keeper: None,
        }
    }

    /// Tensor bytes per second, in GB/s (10^9).
    pub fn gbps(&self) -> f64 {
        if self.seconds > 0.0 { self.bytes as f64 / self.seconds / 1e9 } else { 0.0 }
    }

    /// The whole report as JSON (`weightlift load --json`, `weightlift.last_report()`).
    pub fn to_json(&self) -> Value {
        let io = &self.io;
        let settings: serde_json::Map<String, Value> = self
            .settings
            .iter()
            .map(|(k, v, src)| ((*k).to_string(), json!({"value": v, "source": src.to_string()})))
            .collect();
        let mut v = json!({
            "device": self.device.to_string(),
            "files": self.files,
            "tensors": self.tensors,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "gbps": self.gbps(),
            "backend": self.path.to_string(),
            "backend_reason": self.path_reason,
            "read_engine": io.read_engine.to_string(),
            "cache": io.cache.to_string(),
            "fixed_buffers": io.fixed_buffers,
            "fixed_refusal": io.fixed_refusal,
            "direct_policy": io.direct_reason,
            "direct_bytes": io.direct_bytes,
            "buffered_bytes": io.buffered_bytes,
            "resident_bytes": io.resident_bytes,
            "read_ops": io.ops,
            "retries": io.stats.retries,
            "short_reads": io.stats.short_reads,
            "lanes": io.lanes,
            "queue_depth": io.queue_depth,
            "slots_per_lane": io.slots_per_lane,
            "slot_bytes": io.slot_bytes,
            "skipped_ops": io.skipped_ops,
            "peak_staging_bytes": io.peak_staging_bytes,
            "times": {
                "alloc": self.alloc_secs,
                "plan": io.plan_secs,
                "io": io.io_secs,
                "io_wait_thread_secs": io.stats.io_wait.as_secs_f64(),
                "deliver_thread_secs": io.stats.deliver.as_secs_f64(),
                "backpressure_thread_secs": io.stats.backpressure.as_secs_f64(),
                "staging_setup_thread_secs": io.stats.setup.as_secs_f64(),
                "staging_wait_thread_secs": io.stats.setup_wait.as_secs_f64(),
                "populate_thread_secs": io.stats.populate.as_secs_f64(),
            },
            "settings": settings,
            "verified": self.verified,
            "gpu": self.gpu.as_ref().map(|g| json!({
                "name": g.name, "ordinal": g.ordinal, "total_bytes": g.total_bytes, "pci_bus_id": g.pci_bus_id,
                "pcie_link": g.pcie_link, "compute_capability": [g.compute_capability.0, g.compute_capability.1],
                "driver_version": g.driver_version,
            })),
            "copy_span_secs": self.copy_span_secs,
            "ceiling_gbps": self.ceiling_gbps,
            "ratio_to_ceiling": self.ceiling_gbps.map(|c| self.gbps() / c),
            "stream": self.stream.as_ref().map(|s| s.to_json()),
            "pack": self.pack.as_ref().map(|p| p.to_json()),
            "nvme": self.nvme.map(|n| json!({
                "commands": n.commands, "bytes_transferred": n.transferred, "kernel_secs": n.kernel_secs,
                "iops": if n.kernel_secs > 0.0 { n.commands as f64 / n.kernel_secs } else { 0.0 },
                "gbps": if n.kernel_secs > 0.0 { n.transferred as f64 / n.kernel_secs / 1e9 } else { 0.0 },
            })),
        });
        // The page-cache folios asked for cold ranges, and what the lanes populated that way (outside the literal
        // above, which is at serde_json's macro recursion limit).
        v["cache_pages"] = json!(io.cache_pages.to_string());
        v["populated_bytes"] = json!(io.stats.populated_bytes);
        v["populate_refusal"] = json!(io.populate_refusal);
        v["checks"] = self.checks.as_ref().map_or(Value::Null, |c| c.to_json());
        v["device_memory"] = json!(self.device_memory);
        v["network"] = self.network.as_ref().map_or(Value::Null, |n| n.to_json());
        v["keeper"] = json!(self.keeper);
        v
    }

    /// A few lines for people.
    pub fn summary(&self) -> String {
        let io = &self.io;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let mut s = format!(
            "loaded {} tensors, {:.2} GiB from {} file(s) into {} in {:.3} s: {:.2} GB/s\n",
            self.tensors,
            gib(self.bytes),
            self.files.len(),
            self.device,
            self.seconds,
            self.gbps()
        );
        if self.path == PathUsed::Keeper {
            s += &format!("  {}", self.keeper.as_deref().unwrap_or("served by a keeper"));
            if let Some(g) = &self.gpu {
                s += &format!("\n  {}: {} ({})", self.device, g.name, g.pci_bus_id);
            }
            return s;
        }
        let fixed = match (self.path, io.fixed_buffers) {
            (PathUsed::Pipeline(ReadEngineUsed::Uring), true) => ", fixed buffers",
            (PathUsed::Pipeline(ReadEngineUsed::Uring), false) => ", fixed buffers refused",
            _ => "",
        };
        s += &format!(
            "  backend {} ({}{fixed}), {} lanes × queue depth {}, {} reads\n",
            self.path, self.path_reason, io.lanes, io.queue_depth, io.ops
        );
        s += &format!(
            "  {:.2} GiB read with O_DIRECT, {:.2} GiB buffered — {}\n",
            gib(io.direct_bytes),
            gib(io.buffered_bytes),
            io.direct_reason
        );
        if io.stats.populated_bytes > 0 || io.populate_refusal.is_some() {
            s += &format!(
                "  cold ranges: {:.2} GiB populated through a huge-page mapping first (cache_pages={}: 2 MiB folios where the filesystem has large folios; {:.2} s of lane time){}\n",
                gib(io.stats.populated_bytes),
                io.cache_pages,
                io.stats.populate.as_secs_f64(),
                io.populate_refusal.as_ref().map(|w| format!("; refused: {w}")).unwrap_or_default()
            );
        }
        s += &format!(
            "  staging {} slots × {} MiB per lane, {} MiB at most; time: alloc {:.3} s, plan {:.3} s, I/O {:.3} s (threads: wait {:.2} s, copy {:.2} s, back-pressure {:.2} s)",
            io.slots_per_lane,
            io.slot_bytes >> 20,
            io.peak_staging_bytes >> 20,
            self.alloc_secs,
            io.plan_secs,
            io.io_secs,
            io.stats.io_wait.as_secs_f64(),
            io.stats.deliver.as_secs_f64(),
            io.stats.backpressure.as_secs_f64()
        );
        if let Some(n) = &self.network {
            s += &format!(
                "\n  from {} object(s): {} requests ({} HEAD), {:.2} GiB received, {} retries, {} answers to slow down, first byte after {:.0} ms on average",
                n.objects.len(),
                n.requests,
                n.heads,
                gib(n.bytes),
                n.retries,
                n.throttled,
                n.first_byte_secs * 1e3
            );
            if let Some(g) = &n.gets {
                s += &format!("\n  GETs: {}", g.why());
            }
            if !n.cached.is_empty() {
                s += &format!("; {} read from local copies", n.cached.len());
            }
            if !n.copies_written.is_empty() {
                s += &format!("; {} local copies written", n.copies_written.len());
            }
        }
        if let Some(c) = &self.checks {
            s += &format!(
                "\n  checksums: {} chunks ({:.2} GiB) checked on {}, {:.2} GiB of them while the load ran, the last {:.3} s after the reads",
                c.chunks,
                gib(c.bytes),
                c.on,
                gib(c.overlapped_bytes),
                c.tail_secs
            );
        }
        if let Some(p) = &self.pack {
            s += &format!(
                "\n  packed: {:.2} GiB stored for {:.2} GiB raw ({:.3}), {} chunks in {} batches, every checksum checked; \
                 decoded on the {} ({}), {:.3} s waiting for the decoder",
                gib(p.stored_bytes),
                gib(p.raw_bytes),
                if p.raw_bytes > 0 { p.stored_bytes as f64 / p.raw_bytes as f64 } else { 1.0 },
                p.chunks,
                p.batches,
                p.decoder.to_uppercase(),
                p.decoder_reason,
                p.decode_secs
            );
        }
        if let Some(g) = &self.gpu {
            s += &format!(
                "\n  {}: {} ({}), PCIe {}; copies: longest stream {:.3} s",
                self.device,
                g.name,
                g.pci_bus_id,
                g.pcie_link.as_deref().unwrap_or("link not visible"),
                self.copy_span_secs.unwrap_or(0.0)
            );
        }
        if let Some(n) = self.nvme {
            let (iops, gbps) = if n.kernel_secs > 0.0 {
                (n.commands as f64 / n.kernel_secs, n.transferred as f64 / n.kernel_secs / 1e9)
            } else {
                (0.0, 0.0)
            };
            s += &format!(
                "\n  GPU-initiated NVMe: {} commands, {iops:.0} IOPS, {gbps:.2} GB/s while the kernels ran ({:.3} s)",
                n.commands, n.kernel_secs
            );
        }
        if let Some(c) = self.ceiling_gbps {
            s += &format!(
                "\n  pinned host→device ceiling measured now: {c:.2} GB/s; this load reached {:.3} of it",
                self.gbps() / c
            );
        }
        if let Some(v) = self.verified {
            s += &format!(
                "\n  verified against a second read of the files: {}",
                if v { "every byte equal" } else { "MISMATCH" }
            );
        }
        if let Some(k) = &self.keeper {
            s += &format!("\n  not served by a keeper: {k}");
        }
        s
    }
}
