//! NVRTC, loaded at run time: checked for every symbol before cudarc touches it (cudarc panics on a missing one),
//! then used to compile CUDA source to PTX. Needs no GPU.
//!
//! What it compiles is kept: for the process, and on disk (`kernels/` under `WEIGHTLIFT_CACHE`, else
//! `$XDG_CACHE_HOME/weightlift`, else `~/.cache/weightlift`), keyed by the source, its name, the target
//! architecture and NVRTC's version. Compiling the unpack kernels cost every fresh process 65-75 ms on its first
//! packed or checked load (0.090-0.104 s against 0.023-0.028 s for its second, H100,
//! bench/results/2026-11-28-h100-a); the driver keeps its own compilation of the PTX across processes.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Mutex;

use cudarc::nvrtc::{CompileOptions, Ptx};

const SYMBOLS: &[&str] = &[
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcDestroyProgram",
    "nvrtcVersion",
];

/// Whether NVRTC can be loaded with every symbol the compiler calls; never panics.
pub fn available() -> Result<(), String> {
    // SAFETY: only tries to dlopen candidate library names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(
            "no NVRTC library (libnvrtc.so) found: install the CUDA toolkit's nvrtc or put it on LD_LIBRARY_PATH"
                .into(),
        );
    }
    // SAFETY: `is_culib_present` found the library, so `culib` returns it without panicking.
    let lib = unsafe { cudarc::nvrtc::sys::culib() };
    // SAFETY: looking a symbol up does not call it.
    let missing: Vec<&str> =
        SYMBOLS.iter().copied().filter(|s| unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err()).collect();
    if missing.is_empty() { Ok(()) } else { Err(format!("the NVRTC library lacks {}", missing.join(", "))) }
}

/// Compiles `source` (named `name` in messages) to PTX for compute capability `arch` (NVRTC's default when
/// `None`), or takes it from the process's or the disk's cache (see the module's doc). The error carries NVRTC's
/// log.
pub fn compile(source: &str, name: &str, arch: Option<(i32, i32)>) -> Result<Ptx, String> {
    static MEMO: Mutex<Option<HashMap<u64, String>>> = Mutex::new(None);
    available()?;
    let key = cache_key(source, name, arch);
    if let Some(text) = MEMO.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).get(&key) {
        return Ok(Ptx::from_src(text.clone()));
    }
    let file = cache_dir().map(|d| d.join(format!("{name}-{key:016x}.ptx")));
    let cached = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()).filter(|t| looks_like_ptx(t));
    let text = match cached {
        Some(text) => text,
        None => {
            let text = compile_uncached(source, name, arch)?.to_src();
            if let Some(f) = &file {
                store(f, &text);
            }
            text
        }
    };
    MEMO.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).insert(key, text.clone());
    Ok(Ptx::from_src(text))
}

fn compile_uncached(source: &str, name: &str, arch: Option<(i32, i32)>) -> Result<Ptx, String> {
    let mut options = vec!["--std=c++17".to_string()];
    if let Some((major, minor)) = arch {
        options.push(format!("--gpu-architecture=compute_{major}{minor}"));
    }
    let opts = CompileOptions { options, name: Some(name.into()), ..CompileOptions::default() };
    let source = source.to_string();
    // cudarc unwraps inside (the compile log, NUL checks): a panic there is an error here.
    std::panic::catch_unwind(move || cudarc::nvrtc::compile_ptx_with_opts(source, opts))
        .map_err(|_| "NVRTC panicked".to_string())?
        .map_err(|e| match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        })
}

/// The cache key: the source, its name, the target and NVRTC's version (another NVRTC may emit other PTX).
fn cache_key(source: &str, name: &str, arch: Option<(i32, i32)>) -> u64 {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: `available` checked that the library has nvrtcVersion; both out-pointers are valid.
    let _ = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (source, name, arch, major, minor, env!("CARGO_PKG_VERSION")).hash(&mut h);
    h.finish()
}

fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("WEIGHTLIFT_CACHE").map(PathBuf::from).or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("weightlift"))
    })?;
    Some(base.join("kernels"))
}

/// A cached file is used only if it is whole PTX (a write cut short is compiled again).
fn looks_like_ptx(text: &str) -> bool {
    text.contains(".version") && text.contains(".target") && text.trim_end().ends_with('}')
}

/// Writes the PTX under a temporary name and renames it into place, so that readers never see part of it; a cache
/// that cannot be written only costs the next process a compilation.
fn store(file: &std::path::Path, text: &str) {
    let write = || -> std::io::Result<()> {
        let dir = file.parent().ok_or(std::io::ErrorKind::NotFound)?;
        std::fs::create_dir_all(dir)?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".{}-{n}.tmp", std::process::id()));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, file)
    };
    if let Err(e) = write() {
        tracing::debug!("kernel cache not written ({}): {e}", file.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_ptx_is_taken_from_the_cache() {
        let whole = "//\n.version 8.0\n.target sm_90\n.visible .entry f() {\n ret;\n}\n";
        assert!(looks_like_ptx(whole));
        assert!(!looks_like_ptx(&whole[..whole.len() - 4]), "a write cut short");
        assert!(!looks_like_ptx(""));
    }
}
