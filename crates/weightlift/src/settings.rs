//! Every setting of the engine, each written once: one row of the table below gives its field, type, default,
//! `WEIGHTLIFT_*` variable, parser, builder method, description and place in the list every front shows (`--help`,
//! `weightlift probe`, Python's `weightlift.SETTINGS` and keywords). A value remembers where it came from
//! ([`Setting`]), so every report says which value was used and why — copy this pattern for new settings.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use weightlift_io::params::defaults;
use weightlift_io::{CachePages, CachePolicy, DirectMode, HostPages, IoParams, ReadEngine, StagingPages, parse_bytes};

use crate::error::{Error, Result};

/// Where a setting's value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The setting's documented default.
    Default,
    /// A `WEIGHTLIFT_*` environment variable.
    Env,
    /// The caller: a builder method, a flag, a keyword.
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
    /// The value in use.
    pub value: T,
    /// Where it came from.
    pub source: Source,
}

/// Where the Python package's loads onto a GPU take their tensors' memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceMemory {
    /// PyTorch's caching allocator (on a side stream, marked used by the caller's current stream): torch accounts
    /// for the tensors, reuses their memory when they are freed and returns it on `torch.cuda.empty_cache()`, as for
    /// its own tensors.
    Torch,
    /// The device's stream-ordered pool (`cuMemAllocAsync`), what the Rust crate and the C API always use.
    Pool,
}

impl FromStr for DeviceMemory {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "torch" => Ok(DeviceMemory::Torch),
            "pool" => Ok(DeviceMemory::Pool),
            _ => Err("expected torch or pool".into()),
        }
    }
}

impl fmt::Display for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceMemory::Torch => "torch",
            DeviceMemory::Pool => "pool",
        })
    }
}

/// How GPU loads move data, and which kernel interface reads files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// io_uring (else pread) through the pinned pipeline; cuFile for GPU loads where it runs peer-to-peer.
    Auto,
    /// The pipeline, reading with io_uring.
    Uring,
    /// The pipeline, reading with blocking `pread` threads.
    Pread,
    /// NVIDIA cuFile (GPUDirect Storage) for GPU loads; host loads use the pipeline.
    Gds,
    /// GPU-initiated NVMe commands against weightlift's software controller, for GPU loads.
    NvmeSim,
}

impl FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Backend::Auto),
            "uring" | "io_uring" | "io-uring" => Ok(Backend::Uring),
            "pread" => Ok(Backend::Pread),
            "gds" | "cufile" => Ok(Backend::Gds),
            "nvme-sim" | "nvme_sim" => Ok(Backend::NvmeSim),
            _ => Err("expected auto, uring, pread, gds or nvme-sim".into()),
        }
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

impl Backend {
    /// The kernel interface the pipeline uses under this backend.
    pub fn read_engine(self) -> ReadEngine {
        match self {
            Backend::Uring => ReadEngine::Uring,
            Backend::Pread => ReadEngine::Pread,
            _ => ReadEngine::Auto,
        }
    }
}

/// A folder that may be left unset (`off`): `remote_cache_dir`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Folder(pub Option<PathBuf>);

impl FromStr for Folder {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        // A folder named "off" is written ./off.
        match s.trim() {
            "" | "off" => Ok(Folder(None)),
            path => Ok(Folder(Some(PathBuf::from(path)))),
        }
    }
}

impl fmt::Display for Folder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(p) => write!(f, "{}", p.display()),
            None => f.write_str("off"),
        }
    }
}

/// Where loads look for a keeper (`weightlift keep`): `keeper`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum KeeperSocket {
    /// At the default socket of the load's device, if one is there ([`crate::keep::default_socket`]).
    #[default]
    Auto,
    /// Never.
    Off,
    /// At this socket.
    Path(PathBuf),
}

impl FromStr for KeeperSocket {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        // A socket named "auto" or "off" is written ./auto or ./off.
        match s.trim() {
            "" | "off" => Ok(KeeperSocket::Off),
            "auto" => Ok(KeeperSocket::Auto),
            path => Ok(KeeperSocket::Path(PathBuf::from(path))),
        }
    }
}

