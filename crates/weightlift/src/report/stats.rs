//! The statistics a load's [`Report`](super::Report) carries beside its I/O figures, one type per kind of load that
//! has some: streaming loads, packed checkpoints, loads checked as they land, GPU-initiated NVMe.

use serde_json::{Value, json};

/// What the requests of a load from objects (URLs) did, for its report: the requests of its objects while it ran
/// (an object opened by parsing is read as opened, so the load's requests are its GETs).
#[derive(Clone, Debug, Default)]
pub struct NetworkStats {
    /// The objects read (from the network, or from their local copies).
    pub objects: Vec<String>,
    /// HTTP requests (ranged GETs and HEADs, retries included).
    pub requests: u64,
    /// HEAD requests among them.
    pub heads: u64,
    /// Body bytes received.
    pub bytes: u64,
    /// Requests sent again after a transient failure.
    pub retries: u64,
    /// Answers that asked to slow down (503, 429).
    pub throttled: u64,
    /// Time spent in requests, summed over those in flight at once.
    pub waiting_secs: f64,
    /// The mean time from sending a request to its answer's headers.
    pub first_byte_secs: f64,
    /// The objects read from their valid local copies (`remote_cache_dir`): no GET of their bytes went out.
    pub cached: Vec<String>,
    /// The objects whose local copy this load wrote.
    pub copies_written: Vec<String>,
    /// How many GETs were in flight and why (a load that read from the network).
    pub gets: Option<weightlift_io::GetsReport>,
}

/// The counters of the objects among some files, taken before a load ([`NetworkStats::of`] subtracts them).
#[derive(Clone, Debug, Default)]
pub struct NetworkBefore(Vec<Option<weightlift_remote::Stats>>);

impl NetworkStats {
    /// The counters of the objects among `files` now.
    pub fn before(files: &[std::sync::Arc<weightlift_io::OpenFile>]) -> NetworkBefore {
        NetworkBefore(files.iter().map(|f| Self::object_of(f).map(|o| o.stats())).collect())
    }

    fn object_of(f: &weightlift_io::OpenFile) -> Option<&std::sync::Arc<weightlift_remote::Object>> {
        match &f.copy {
            Some(weightlift_io::LocalCopy::Read(o)) => Some(o),
            _ => f.object(),
        }
    }

    /// What the objects among `files` did since `before` (`None` when all are local files), with the GETs in
    /// flight of the load's I/O report `io`.
    pub fn of(
        files: &[std::sync::Arc<weightlift_io::OpenFile>],
        before: &NetworkBefore,
        io: Option<&weightlift_io::IoReport>,
    ) -> Option<NetworkStats> {
        use weightlift_io::LocalCopy;
        let mut n = NetworkStats::default();
        let mut answers = 0;
        let mut first_byte = 0.0;
        for (i, f) in files.iter().enumerate() {
            let Some(o) = Self::object_of(f) else { continue };
            if matches!(f.copy, Some(LocalCopy::Read(_))) {
                n.cached.push(o.url().to_string());
            } else if f.filling().is_some_and(|c| c.published()) {
                n.copies_written.push(o.url().to_string());
            }
            let s = match before.0.get(i).copied().flatten() {
                Some(b) => o.stats().since(&b),
                None => o.stats(),
            };
            n.objects.push(o.url().to_string());
            n.requests += s.requests;
            n.heads += s.heads;
            n.bytes += s.bytes;
            n.retries += s.retries;
            n.throttled += s.throttled;
            n.waiting_secs += s.waiting.as_secs_f64();
            answers += s.answers;
            first_byte += s.first_byte.as_secs_f64();
        }
        n.first_byte_secs = if answers > 0 { first_byte / answers as f64 } else { 0.0 };
        n.gets = io.and_then(|io| io.gets.clone());
        (!n.objects.is_empty()).then_some(n)
    }

    pub fn to_json(&self) -> Value {
        let gets = self.gets.as_ref().map_or(Value::Null, |g| {
            json!({
                "setting": g.setting, "phase": g.phase.name(), "start": g.start, "last": g.last,
                "peak_target": g.peak_target, "peak_in_flight": g.peak_in_flight, "max": g.max,
                "why_max": g.why_max, "throttled": g.throttled, "why": g.why(),
                "rounds": g.rounds.iter().map(|r| json!({
                    "at_secs": r.at_secs, "target": r.target, "gbps": r.rate / 1e9, "throttled": r.throttled,
                })).collect::<Vec<_>>(),
            })
        });
        json!({
            "objects": self.objects, "requests": self.requests, "heads": self.heads, "bytes": self.bytes,
            "retries": self.retries, "throttled": self.throttled, "waiting_secs": self.waiting_secs,
            "first_byte_secs": self.first_byte_secs, "cached": self.cached, "copies_written": self.copies_written,
            "gets": gets,
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
