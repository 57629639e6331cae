//! The storage engine's parameters: plain values, checked by [`IoParams::validate`]. Users set them through the
//! settings table of the `weightlift` crate (defaults, `WEIGHTLIFT_*` variables, flags, keywords), which takes its
//! defaults from [`defaults`] here.

use std::fmt;
use std::str::FromStr;

use crate::error::IoError;

/// Default values, measured on the GPU machine (docs/performance.md).
pub mod defaults {
    /// Largest buffered read and host→device copy.
    pub const CHUNK_BYTES: u64 = 4 << 20;
    /// Reads in flight per lane.
    pub const QUEUE_DEPTH: u32 = 1;
    /// Bound on staging (pinned) memory.
    pub const STAGING_BYTES: u64 = 256 << 20;
    /// Lanes: the CPU count, at most this many. Warm page-cache loads are bound by how fast the lanes copy out
    /// of the page cache: on a 16-vCPU H100 host, 8 lanes gave 23.0 GB/s to the GPU and 16 lanes 45.1
    /// (bench/results/2026-11-23-h100 at b3a4ec8/bench.json and bench-threads16.json).
    pub const MAX_THREADS: u32 = 16;

    /// Bytes of an object one GET asks for (AWS's guidance for S3 is 8-16 MB ranges; a cloud bucket's GET gets
    /// ~90 MB/s after 20-80 ms, so longer ranges spend less of their time waiting for the first byte).
    pub const REMOTE_RANGE_BYTES: u64 = 16 << 20;
    /// The most GETs a load keeps in flight when the count is found at run time (the staging bound may allow
    /// fewer).
    pub const MAX_REMOTE_CONCURRENCY: u32 = 1024;

    /// I/O threads: the CPU count, at most [`MAX_THREADS`].
    pub fn threads() -> u32 {
        std::thread::available_parallelism().map_or(4, |n| n.get() as u32).clamp(1, MAX_THREADS)
    }
}

/// When reads bypass the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectMode {
    /// Ranges already in the page cache are read buffered (a memory copy); the cache policy decides the rest.
    Auto,
    /// O_DIRECT wherever the filesystem allows it.
    Always,
    /// Buffered reads only.
    Never,
}

/// What a load leaves in the page cache (for ranges not already cached, under [`DirectMode::Auto`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachePolicy {
    /// `keep` when the files take at most half of the memory available, else `bypass`.
    Auto,
    /// Cold ranges are read buffered in large requests: the next process finds the file in the page cache.
    Keep,
    /// Cold ranges are read with O_DIRECT: the page cache is left as it was.
    Bypass,
}

/// The folio size a load asks the kernel to cache its cold ranges in (cold ranges read buffered: under
/// [`CachePolicy::Keep`], or where the file does not allow O_DIRECT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachePages {
    /// 2 MiB folios: each cold range is first populated through a `MADV_HUGEPAGE` mapping of the file, then read
    /// from the page cache. The next reader of the file (a new process) reads it faster. Where the kernel or the
    /// filesystem has no large folios the pages come out small anyway, at about the cost of plain reads.
    Huge,
    /// Whatever the kernel's readahead picks for the lanes' scattered reads (mostly 4 KiB folios).
    Base,
}

/// The page size staging memory asks the kernel for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StagingPages {
    /// 2 MiB transparent huge pages where the kernel grants them (`MADV_HUGEPAGE` on a 2 MiB-aligned region):
    /// fewer pages to fault in, zero, pin and register.
    Huge,
    /// The base page size (4 KiB).
    Base,
}

/// The page size host destinations (tensors loaded into host memory) ask the kernel for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostPages {
    /// 2 MiB pages where the kernel has enough free 2 MiB blocks to give them at once (`/proc/buddyinfo`), so that
    /// no fault waits for memory to be compacted; base pages otherwise.
    Auto,
    /// 2 MiB transparent huge pages (`MADV_HUGEPAGE`): a fault may compact memory on a fragmented host.
    Huge,
    /// The base page size (4 KiB).
    Base,
}

/// Which kernel interface submits the reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadEngine {
    /// io_uring where the kernel allows it, else `pread` threads.
    Auto,
    /// io_uring; starting the engine fails ([`IoError::UringUnavailable`]) where the kernel refuses it.
    Uring,
    /// Blocking `pread` calls, one read in flight per lane.
    Pread,
}

macro_rules! named_enum {
    ($ty:ident, $expected:literal, $($variant:ident => $name:literal $(| $alias:literal)*),+ $(,)?) => {
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s.trim().to_ascii_lowercase().as_str() {
                    $($name $(| $alias)* => Ok($ty::$variant),)+
                    _ => Err(concat!("expected ", $expected).to_string()),
                }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self { $($ty::$variant => $name,)+ })
            }
        }
    };
}

named_enum!(DirectMode, "auto, always or never", Auto => "auto", Always => "always" | "on" | "1" | "true",
    Never => "never" | "off" | "0" | "false");
named_enum!(CachePolicy, "auto, keep or bypass", Auto => "auto", Keep => "keep", Bypass => "bypass");
named_enum!(ReadEngine, "auto, uring or pread", Auto => "auto", Uring => "uring" | "io_uring" | "io-uring",
    Pread => "pread");
