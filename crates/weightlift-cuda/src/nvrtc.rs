//! NVRTC, loaded at run time: checked for every symbol before cudarc touches it (cudarc panics on a missing one),
//! then used to compile CUDA source to PTX (needs no GPU) or, for a device at hand, to its machine code
//! ([`load_module`]: CUBIN, which the driver loads without compiling; PTX where that fails).
//!
//! What it compiles is kept: for the process, and on disk (`kernel_cache`: refusing anything there that is not a
//! regular file of a sane size), keyed by the source, its name, the target architecture and NVRTC's version.
//! Compiling the unpack kernels cost every fresh process 65-75 ms on its first packed or checked load (0.090-0.104 s
//! against 0.023-0.028 s for its second, H100, bench/results/2026-11-28-h100-a); the driver keeps its own
//! compilation of the PTX across processes.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaModule;
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
    let lib = nvrtc_library().ok_or_else(|| {
        String::from(
            "no NVRTC library (libnvrtc.so) found: install the CUDA toolkit's nvrtc or put it on LD_LIBRARY_PATH",
        )
    })?;
    let missing = crate::library::missing_symbols(lib, SYMBOLS);
    if missing.is_empty() { Ok(()) } else { Err(format!("the NVRTC library lacks {}", missing.join(", "))) }
}

fn nvrtc_library() -> Option<&'static libloading::Library> {
    static NVRTC: std::sync::OnceLock<Option<libloading::Library>> = std::sync::OnceLock::new();
    crate::library::cudarc_library(&NVRTC, "nvrtc")
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
    ptx_key(source, name, arch, nvrtc_version())
}

fn ptx_key(source: &str, name: &str, arch: Option<(i32, i32)>, (major, minor): (i32, i32)) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (source, name, arch, major, minor, env!("CARGO_PKG_VERSION")).hash(&mut h);
    h.finish()
}

/// NVRTC's version; call after [`available`].
fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: `available` checked that the library has nvrtcVersion; both out-pointers are valid.
    let _ = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
}

/// Loads the kernels of `source` (named `name` in messages) on `gpu`, whose context the calling thread keeps
/// current afterwards only if it was. As machine code (CUBIN) for exactly the device's architecture where NVRTC
/// can make it: the driver then loads it as it is, where PTX is compiled by the driver's JIT in every fresh
/// process (its own cache aside). The CUBIN is kept on disk beside the PTX, keyed by the source, the exact
/// architecture, NVRTC's and the driver's versions and weightlift's own (see `cubin_key`). Any step of
/// that route failing (an NVRTC without `nvrtcGetCUBIN`, an architecture it does not know, a driver refusing the
/// image) falls back to the PTX of [`compile`].
pub fn load_module(gpu: &crate::Gpu, source: &str, name: &str) -> Result<Arc<CudaModule>, String> {
    let info = gpu.info();
    let arch = info.compute_capability;
    let _restore = crate::ContextRestore::save(); // loading a module binds the context on this thread
    gpu.bind().map_err(|e| e.to_string())?;
    match cubin(source, name, arch, info.driver_version) {
        Ok(image) => match gpu.context().load_module(Ptx::from_binary(image)) {
            Ok(module) => return Ok(module),
            Err(e) => tracing::debug!("{name}: the driver refused the CUBIN ({e}); loading the PTX"),
        },
        Err(e) => tracing::debug!("{name}: no CUBIN for sm_{}{} ({e}); loading the PTX", arch.0, arch.1),
    }
    let ptx = compile(source, name, Some(arch))?;
    gpu.context().load_module(ptx).map_err(|e| format!("loading {name}: {e}"))
}

/// The key of a cached CUBIN: what the PTX's key holds, for an exact architecture, and the driver's version (a
/// CUBIN runs on the architecture it was made for, and a newer driver may refuse an image an older NVRTC made for
/// it, or an older driver one from a newer NVRTC).
fn cubin_key(source: &str, name: &str, arch: (i32, i32), nvrtc: (i32, i32), driver_version: i32) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ("cubin", source, name, arch, nvrtc, driver_version, env!("CARGO_PKG_VERSION")).hash(&mut h);
    h.finish()
}

/// Where the CUBIN of `name` with `key` is kept, under the cache folder `dir`.
fn cubin_path(dir: &std::path::Path, name: &str, key: u64) -> std::path::PathBuf {
    dir.join(format!("{name}-{key:016x}-sm.cubin"))
}

/// A cached file is used only if it is an ELF image, as a CUBIN is (a write cut short, or anything else, is
/// compiled again; the driver checks the rest).
fn looks_like_cubin(bytes: &[u8]) -> bool {
    bytes.len() > 64 && bytes.starts_with(b"\x7fELF")
}

