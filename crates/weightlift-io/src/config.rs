//! Settings of the storage engine. Each has one documented default, one `WEIGHTLIFT_*` environment variable and one
//! builder method; the value in use remembers where it came from so reports can say why it was chosen.

use std::fmt;
use std::str::FromStr;

use crate::error::IoError;

/// Where a setting's value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Default,
    Env,
    Explicit,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Default => "default",
            Source::Env => "environment",
            Source::Explicit => "set by caller",
        })
    }
}

/// A setting's value and its origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting<T> {
    pub value: T,
    pub source: Source,
}

impl<T> Setting<T> {
    const fn default(value: T) -> Self {
        Setting { value, source: Source::Default }
    }
}

/// When reads bypass the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectMode {
    /// Ranges already in the page cache are read buffered (a memory copy), the rest with O_DIRECT.
    Auto,
    /// O_DIRECT wherever the filesystem allows it.
    Always,
    /// Buffered reads only.
    Never,
}

/// Which engine submits the reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// io_uring where the kernel allows it, else `pread` workers.
    Auto,
    Uring,
    Pread,
    /// NVIDIA cuFile (GPUDirect Storage) for loads into GPU memory; host loads use `Auto`.
    Gds,
    /// GPU-initiated NVMe commands against weightlift's software controller (the checkpoint file is the
    /// namespace's backing store), for loads into GPU memory; host loads use `Auto`.
    NvmeSim,
}

impl FromStr for DirectMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(DirectMode::Auto),
            "always" | "on" | "1" | "true" => Ok(DirectMode::Always),
            "never" | "off" | "0" | "false" => Ok(DirectMode::Never),
            _ => Err("expected auto, always or never".into()),
        }
    }
}

impl FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Backend::Auto),
            "uring" | "io_uring" | "io-uring" => Ok(Backend::Uring),
            "pread" => Ok(Backend::Pread),
            "gds" | "cufile" => Ok(Backend::Gds),
            "nvme-sim" | "nvme_sim" => Ok(Backend::NvmeSim),
            _ => Err("expected auto, uring, pread, gds or nvme-sim".into()),
        }
    }
}

impl fmt::Display for DirectMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DirectMode::Auto => "auto",
            DirectMode::Always => "always",
            DirectMode::Never => "never",
        })
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Auto => "auto",
            Backend::Uring => "uring",
            Backend::Pread => "pread",
            Backend::Gds => "gds",
            Backend::NvmeSim => "nvme-sim",
        })
    }
}

/// One row of the settings table: what it is called, its variable, default and meaning.
#[derive(Clone, Copy, Debug)]
pub struct SettingDoc {
    pub name: &'static str,
    pub env: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

/// Every storage setting, for `--help`, reports and the README.
pub const SETTINGS: &[SettingDoc] = &[
    SettingDoc {
        name: "chunk_bytes",
        env: "WEIGHTLIFT_CHUNK_BYTES",
        default: "4 MiB",
        meaning: "largest buffered read and host→device copy; O_DIRECT reads take up to 4× this",
    },
    SettingDoc {
        name: "queue_depth",
        env: "WEIGHTLIFT_QUEUE_DEPTH",
        default: "1",
        meaning: "reads in flight per I/O thread",
    },
    SettingDoc {
        name: "staging_bytes",
        env: "WEIGHTLIFT_STAGING_BYTES",
        default: "256 MiB",
        meaning: "upper bound on staging (pinned) memory, whatever the checkpoint size",
    },
    SettingDoc {
        name: "threads",
        env: "WEIGHTLIFT_THREADS",
        default: "CPU count, at most 8",
        meaning: "I/O threads, each with its own ring (and CUDA stream)",
    },
    SettingDoc {
        name: "direct",
        env: "WEIGHTLIFT_DIRECT",
        default: "auto",
        meaning: "O_DIRECT policy: auto (cached ranges buffered, others direct), always, never",
    },
    SettingDoc {
        name: "host_cache_bytes",
        env: "WEIGHTLIFT_HOST_CACHE_BYTES",
        default: "1 GiB",
        meaning: "freed host buffers kept for reuse (fresh pages cost more to fault in than to fill); process-wide",
    },
    SettingDoc {
        name: "backend",
        env: "WEIGHTLIFT_IO",
        default: "auto",
        meaning: "read engine: auto (io_uring, else pread; cuFile for GPU loads where it runs peer-to-peer), uring, pread, gds (cuFile for GPU loads), nvme-sim (GPU-initiated NVMe against the software controller, GPU loads)",
    },
];

/// The storage engine's settings.
#[derive(Clone, Debug)]
pub struct IoConfig {
    pub chunk_bytes: Setting<u64>,
    pub queue_depth: Setting<u32>,
    pub staging_bytes: Setting<u64>,
    pub threads: Setting<u32>,
    pub direct: Setting<DirectMode>,
    pub backend: Setting<Backend>,
}

impl Default for IoConfig {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get() as u32);
        IoConfig {
            chunk_bytes: Setting::default(4 << 20),
            queue_depth: Setting::default(1),
            staging_bytes: Setting::default(256 << 20),
            threads: Setting::default(cpus.clamp(1, 8)),
            direct: Setting::default(DirectMode::Auto),
            backend: Setting::default(Backend::Auto),
        }
    }
}

