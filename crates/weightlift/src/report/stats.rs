//! The statistics a load's [`Report`](super::Report) carries beside its I/O figures, one type per kind of load that
//! has some: streaming loads, packed checkpoints, loads checked as they land, GPU-initiated NVMe.

use serde_json::{Value, json};

/// What the requests of a load from objects (URLs) did, for its report.
#[derive(Clone, Debug, Default)]
pub struct NetworkStats {
    /// The objects read (from the network, or from their local copies).
    pub objects: Vec<String>,
    /// HTTP requests (HEAD and ranged GETs, retries included).
    pub requests: u64,
    /// Body bytes received.
    pub bytes: u64,
    /// Requests sent again after a transient failure.
    pub retries: u64,
    /// Time spent in requests, summed over those in flight at once.
    pub waiting_secs: f64,
    /// The objects read from their valid local copies (`remote_cache_dir`): only their HEAD went out.
    pub cached: Vec<String>,
    /// The objects whose local copy this load wrote.
    pub copies_written: Vec<String>,
}

impl NetworkStats {
    /// The stats of the objects among `files` (`None` when all are local files).
    pub fn of(files: &[std::sync::Arc<weightlift_io::OpenFile>]) -> Option<NetworkStats> {
        use weightlift_io::LocalCopy;
        let mut n = NetworkStats::default();
        for f in files {
            let o = match (f.object(), &f.copy) {
                (_, Some(LocalCopy::Read(o))) => {
                    n.cached.push(o.url().to_string());
                    o
                }
                (Some(o), _) => {
                    if f.filling().is_some_and(|c| c.published()) {
                        n.copies_written.push(o.url().to_string());
                    }
                    o
                }
                (None, _) => continue,
            };
            let s = o.stats();
            n.objects.push(o.url().to_string());
            n.requests += s.requests;
            n.bytes += s.bytes;
            n.retries += s.retries;
            n.waiting_secs += s.waiting.as_secs_f64();
        }
        (!n.objects.is_empty()).then_some(n)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "objects": self.objects, "requests": self.requests, "bytes": self.bytes, "retries": self.retries,
            "waiting_secs": self.waiting_secs, "cached": self.cached, "copies_written": self.copies_written,
        })
    }
}

/// What a streaming load read, for its report.
#[derive(Clone, Debug, Default)]
pub struct StreamStats {
    /// Bytes read by the stream in file order.
    pub streamed_bytes: u64,
    /// Bytes read at once for tensors taken before the stream reached them.
    pub on_demand_bytes: u64,
    /// Reads made for those tensors.
    pub on_demand_reads: u64,
    /// Bytes read ahead whose tensors nobody took (known once the stream is closed).
    pub wasted_bytes: u64,
    /// The most the stream may read ahead of what was taken.
    pub prefetch_bytes: u64,
    /// Times the device had no memory for a block read ahead, so that reading ahead paused until a take.
    pub memory_waits: u64,
}

impl StreamStats {
    /// As JSON, for the report.
    pub fn to_json(&self) -> Value {
        json!({
            "streamed_bytes": self.streamed_bytes, "on_demand_bytes": self.on_demand_bytes,
            "on_demand_reads": self.on_demand_reads, "wasted_bytes": self.wasted_bytes,
            "prefetch_bytes": self.prefetch_bytes, "memory_waits": self.memory_waits,
        })
    }
}

/// What checking a load did (in [`Report::checks`](crate::Report)).
#[derive(Clone, Debug, Default)]
pub struct CheckStats {
    /// Chunks whose checksum was checked.
    pub chunks: u64,
    /// Bytes hashed.
    pub bytes: u64,
    /// Where the hashing ran: `cuda:N`, or `cpu` (with the reason when device memory had to be read back).
    pub on: String,
    /// Bytes hashed while the load was still running.
    pub overlapped_bytes: u64,
    /// Time from the end of the reads to the last hash checked.
    pub tail_secs: f64,
}

impl CheckStats {
    /// As JSON, for the report.
    pub fn to_json(&self) -> Value {
        json!({
            "chunks": self.chunks, "bytes": self.bytes, "on": self.on,
            "overlapped_bytes": self.overlapped_bytes, "tail_secs": self.tail_secs,
        })
    }
}

/// What a packed load did, for its report.
#[derive(Clone, Debug, Default)]
pub struct PackStats {
    /// Stored (compressed) bytes read for the tensors asked for.
    pub stored_bytes: u64,
    /// The raw bytes they decoded to.
    pub raw_bytes: u64,
    /// Chunks decoded, each checked against its checksum.
    pub chunks: u64,
    /// Decode batches the chunks went in.
    pub batches: u64,
    /// `gpu` or `cpu`.
    pub decoder: &'static str,
    /// Why that decoder ran.
    pub decoder_reason: String,
    /// Time the loading thread spent waiting for decoded batches (GPU) or decoding (CPU).
    pub decode_secs: f64,
    /// Lanes that read the stored bytes at most (see [`crate::packed::gpu_decode_read_lanes`]).
    pub read_lanes: usize,
    /// Stored bytes per decode batch asked for (the `pack_batch_bytes` setting, or [`crate::packed::BATCH_BYTES`] /
    /// [`crate::packed::NVCOMP_BATCH_BYTES`] by default).
    pub batch_bytes: u64,
}

impl PackStats {
    /// As JSON, for the report.
    pub fn to_json(&self) -> Value {
        json!({
            "stored_bytes": self.stored_bytes, "raw_bytes": self.raw_bytes, "chunks": self.chunks,
            "batches": self.batches, "decoder": self.decoder, "decoder_reason": self.decoder_reason,
            "decode_secs": self.decode_secs, "read_lanes": self.read_lanes, "batch_bytes": self.batch_bytes,
            "ratio": if self.raw_bytes > 0 { self.stored_bytes as f64 / self.raw_bytes as f64 } else { 1.0 },
        })
    }
}

/// What the GPU-initiated load did, beside the usual report.
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmeStats {
    /// NVMe commands the GPU submitted.
    pub commands: u64,
    /// Bytes the commands moved.
    pub transferred: u64,
    /// Time the submitting kernel ran.
    pub kernel_secs: f64,
}
