//! NVRTC, loaded at run time: checked for every symbol before cudarc touches it (cudarc panics on a missing one),
//! then used to compile CUDA source to PTX. Needs no GPU.
//!
//! What it compiles is kept: for the process, and on disk (`kernel_cache`: refusing anything there that is not a
//! regular file of a sane size), keyed by the source, its name, the target architecture and NVRTC's version.
//! Compiling the unpack kernels cost every fresh process 65-75 ms on its first packed or checked load (0.090-0.104 s
//! against 0.023-0.028 s for its second, H100, bench/results/2026-11-28-h100-a); the driver keeps its own
//! compilation of the PTX across processes.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use cudarc::nvrtc::{CompileOptions, Ptx};

use crate::kernel_cache;

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
    let file = kernel_cache::dir().map(|d| d.join(format!("{name}-{key:016x}.ptx")));
    let cached = file
        .as_deref()
        .and_then(kernel_cache::read)
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .filter(|t| looks_like_ptx(t));
    let text = match cached {
        Some(text) => text,
        None => {
            let text = compile_uncached(source, name, arch)?.to_src();
            if let Some(f) = &file {
                kernel_cache::store(f, text.as_bytes());
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

/// A cached file is used only if it is whole PTX (a write cut short is compiled again).
fn looks_like_ptx(text: &str) -> bool {
    text.contains(".version") && text.contains(".target") && text.trim_end().ends_with('}')
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