impl fmt::Display for KeeperSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeeperSocket::Auto => f.write_str("auto"),
            KeeperSocket::Off => f.write_str("off"),
            KeeperSocket::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

/// What a load served by a keeper hands back: `keeper_mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeeperMode {
    /// A device-to-device copy into the caller's own memory: its tensors are its own.
    #[default]
    Copy,
    /// The keeper's memory itself, mapped into the caller read-only: nothing copied; the tensors must not be
    /// written, and hold the kept checkpoint in the keeper until they are freed.
    View,
}

impl FromStr for KeeperMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "copy" => Ok(KeeperMode::Copy),
            "view" => Ok(KeeperMode::View),
            _ => Err("expected copy or view".into()),
        }
    }
}

impl fmt::Display for KeeperMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeeperMode::Copy => "copy",
            KeeperMode::View => "view",
        })
    }
}

/// How many GETs a load of objects keeps in flight: `remote_concurrency`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Concurrency {
    /// Found while the load runs (see `weightlift_io::pacer`).
    #[default]
    Auto,
    /// This many.
    Fixed(u32),
}

impl FromStr for Concurrency {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Concurrency::Auto),
            n => match n.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(Concurrency::Fixed(n)),
                _ => Err("expected auto or a number of GETs (at least 1)".into()),
            },
        }
    }
}

impl fmt::Display for Concurrency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Concurrency::Auto => f.write_str("auto"),
            Concurrency::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// One row of the settings table, as the fronts show it.
#[derive(Clone, Copy, Debug)]
pub struct SettingDoc {
    /// The setting's name (`chunk_bytes`; the flag is `--chunk-bytes`).
    pub name: &'static str,
    /// Its environment variable.
    pub env: &'static str,
    /// Its default, as text.
    pub default: &'static str,
    /// What it does, in a sentence.
    pub meaning: &'static str,
    /// Values it accepts (for enumerations: nothing else is accepted), for help texts and shell completion; empty
    /// where other values are accepted too (`remote_concurrency`'s counts, `keeper`'s paths).
    pub values: &'static [&'static str],
}

/// A value shown in reports.
trait Shown {
    fn shown(&self) -> String;
}

macro_rules! shown_display {
    ($($t:ty),*) => { $(impl Shown for $t { fn shown(&self) -> String { self.to_string() } })* };
}
shown_display!(
    u32,
    u64,
    DirectMode,
    CachePolicy,
    Backend,
    StagingPages,
    CachePages,
    HostPages,
    DeviceMemory,
    Folder,
    Concurrency,
    KeeperSocket,
    KeeperMode
);

impl Shown for Option<PathBuf> {
    fn shown(&self) -> String {
        self.as_ref().map_or_else(|| "searched".to_string(), |p| p.display().to_string())
    }
}

fn bytes(s: &str) -> std::result::Result<u64, String> {
    parse_bytes(s)
}

fn count<T: FromStr>(s: &str) -> std::result::Result<T, String> {
    s.trim().parse::<T>().map_err(|_| "expected a whole number".to_string())
}

fn named<T: FromStr<Err = String>>(s: &str) -> std::result::Result<T, String> {
    s.parse::<T>()
}

fn path(s: &str) -> std::result::Result<Option<PathBuf>, String> {
    Ok(Some(PathBuf::from(s)))
}