/// The CUBIN of `source` for `arch`, from the disk's cache or NVRTC.
fn cubin(source: &str, name: &str, arch: (i32, i32), driver_version: i32) -> Result<Vec<u8>, String> {
    available()?;
    let key = cubin_key(source, name, arch, nvrtc_version(), driver_version);
    let file = kernel_cache::dir().map(|d| cubin_path(&d, name, key));
    if let Some(image) = file.as_deref().and_then(kernel_cache::read).filter(|b| looks_like_cubin(b)) {
        return Ok(image);
    }
    let image = compile_cubin(source, name, arch)?;
    if !looks_like_cubin(&image) {
        return Err("NVRTC's CUBIN is no ELF image".into());
    }
    if let Some(f) = &file {
        kernel_cache::store(f, &image);
    }
    Ok(image)
}

fn compile_cubin(source: &str, name: &str, (major, minor): (i32, i32)) -> Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result, sys};
    let lib = nvrtc_library().ok_or_else(|| String::from("no NVRTC library"))?;
    if let Some(symbol) = crate::library::missing_symbols(lib, &["nvrtcGetCUBINSize", "nvrtcGetCUBIN"]).first() {
        return Err(format!("this NVRTC lacks {symbol}"));
    }
    let src = std::ffi::CString::new(source).map_err(|e| e.to_string())?;
    let cname = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, Some(&cname)).map_err(|e| format!("nvrtcCreateProgram: {e:?}"))?;
    let options = ["--std=c++17".to_string(), format!("--gpu-architecture=sm_{major}{minor}")];
    let image = (|| {
        // SAFETY: `prog` was created above and is destroyed only below.
        unsafe { result::compile_program(prog, &options) }.map_err(|e| {
            // SAFETY: as above.
            let log = unsafe { result::get_program_log(prog) }.unwrap_or_default();
            let log: Vec<u8> = log.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
            format!("{e:?}: {}", String::from_utf8_lossy(&log))
        })?;
        let mut len = 0usize;
        // SAFETY: `prog` is compiled; the out-pointer is valid.
        unsafe { sys::nvrtcGetCUBINSize(prog, &mut len) }.result().map_err(|e| format!("nvrtcGetCUBINSize: {e:?}"))?;
        if len == 0 || len as u64 > kernel_cache::MAX_ENTRY {
            return Err(format!("a CUBIN of {len} bytes"));
        }
        let mut image = vec![0u8; len];
        // SAFETY: `image` holds the `len` bytes NVRTC said the CUBIN has.
        unsafe { sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()) }
            .result()
            .map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))?;
        Ok(image)
    })();
    // SAFETY: `prog` was created above and is destroyed once, here.
    let _ = unsafe { result::destroy_program(prog) };
    image
}

/// A cached file is used only if it is whole PTX (a write cut short is compiled again).
fn looks_like_ptx(text: &str) -> bool {
    text.contains(".version") && text.contains(".target") && text.trim_end().ends_with('}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cubin_is_kept_per_driver_architecture_and_source() {
        let key = |source: &str, arch, nvrtc, driver| cubin_key(source, "k.cu", arch, nvrtc, driver);
        let base = key("src", (9, 0), (13, 0), 13000);
        assert_eq!(base, key("src", (9, 0), (13, 0), 13000), "the key is stable");
        for other in [
            key("src2", (9, 0), (13, 0), 13000),
            key("src", (8, 9), (13, 0), 13000),
            key("src", (9, 0), (12, 8), 13000),
            key("src", (9, 0), (13, 0), 13010),
        ] {
            assert_ne!(base, other);
        }
        assert_ne!(base, ptx_key("src", "k.cu", Some((9, 0)), (13, 0)), "a CUBIN never reads as PTX");
        let dir = std::path::Path::new("/cache/weightlift/kernels");
        let path = cubin_path(dir, "k.cu", base);
        assert_eq!(path.parent(), Some(dir));
        assert!(path.extension().is_some_and(|e| e == "cubin"), "{}", path.display());
        assert!(looks_like_cubin(&[b"\x7fELF".as_slice(), &[0u8; 100]].concat()));
        assert!(!looks_like_cubin(b"\x7fELF"), "cut short");
        assert!(!looks_like_cubin(&[b".version 8.0".as_slice(), &[0u8; 100]].concat()), "PTX");
    }

    #[test]
    fn only_whole_ptx_is_taken_from_the_cache() {
        let whole = "//\n.version 8.0\n.target sm_90\n.visible .entry f() {\n ret;\n}\n";
        assert!(looks_like_ptx(whole));
        assert!(!looks_like_ptx(&whole[..whole.len() - 4]), "a write cut short");
        assert!(!looks_like_ptx(""));
    }
}
