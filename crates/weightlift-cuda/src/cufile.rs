//! Finding NVIDIA's cuFile library (GPUDirect Storage) at run time. cudarc's loader does not try `libcufile.so.0`,
//! the name NVIDIA's Python wheels ship, so weightlift searches itself: `WEIGHTLIFT_CUFILE_LIB`, then the loader's
//! own search path, then CUDA's library folders, then Python environments' `nvidia/cu*/lib`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Library names tried on the loader's search path.
const NAMES: &[&str] = &["libcufile.so", "libcufile.so.0", "libcufile.so.1"];

/// Where cuFile was found, or every place tried.
#[derive(Clone, Debug)]
pub struct CufileLocation {
    /// The name or path that loaded.
    pub found: Option<String>,
    /// Everything tried, in order.
    pub tried: Vec<String>,
    /// Why the last attempt failed.
    pub error: Option<String>,
}

fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/usr/local") {
        let mut cuda: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("cuda")))
            .collect();
        cuda.sort();
        dirs.extend(
            cuda.into_iter().flat_map(|c| [c.join("lib64"), c.join("lib"), c.join("targets/x86_64-linux/lib")]),
        );
    }
    // Python environments: the active virtualenv, then interpreter prefixes named on PATH.
    let mut prefixes: Vec<PathBuf> = std::env::var_os("VIRTUAL_ENV").map(PathBuf::from).into_iter().collect();
    if let Some(path) = std::env::var_os("PATH") {
        prefixes.extend(
            std::env::split_paths(&path)
                .filter(|p| p.join("python3").exists())
                .filter_map(|p| p.parent().map(Path::to_path_buf)),
        );
    }
    for prefix in prefixes {
        for lib in ["lib", "lib64"] {
            let Ok(pys) = std::fs::read_dir(prefix.join(lib)) else { continue };
            for py in pys.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("python3")) {
                let nvidia = py.path().join("site-packages/nvidia");
                let Ok(kits) = std::fs::read_dir(&nvidia) else { continue };
                for kit in kits.flatten() {
                    dirs.push(kit.path().join("lib"));
                }
            }
        }
    }
    dirs.retain(|d| d.is_dir());
    dirs.dedup();
    dirs
}

/// Tries to load cuFile; the library handle is kept for the life of the process once found.
pub fn locate() -> (CufileLocation, Option<&'static libloading::Library>) {
    static FOUND: OnceLock<(CufileLocation, Option<libloading::Library>)> = OnceLock::new();
    let (loc, lib) = FOUND.get_or_init(|| {
        let mut candidates: Vec<String> = Vec::new();
        if let Some(p) = std::env::var_os("WEIGHTLIFT_CUFILE_LIB") {
            candidates.push(p.to_string_lossy().into_owned());
        }
        candidates.extend(NAMES.iter().map(|n| n.to_string()));
        for d in candidate_dirs() {
            for n in NAMES {
                let p = d.join(n);
                if p.exists() {
                    candidates.push(p.to_string_lossy().into_owned());
                }
            }
        }
        let mut loc = CufileLocation { found: None, tried: Vec::new(), error: None };
        for c in candidates {
            loc.tried.push(c.clone());
            // SAFETY: loading cuFile runs its initialisers, which only set up the library's own state.
            match unsafe { libloading::Library::new(&c) } {
                Ok(lib) => {
                    loc.found = Some(c);
                    loc.error = None;
                    return (loc, Some(lib));
                }
                Err(e) => loc.error = Some(e.to_string()),
            }
        }
        (loc, None)
    });
    (loc.clone(), lib.as_ref())
}
