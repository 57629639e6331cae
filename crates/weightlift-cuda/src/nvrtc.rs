//! NVRTC, loaded at run time: checked for every symbol before cudarc touches it (cudarc panics on a missing one),
//! then used to compile CUDA source to PTX. Needs no GPU.

use cudarc::nvrtc::{CompileOptions, Ptx};

const SYMBOLS: &[&str] = &[
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcDestroyProgram",
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
/// `None`). The error carries NVRTC's log.
pub fn compile(source: &str, name: &str, arch: Option<(i32, i32)>) -> Result<Ptx, String> {
    available()?;
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