macro_rules! settings {
    ($(
        $name:ident: $ty:ty = $default:expr, $default_text:literal,
            env $env:literal, parse $parse:expr, values $values:expr,
            $meaning:literal;
    )*) => {
        /// The engine's settings (see the module documentation).
        #[derive(Clone, Debug)]
        pub struct Settings {
            $(#[doc = $meaning] pub $name: Setting<$ty>,)*
        }

        impl Default for Settings {
            fn default() -> Self {
                Settings { $($name: Setting { value: $default, source: Source::Default },)* }
            }
        }

        /// Every setting, in the order the fronts list them.
        pub const SETTINGS: &[SettingDoc] = &[
            $(SettingDoc { name: stringify!($name), env: $env, default: $default_text, meaning: $meaning, values: $values },)*
        ];

        impl Settings {
            $(
                #[doc = concat!("Sets `", stringify!($name), "` (", $meaning, ").")]
                pub fn $name(mut self, value: $ty) -> Self {
                    self.$name = Setting { value, source: Source::Explicit };
                    self
                }
            )*

            /// Sets the setting called `name` from its text form; `Ok(false)` if no setting has that name.
            fn set_text(&mut self, name: &str, text: &str, source: Source) -> std::result::Result<bool, String> {
                match name {
                    $(stringify!($name) => {
                        self.$name = Setting { value: ($parse)(text)?, source };
                        Ok(true)
                    })*
                    _ => Ok(false),
                }
            }

            /// `(name, value, origin)` of every setting, for reports.
            pub fn describe(&self) -> Vec<(&'static str, String, Source)> {
                vec![$((stringify!($name), self.$name.value.shown(), self.$name.source),)*]
            }
        }
    };
}

settings! {
    chunk_bytes: u64 = defaults::CHUNK_BYTES, "4 MiB", env "WEIGHTLIFT_CHUNK_BYTES", parse bytes, values &[],
        "largest read of cached pages and largest host→device copy; reads of cold pages take up to 4× this";
    queue_depth: u32 = defaults::QUEUE_DEPTH, "1", env "WEIGHTLIFT_QUEUE_DEPTH", parse count::<u32>, values &[],
        "reads in flight per I/O thread";
    staging_bytes: u64 = defaults::STAGING_BYTES, "256 MiB", env "WEIGHTLIFT_STAGING_BYTES", parse bytes,
        values &[], "upper bound on staging (pinned) memory, whatever the checkpoint size";
    threads: u32 = defaults::threads(), "CPU count, at most 16", env "WEIGHTLIFT_THREADS", parse count::<u32>,
        values &[], "I/O threads (lanes), each with its own ring, staging slots and CUDA stream, kept between loads";
    direct: DirectMode = DirectMode::Auto, "auto", env "WEIGHTLIFT_DIRECT", parse named::<DirectMode>,
        values &["auto", "always", "never"],
        "O_DIRECT policy: auto (cached ranges buffered, cold ranges as the cache setting says), always, never";
    cache: CachePolicy = CachePolicy::Auto, "auto", env "WEIGHTLIFT_PAGE_CACHE", parse named::<CachePolicy>,
        values &["auto", "keep", "bypass"],
        "what a load leaves in the page cache: keep (cold ranges read buffered, warm for the next process), bypass (O_DIRECT), auto (keep when the files fit in half of the available memory)";
    backend: Backend = Backend::Auto, "auto", env "WEIGHTLIFT_BACKEND", parse named::<Backend>,
        values &["auto", "uring", "pread", "gds", "nvme-sim"],
        "data path: auto (io_uring, else pread, through the pinned pipeline; cuFile for GPU loads where it runs peer-to-peer), uring, pread, gds (cuFile for GPU loads), nvme-sim (GPU-initiated NVMe against the software controller, GPU loads)";
    staging_pages: StagingPages = StagingPages::Huge, "huge", env "WEIGHTLIFT_STAGING_PAGES",
        parse named::<StagingPages>, values &["huge", "base"],
        "page size of staging memory: huge (2 MiB transparent huge pages where the kernel grants them: a process's first load sets up faster; may compact memory on a fragmented host) or base (4 KiB; warm repeated loads measured 0-3% faster)";
    cache_pages: CachePages = CachePages::Huge, "huge", env "WEIGHTLIFT_CACHE_PAGES", parse named::<CachePages>,
        values &["huge", "base"],
        "folio size asked for the cold ranges a load reads through the page cache: huge (each cold range populated through a MADV_HUGEPAGE mapping of the file first, so the kernel caches it in 2 MiB folios where kernel and filesystem support large folios, which the next process reads faster) or base (plain buffered reads; the lanes' scattered reads leave mostly 4 KiB folios)";
    // 8 GiB: a window over the file's size keeps every lane reading while keys are taken out of order (one file of
    // 4.49 GB on an H200, bench/results/2026-11-27-h200-b: random key order 0.69 of load_file warm with 2 GiB, 0.92
    // with 8 GiB); checkpoints' shards are mostly under 5 GB. What it bounds is memory of tensors not yet taken.
    prefetch_bytes: u64 = 8 << 30, "8 GiB", env "WEIGHTLIFT_PREFETCH_BYTES", parse bytes, values &[],
        "streaming loads (safe_open): bytes read ahead of the tensors taken so far, in the destination's memory (packed loads: two decode batches ahead, or this if smaller)";
    pack_batch_bytes: u64 = 0, "0 (auto: 128 MiB; 256 MiB where nvCOMP decodes)", env "WEIGHTLIFT_PACK_BATCH_BYTES",
        parse bytes, values &[],
        "packed loads: stored bytes decoded per batch (0: 128 MiB, or 256 MiB where nvCOMP's decoders run on the GPU, which need more streams per batch to fill it)";
    pack_read_lanes: u32 = 0, "0 (three quarters of the lanes)", env "WEIGHTLIFT_PACK_READ_LANES",
        parse count::<u32>, values &[],
        "packed loads decoded on the GPU: lanes that read the stored bytes (0: three quarters of the lanes, leaving CPUs to the decoding; at most the lane count)";
    host_pages: HostPages = HostPages::Auto, "auto", env "WEIGHTLIFT_HOST_PAGES", parse named::<HostPages>,
        values &["auto", "huge", "base"],
        "page size of the host memory tensors are loaded into: auto (2 MiB transparent huge pages while the kernel has free 2 MiB blocks to give at once, read from /proc/buddyinfo, so that no fault waits for memory to be compacted; 4 KiB pages otherwise), huge (always asked for: on a fragmented host a fault may compact memory) or base (4 KiB)";
    host_cache_bytes: u64 = 1 << 30, "1 GiB", env "WEIGHTLIFT_HOST_CACHE_BYTES", parse bytes, values &[],
        "freed host buffers kept for reuse by the engine (fresh pages cost more to fault in than to fill)";
    device_cache_bytes: u64 = 0, "0", env "WEIGHTLIFT_DEVICE_CACHE_BYTES", parse bytes, values &[],
        "device memory freed by loads that the driver's pool keeps for the next load, instead of returning it to the system at the next synchronisation (the process's default pool, for every user of it; release_memory returns it)";
    device_memory: DeviceMemory = DeviceMemory::Torch, "torch", env "WEIGHTLIFT_DEVICE_MEMORY",
        parse named::<DeviceMemory>, values &["torch", "pool"],
        "where the Python package's loads onto a GPU (load_file, safe_open's get_tensors, load_gguf, weightlift.nn, weightlift.transformers; packed checkpoints excepted) take their tensors' memory: torch (PyTorch's caching allocator, on a side stream and marked used by the caller's current stream: torch counts it in memory_allocated, reuses it when the tensors are freed and returns it on empty_cache, as for its own tensors) or pool (the device's stream-ordered pool, which the Rust crate, the C API and the Python package's other GPU loads, safe_open's streamed get_tensor among them, always use; release_memory returns what it keeps)";
    cufile_lib: Option<PathBuf> = None, "searched", env "WEIGHTLIFT_CUFILE_LIB", parse path, values &[],
        "path of libcufile to load (searched in the CUDA and Python-wheel folders otherwise); the first engine to open cuFile in a process decides";
    remote_retries: u32 = weightlift_remote::DEFAULT_RETRIES, "8", env "WEIGHTLIFT_REMOTE_RETRIES", parse count::<u32>, values &[],
        "objects (URLs): retries of a request after a transient failure (5xx, throttling, a reset, a timeout, a body cut short), each after a doubling backoff from 50 ms to 2 s; a cut body resumes where it stopped; process-wide, set by the last engine made";
    remote_timeout_secs: u32 = weightlift_remote::DEFAULT_TIMEOUT_SECS, "60", env "WEIGHTLIFT_REMOTE_TIMEOUT_SECS", parse count::<u32>, values &[],
        "objects (URLs): longest time one request may take, from sending it to the last byte of its body, before it counts as a transient failure; process-wide, set by the last engine made";
    remote_concurrency: Concurrency = Concurrency::Auto, "auto", env "WEIGHTLIFT_REMOTE_CONCURRENCY",
        parse named::<Concurrency>, values &[],
        "objects (URLs): ranged GETs a load keeps in flight: auto (128 at first, doubled each round of GETs while the rate still rises, halved when more than 5 % of a round's answers are 503 or 429, within what staging_bytes holds at two 512 KiB parts per GET: 256 with the default; at most 1024) or a fixed count";
    remote_range_bytes: u64 = weightlift_io::params::defaults::REMOTE_RANGE_BYTES, "16 MiB",
        env "WEIGHTLIFT_REMOTE_RANGE_BYTES", parse bytes, values &[],
        "objects (URLs): bytes one ranged GET asks for (a cloud bucket answers each GET after 20-80 ms and gives it ~90 MB/s: longer ranges spend less of their time waiting; AWS advises 8-16 MB for S3)";
    remote_cache_dir: Folder = Folder(None), "off", env "WEIGHTLIFT_REMOTE_CACHE_DIR", parse named::<Folder>,
        values &[],
        "objects (URLs): a folder of local copies (off: none); a load of a whole object also writes its bytes to DIR/SCHEME/BUCKET/KEY as they arrive, published atomically and durably once the load succeeded, and a later load of the object is a local load while its ETag is unchanged (an object without an ETag is never cached)";
    keeper: KeeperSocket = KeeperSocket::Auto, "auto", env "WEIGHTLIFT_KEEPER", parse named::<KeeperSocket>,
        values &[],
        "the keeper (`weightlift keep`) whole loads of local files ask first: auto (the one at the device's default socket, if running), off, or a socket path; a checkpoint it keeps is copied from its memory (or mapped: keeper_mode), any other load reads the files as usual and its report says why";
    keeper_mode: KeeperMode = KeeperMode::Copy, "copy", env "WEIGHTLIFT_KEEPER_MODE", parse named::<KeeperMode>,
        values &["copy", "view"],
        "what a load the keeper serves hands back: copy (a device-to-device copy into the caller's own memory) or view (the keeper's memory mapped read-only: nothing copied, tensors that must not be written and that hold the checkpoint in the keeper until freed)";
}

/// Settings given by name and text (command-line flags, Python keywords), applied over defaults and the
/// environment by [`Settings::resolve`]. Every front builds one of these; none parses a setting itself.
#[derive(Clone, Debug, Default)]
pub struct Overrides(Vec<(String, String)>);

impl Overrides {
    /// No overrides.
    pub fn new() -> Overrides {
        Overrides::default()
    }

    /// Adds `name = text` (a later value for the same name wins).
    pub fn set(&mut self, name: impl Into<String>, text: impl Into<String>) -> &mut Self {
        self.0.push((name.into(), text.into()));
        self
    }

    /// Whether nothing was set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Settings {
    /// Defaults, then every `WEIGHTLIFT_*` variable that is set, then `overrides`. A malformed value or an unknown
    /// name is an error naming it; the result is validated.
    pub fn resolve(overrides: &Overrides) -> Result<Settings> {
        let mut s = Settings::default();
        for doc in SETTINGS {
            if let Ok(v) = std::env::var(doc.env)
                && !v.trim().is_empty()
            {
                s.set_text(doc.name, v.trim(), Source::Env).map_err(|reason| invalid(doc.env, &v, reason))?;
            }
        }
        for (name, text) in &overrides.0 {
            match s.set_text(name, text, Source::Explicit) {
                Ok(true) => {}
                Ok(false) => {
                    let known: Vec<&str> = SETTINGS.iter().map(|d| d.name).collect();
                    return Err(Error::InvalidArgument(format!(
                        "unknown setting {name:?}; known: {}",
                        known.join(", ")
                    )));
                }
                Err(reason) => return Err(invalid(name, text, reason)),
            }
        }
        s.validate()?;
        Ok(s)
    }

    /// Defaults overridden by the environment.
    pub fn from_env() -> Result<Settings> {
        Settings::resolve(&Overrides::new())
    }

    /// The storage engine's parameters.
    pub fn io_params(&self) -> IoParams {
        IoParams {
            chunk_bytes: self.chunk_bytes.value,
            queue_depth: self.queue_depth.value,
            staging_bytes: self.staging_bytes.value,
            threads: self.threads.value,
            direct: self.direct.value,
            cache: self.cache.value,
            engine: self.backend.value.read_engine(),
            staging_pages: self.staging_pages.value,
            cache_pages: self.cache_pages.value,
            remote_concurrency: match self.remote_concurrency.value {
                Concurrency::Auto => None,
                Concurrency::Fixed(n) => Some(n),
            },
            remote_range_bytes: self.remote_range_bytes.value,
        }
    }

    /// Checks every value's range.
    pub fn validate(&self) -> Result<()> {
        self.io_params().validate()?;
        if self.remote_timeout_secs.value == 0 {
            return Err(Error::InvalidArgument("remote_timeout_secs 0: expected at least 1 second".into()));
        }
        Ok(())
    }

    /// How requests to objects behave under these settings.
    pub fn remote_config(&self) -> weightlift_remote::Config {
        weightlift_remote::Config {
            retries: self.remote_retries.value,
            timeout: std::time::Duration::from_secs(u64::from(self.remote_timeout_secs.value)),
            ..weightlift_remote::Config::default()
        }
    }

    /// Who chose the backend, for reports.
    pub fn backend_origin(&self) -> &'static str {
        match self.backend.source {
            Source::Env => "WEIGHTLIFT_BACKEND",
            Source::Explicit => "the caller",
            Source::Default => "default",
        }
    }
}

