//! Finding and binding NVIDIA's run-time libraries (cuFile, nvCOMP) that cudarc does not load for weightlift: where
//! to look, loading the first candidate that loads, and looking symbols up before any is called. A missing library
//! or symbol is an error with the reason, never a panic. The libraries cudarc does use (the driver, NVRTC) are
//! opened here too, for the checks made before cudarc touches them.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Folders NVIDIA libraries are found in: CUDA's library folders, then the `nvidia/*/lib{,64}` folders of Python
/// environments (the active virtualenv, interpreter prefixes on PATH, and `PYTHONPATH` entries such as a
/// `pip install --target` folder). Shared by the loaders of cuFile and nvCOMP.
pub(crate) fn candidate_dirs() -> Vec<PathBuf> {
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
    let mut site_dirs: Vec<PathBuf> =
        std::env::var_os("PYTHONPATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    for prefix in prefixes {
        for lib in ["lib", "lib64"] {
            let Ok(pys) = std::fs::read_dir(prefix.join(lib)) else { continue };
            site_dirs.extend(
                pys.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                    .map(|py| py.path().join("site-packages")),
            );
        }
    }
    for site in site_dirs {
        let Ok(kits) = std::fs::read_dir(site.join("nvidia")) else { continue };
        for kit in kits.flatten() {
            dirs.push(kit.path().join("lib"));
            dirs.push(kit.path().join("lib64"));
        }
    }
    dirs.retain(|d| d.is_dir());
    dirs.dedup();
    dirs
}

/// Candidates for a library of the given file `names`: `explicit` first, then each name on the loader's search
/// path, then each name found in [`candidate_dirs`].
pub(crate) fn candidates(explicit: Option<&Path>, names: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = explicit.map(|p| p.to_string_lossy().into_owned()).into_iter().collect();
    out.extend(names.iter().map(|n| n.to_string()));
    for d in candidate_dirs() {
        for n in names {
            let p = d.join(n);
            if p.exists() {
                out.push(p.to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// The first of `candidates` that loads, with its name; or every candidate tried and the last loader error.
pub(crate) fn load_first(candidates: &[String]) -> Result<(String, libloading::Library), String> {
    let mut last = String::from("no candidate");
    for c in candidates {
        // SAFETY: loading an NVIDIA library runs its initialisers, which only set up the library's own state.
        match unsafe { libloading::Library::new(c) } {
            Ok(lib) => return Ok((c.clone(), lib)),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

/// Looks up `name` in `lib` as a value of type `T` (a function pointer of the symbol's C signature).
pub(crate) fn sym<T: Copy>(lib: &'static libloading::Library, name: &str) -> Result<T, String> {
    // SAFETY: the symbol is looked up by its documented C name and used with the matching C signature (`T`).
    unsafe { lib.get::<T>(name.as_bytes()) }.map(|s| *s).map_err(|e| format!("missing {name}: {e}"))
}

/// The library cudarc uses for `stem` (`cuda`, `nvrtc`), opened by weightlift (once per process) to check it and
/// its symbols before cudarc calls them. cudarc's own handle exists only where it loads CUDA at run time; a build
/// that also holds candle's `cuda` feature links CUDA instead, and the library is then already in the process.
/// The names are those cudarc tries on Linux, in its order (`libcuda.so`, then `.so.13` down to `.so.1`), so the
/// file opened is the one cudarc uses. `None` when none loads.
pub(crate) fn cudarc_library(
    slot: &'static OnceLock<Option<libloading::Library>>,
    stem: &str,
) -> Option<&'static libloading::Library> {
    slot.get_or_init(|| {
        let mut names = vec![format!("lib{stem}.so")];
        names.extend(["13", "12", "11", "10", "9", "1"].iter().map(|v| format!("lib{stem}.so.{v}")));
        load_first(&names).ok().map(|(_, lib)| lib)
    })
    .as_ref()
}

/// Those of `names` that `lib` lacks (looking a symbol up never calls it).
pub(crate) fn missing_symbols<'a>(lib: &libloading::Library, names: &[&'a str]) -> Vec<&'a str> {
    // SAFETY: looking a symbol up does not call it; the pointer type is never used.
    names.iter().copied().filter(|name| unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err()).collect()
}