fn env_parse<T: FromStr>(var: &'static str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Option<T>, IoError> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => {
            parse(v.trim()).map(Some).map_err(|reason| IoError::Setting { name: var, value: v, reason })
        }
        _ => Ok(None),
    }
}

/// Parses `4096`, `4k`, `4KiB`, `8MiB`, `1G`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| "expected a byte count such as 4MiB".to_string())?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("unknown unit {unit:?}")),
    };
    n.checked_mul(mult).ok_or_else(|| "too large".to_string())
}

impl IoConfig {
    /// Defaults, overridden by any `WEIGHTLIFT_*` variable that is set. A malformed value is an error naming it.
    pub fn from_env() -> Result<IoConfig, IoError> {
        let mut c = IoConfig::default();
        let env = |v| Setting { value: v, source: Source::Env };
        if let Some(v) = env_parse("WEIGHTLIFT_CHUNK_BYTES", parse_bytes)? {
            c.chunk_bytes = env(v);
        }
        if let Some(v) = env_parse("WEIGHTLIFT_QUEUE_DEPTH", |s| s.parse::<u32>().map_err(|e| e.to_string()))? {
            c.queue_depth = Setting { value: v, source: Source::Env };
        }
        if let Some(v) = env_parse("WEIGHTLIFT_STAGING_BYTES", parse_bytes)? {
            c.staging_bytes = env(v);
        }
        if let Some(v) = env_parse("WEIGHTLIFT_THREADS", |s| s.parse::<u32>().map_err(|e| e.to_string()))? {
            c.threads = Setting { value: v, source: Source::Env };
        }
        if let Some(v) = env_parse("WEIGHTLIFT_DIRECT", DirectMode::from_str)? {
            c.direct = Setting { value: v, source: Source::Env };
        }
        if let Some(v) = env_parse("WEIGHTLIFT_IO", Backend::from_str)? {
            c.backend = Setting { value: v, source: Source::Env };
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks ranges: a chunk of at least 4 KiB that is a multiple of 4 KiB, non-zero depth and threads, and a
    /// staging bound of at least one chunk.
    pub fn validate(&self) -> Result<(), IoError> {
        let bad = |name: &'static str, value: String, reason: &str| {
            Err(IoError::Setting { name, value, reason: reason.to_string() })
        };
        let chunk = self.chunk_bytes.value;
        if chunk < 4096 || chunk % 4096 != 0 || chunk > 1 << 30 {
            return bad("chunk_bytes", chunk.to_string(), "must be a multiple of 4 KiB between 4 KiB and 1 GiB");
        }
        if self.queue_depth.value == 0 || self.queue_depth.value > 4096 {
            return bad("queue_depth", self.queue_depth.value.to_string(), "must be between 1 and 4096");
        }
        if self.threads.value == 0 || self.threads.value > 256 {
            return bad("threads", self.threads.value.to_string(), "must be between 1 and 256");
        }
        if self.staging_bytes.value < chunk {
            return bad("staging_bytes", self.staging_bytes.value.to_string(), "must hold at least one chunk");
        }
        Ok(())
    }

    pub fn chunk_bytes(mut self, v: u64) -> Self {
        self.chunk_bytes = Setting { value: v, source: Source::Explicit };
        self
    }
    pub fn queue_depth(mut self, v: u32) -> Self {
        self.queue_depth = Setting { value: v, source: Source::Explicit };
        self
    }
    pub fn staging_bytes(mut self, v: u64) -> Self {
        self.staging_bytes = Setting { value: v, source: Source::Explicit };
        self
    }
    pub fn threads(mut self, v: u32) -> Self {
        self.threads = Setting { value: v, source: Source::Explicit };
        self
    }
    pub fn direct(mut self, v: DirectMode) -> Self {
        self.direct = Setting { value: v, source: Source::Explicit };
        self
    }
    pub fn backend(mut self, v: Backend) -> Self {
        self.backend = Setting { value: v, source: Source::Explicit };
        self
    }

    /// (name, value, origin) of every setting, for reports.
    pub fn describe(&self) -> Vec<(&'static str, String, Source)> {
        vec![
            ("chunk_bytes", self.chunk_bytes.value.to_string(), self.chunk_bytes.source),
            ("queue_depth", self.queue_depth.value.to_string(), self.queue_depth.source),
            ("staging_bytes", self.staging_bytes.value.to_string(), self.staging_bytes.source),
            ("threads", self.threads.value.to_string(), self.threads.source),
            ("direct", self.direct.value.to_string(), self.direct.source),
            ("backend", self.backend.value.to_string(), self.backend.source),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_parse() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("8MiB"), Ok(8 << 20));
        assert_eq!(parse_bytes("1g"), Ok(1 << 30));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("99999999999999999G").is_err());
    }

    #[test]
    fn validation_rejects_nonsense() {
        assert!(IoConfig::default().validate().is_ok());
        assert!(IoConfig::default().chunk_bytes(1000).validate().is_err());
        assert!(IoConfig::default().queue_depth(0).validate().is_err());
        assert!(IoConfig::default().staging_bytes(4096).validate().is_err());
        let c = IoConfig::default().threads(3);
        assert_eq!(c.threads, Setting { value: 3, source: Source::Explicit });
    }
}