fn invalid(name: &str, value: &str, reason: String) -> Error {
    Error::Io(weightlift_io::IoError::Setting {
        name: SETTINGS.iter().find(|d| d.name == name || d.env == name).map_or("setting", |d| d.name),
        value: value.to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_parses_its_default_and_round_trips() {
        let d = Settings::default();
        for (name, value, source) in d.describe() {
            assert_eq!(source, Source::Default);
            let mut s = Settings::default();
            if name == "cufile_lib" {
                continue;
            }
            assert_eq!(s.set_text(name, &value, Source::Explicit), Ok(true), "{name}={value}");
            assert_eq!(s.describe().iter().find(|r| r.0 == name).map(|r| r.1.clone()), Some(value));
        }
        assert_eq!(SETTINGS.len(), d.describe().len());
    }

    #[test]
    fn overrides_win_and_name_their_source() {
        let mut o = Overrides::new();
        o.set("threads", "3").set("chunk_bytes", "8MiB").set("backend", "pread");
        let s = Settings::resolve(&o).unwrap();
        assert_eq!(s.threads, Setting { value: 3, source: Source::Explicit });
        assert_eq!(s.chunk_bytes.value, 8 << 20);
        assert_eq!(s.io_params().engine, ReadEngine::Pread);
    }

    #[test]
    fn bad_values_and_names_are_errors_naming_them() {
        let mut o = Overrides::new();
        o.set("chunk_bytes", "lots");
        assert!(Settings::resolve(&o).unwrap_err().to_string().contains("chunk_bytes"));
        let mut o = Overrides::new();
        o.set("chunk", "4MiB");
        let e = Settings::resolve(&o).unwrap_err().to_string();
        assert!(e.contains("unknown setting \"chunk\"") && e.contains("chunk_bytes"), "{e}");
        let mut o = Overrides::new();
        o.set("queue_depth", "0");
        assert!(Settings::resolve(&o).is_err());
    }

    #[test]
    fn named_settings_take_their_values_and_refuse_others() {
        for doc in SETTINGS.iter().filter(|d| !d.values.is_empty()) {
            for v in doc.values {
                let mut o = Overrides::new();
                o.set(doc.name, *v);
                assert!(Settings::resolve(&o).is_ok(), "{}={v}", doc.name);
            }
            let mut o = Overrides::new();
            o.set(doc.name, "neither");
            let e = Settings::resolve(&o).unwrap_err().to_string();
            assert!(e.contains(doc.name) && e.contains("expected"), "{e}");
        }
        let mut o = Overrides::new();
        o.set("device_memory", "pool");
        assert_eq!(Settings::resolve(&o).unwrap().device_memory.value, DeviceMemory::Pool);
        assert_eq!(Settings::default().device_memory.value, DeviceMemory::Torch);
    }
}