named_enum!(CachePages, "huge or base", Huge => "huge" | "2mib" | "on", Base => "base" | "4kib" | "off");
named_enum!(StagingPages, "huge or base", Huge => "huge" | "2mib" | "on", Base => "base" | "4kib" | "off");
named_enum!(HostPages, "auto, huge or base", Auto => "auto", Huge => "huge" | "2mib" | "on", Base => "base" | "4kib" | "off");

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
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("unknown unit {unit:?}")),
    };
    n.checked_mul(mult).ok_or_else(|| "too large".to_string())
}

/// The storage engine's parameters. `weightlift::Settings` documents each with its environment variable;
/// [`IoParams::validate`] checks the ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoParams {
    /// Largest read of cached pages and largest host→device copy, in bytes (default 4 MiB; a multiple of 4 KiB);
    /// reads of cold pages take up to four times this.
    pub chunk_bytes: u64,
    /// Reads in flight per io_uring lane (default 1).
    pub queue_depth: u32,
    /// Upper bound on the lanes' staging memory together, in bytes (default 256 MiB), whatever the load's size.
    pub staging_bytes: u64,
    /// Lanes (I/O threads), each with its own ring and staging slots (default: the CPU count, at most 16).
    pub threads: u32,
    /// When reads bypass the page cache.
    pub direct: DirectMode,
    /// What a load leaves in the page cache.
    pub cache: CachePolicy,
    /// Which kernel interface submits the reads.
    pub engine: ReadEngine,
    /// The page size staging memory asks for.
    pub staging_pages: StagingPages,
    /// The folio size asked for cold ranges read through the page cache.
    pub cache_pages: CachePages,
    /// GETs a load of objects keeps in flight: `None` finds the count at run time (see [`crate::pacer`]), up to
    /// [`defaults::MAX_REMOTE_CONCURRENCY`] and the staging bound.
    pub remote_concurrency: Option<u32>,
    /// Bytes of an object one GET asks for (default 16 MiB).
    pub remote_range_bytes: u64,
}

impl Default for IoParams {
    fn default() -> Self {
        IoParams {
            chunk_bytes: defaults::CHUNK_BYTES,
            queue_depth: defaults::QUEUE_DEPTH,
            staging_bytes: defaults::STAGING_BYTES,
            threads: defaults::threads(),
            direct: DirectMode::Auto,
            cache: CachePolicy::Auto,
            engine: ReadEngine::Auto,
            staging_pages: StagingPages::Huge,
            cache_pages: CachePages::Huge,
            remote_concurrency: None,
            remote_range_bytes: defaults::REMOTE_RANGE_BYTES,
        }
    }
}

impl IoParams {
    /// Checks ranges: a chunk of at least 4 KiB that is a multiple of 4 KiB, non-zero depth and threads, and a
    /// staging bound of at least one chunk.
    pub fn validate(&self) -> Result<(), IoError> {
        let bad = |name: &'static str, value: String, reason: &str| {
            Err(IoError::Setting { name, value, reason: reason.to_string() })
        };
        let chunk = self.chunk_bytes;
        if chunk < 4096 || !chunk.is_multiple_of(4096) || chunk > 1 << 30 {
            return bad("chunk_bytes", chunk.to_string(), "must be a multiple of 4 KiB between 4 KiB and 1 GiB");
        }
        if self.queue_depth == 0 || self.queue_depth > 4096 {
            return bad("queue_depth", self.queue_depth.to_string(), "must be between 1 and 4096");
        }
        if self.threads == 0 || self.threads > 256 {
            return bad("threads", self.threads.to_string(), "must be between 1 and 256");
        }
        if self.staging_bytes < chunk {
            return bad("staging_bytes", self.staging_bytes.to_string(), "must hold at least one chunk");
        }
        if let Some(n) = self.remote_concurrency
            && !(1..=4096).contains(&n)
        {
            return bad("remote_concurrency", n.to_string(), "must be auto or between 1 and 4096");
        }
        let range = self.remote_range_bytes;
        if !(64 << 10..=1 << 30).contains(&range) {
            return bad("remote_range_bytes", range.to_string(), "must be between 64 KiB and 1 GiB");
        }
        Ok(())
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
        let ok = IoParams::default();
        assert!(ok.validate().is_ok());
        assert!(IoParams { chunk_bytes: 1000, ..ok }.validate().is_err());
        assert!(IoParams { queue_depth: 0, ..ok }.validate().is_err());
        assert!(IoParams { staging_bytes: 4096, ..ok }.validate().is_err());
        assert!(IoParams { threads: 0, ..ok }.validate().is_err());
    }

    #[test]
    fn names_round_trip() {
        for m in [DirectMode::Auto, DirectMode::Always, DirectMode::Never] {
            assert_eq!(m.to_string().parse::<DirectMode>(), Ok(m));
        }
        for c in [CachePolicy::Auto, CachePolicy::Keep, CachePolicy::Bypass] {
            assert_eq!(c.to_string().parse::<CachePolicy>(), Ok(c));
        }
        assert_eq!("URING".parse::<ReadEngine>(), Ok(ReadEngine::Uring));
        for c in [CachePages::Huge, CachePages::Base] {
            assert_eq!(c.to_string().parse::<CachePages>(), Ok(c));
        }
        assert!("gds".parse::<ReadEngine>().is_err());
    }
}
