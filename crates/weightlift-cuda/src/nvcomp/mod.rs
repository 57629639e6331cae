//! NVIDIA's nvCOMP (GPU compression), found and bound at run time like cuFile: `WEIGHTLIFT_NVCOMP_LIB`, the loader's
//! search path, CUDA's library folders, then Python environments' `nvidia/*/lib{,64}` (the `nvidia-libnvcomp-cu13`
//! wheel puts `libnvcomp.so.6` in `nvidia/libnvcomp/lib64`). Every symbol is looked up before use; a missing library
//! or symbol is an error with the reason, never a panic.
//!
//! Only the low-level batched C API is bound: per codec `…GetRequiredAlignments`, `…GetTempSize`,
//! `…DecompressAsync`, and for benchmarks `…CompressAsync` with its sizing calls. All codecs share one signature
//! shape in nvCOMP 5 and 6; their option structs are 64 bytes passed by value, built here byte by byte.

mod sys;

use std::ffi::{CStr, c_void};
use std::sync::OnceLock;

use cudarc::driver::sys::CUstream;

pub use crate::error::NvcompError;
pub use sys::Alignments;
use sys::{CodecApi, FnProps, FnStatusString, Opts, Properties, Status};

use crate::library::sym;

/// Library names tried on the loader's search path and in the candidate folders.
const NAMES: &[&str] = &["libnvcomp.so.6", "libnvcomp.so.5", "libnvcomp.so"];

/// A codec nvCOMP decodes on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NvCodec {
    /// Standard zstd frames (what the `zstd` crate writes).
    Zstd,
    /// Standard LZ4 blocks.
    Lz4,
    /// Raw deflate (RFC 1951).
    Deflate,
    /// Snappy (raw).
    Snappy,
    /// NVIDIA's GPU-friendly deflate variant.
    Gdeflate,
    /// NVIDIA's rANS entropy coder.
    Ans,
    /// NVIDIA's floating-point / integer coder.
    Bitcomp,
}

impl NvCodec {
    /// Every codec, in declaration order.
    pub const ALL: [NvCodec; 7] = [
        NvCodec::Zstd,
        NvCodec::Lz4,
        NvCodec::Deflate,
        NvCodec::Snappy,
        NvCodec::Gdeflate,
        NvCodec::Ans,
        NvCodec::Bitcomp,
    ];

    /// The name in nvCOMP's symbols (`nvcompBatched<Name>DecompressAsync`).
    pub fn symbol_name(self) -> &'static str {
        match self {
            NvCodec::Zstd => "Zstd",
            NvCodec::Lz4 => "LZ4",
            NvCodec::Deflate => "Deflate",
            NvCodec::Snappy => "Snappy",
            NvCodec::Gdeflate => "Gdeflate",
            NvCodec::Ans => "ANS",
            NvCodec::Bitcomp => "Bitcomp",
        }
    }

    /// The codec's lowercase name, as weightlift's settings and reports spell it (`zstd`, `lz4`, ...).
    pub fn name(self) -> &'static str {
        match self {
            NvCodec::Zstd => "zstd",
            NvCodec::Lz4 => "lz4",
            NvCodec::Deflate => "deflate",
            NvCodec::Snappy => "snappy",
            NvCodec::Gdeflate => "gdeflate",
            NvCodec::Ans => "ans",
            NvCodec::Bitcomp => "bitcomp",
        }
    }

    /// The codec [`NvCodec::name`] calls `name`, ignoring case; `None` for any other name.
    pub fn parse(name: &str) -> Option<NvCodec> {
        NvCodec::ALL.into_iter().find(|c| c.name().eq_ignore_ascii_case(name))
    }

    /// Default decompression options: the backend field (first int) is 0 (nvCOMP chooses); LZ4's data type is
    /// `NVCOMP_TYPE_CHAR` (0); ANS's data type is `NVCOMP_TYPE_BITS` (0xff, "as compressed").
    fn decompress_opts(self) -> Opts {
        let mut o = Opts::zero();
        if self == NvCodec::Ans {
            o.set_i32(4, 0xff);
        }
        o
    }

    /// Default compression options (nvCOMP's `…CompressDefaultOpts`): Deflate and GDeflate algorithm 1; Bitcomp
    /// data type `NVCOMP_TYPE_UCHAR` (1) at offset 4 (algorithm 0, delta 0.0, mode lossless 0); ANS rANS over
    /// `NVCOMP_TYPE_CHAR` (all zero); the others all zero.
    fn compress_opts(self) -> Opts {
        let mut o = Opts::zero();
        match self {
            NvCodec::Deflate | NvCodec::Gdeflate => o.set_i32(0, 1),
            NvCodec::Bitcomp => o.set_i32(4, 1),
            _ => {}
        }
        o
    }
}

/// nvCOMP, loaded, with every bound symbol present.
#[derive(Clone)]
pub struct Nvcomp {
    codecs: Vec<(NvCodec, CodecApi)>,
    status_string: Option<FnStatusString>,
    /// The path or name that loaded.
    pub library: String,
    /// `major.minor.patch` as the library reports it.
    pub version: String,
}

impl std::fmt::Debug for Nvcomp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvcomp").field("library", &self.library).field("version", &self.version).finish()
    }
}

fn locate() -> Result<(String, &'static libloading::Library), String> {
    static FOUND: OnceLock<Result<(String, libloading::Library), String>> = OnceLock::new();
    let found = FOUND.get_or_init(|| {
        let explicit = std::env::var_os("WEIGHTLIFT_NVCOMP_LIB").map(std::path::PathBuf::from);
        let tried = crate::library::candidates(explicit.as_deref(), NAMES);
        crate::library::load_first(&tried).map_err(|last| {
            format!(
                "libnvcomp not found (set WEIGHTLIFT_NVCOMP_LIB, or install the nvidia-libnvcomp-cu13 wheel; tried {}; last error: {last})",
                tried.join(", ")
            )
        })
    });
    match found {
        Ok((name, lib)) => Ok((name.clone(), lib)),
        Err(e) => Err(e.clone()),
    }
}

/// nvCOMP, loaded once per process, or why not. Loading needs no GPU; calling the decoders does.
pub fn nvcomp() -> Result<Nvcomp, String> {
    static OPEN: OnceLock<Result<Nvcomp, String>> = OnceLock::new();
    OPEN.get_or_init(|| {
        let (library, lib) = locate()?;
        let props: FnProps = sym(lib, "nvcompGetProperties")?;
        let mut p = Properties::default();
        // SAFETY: `p` has the layout of nvcompProperties_t and is writable; the call only fills it.
        let status = unsafe { props(&mut p) };
        if status != 0 {
            return Err(format!("{library}: nvcompGetProperties failed (status {status})"));
        }
        let (major, minor, patch) = (p.version / 1000, p.version % 1000 / 100, p.version % 100);
        if major < 5 {
            return Err(format!(
                "{library} is nvCOMP {major}.{minor}.{patch}; the batched API with option structs needs 5.0 or later"
            ));
        }
        let mut codecs = Vec::new();
        for codec in NvCodec::ALL {
            codecs.push((codec, sys::bind_codec(lib, codec.symbol_name()).map_err(|e| format!("{library}: {e}"))?));
        }
        Ok(Nvcomp {
            codecs,
            status_string: sym(lib, "nvcompGetStatusString").ok(),
            library,
            version: format!("{major}.{minor}.{patch}"),
        })
    })
    .clone()
}

impl Nvcomp {
    fn api(&self, codec: NvCodec) -> CodecApi {
        // Every codec in `NvCodec::ALL` was bound in `nvcomp()`.
        self.codecs.iter().find(|(c, _)| *c == codec).map(|(_, a)| *a).unwrap_or(self.codecs[0].1)
    }

    /// What an nvCOMP status means.
    pub fn describe(&self, status: i32) -> String {
        if let Some(f) = self.status_string {
            // SAFETY: nvcompGetStatusString returns a static NUL-terminated string (or null) for any status.
            let p = unsafe { f(status) };
            if !p.is_null() {
                // SAFETY: non-null, NUL-terminated, static.
                return unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            }
        }
        format!("nvCOMP status {status}")
    }

    fn check(&self, call: String, status: i32) -> Result<(), NvcompError> {
        if status == 0 { Ok(()) } else { Err(NvcompError { call, status, what: self.describe(status) }) }
    }

    /// Buffer alignments the decoder of `codec` needs.
    pub fn decompress_alignments(&self, codec: NvCodec) -> Result<Alignments, NvcompError> {
        let mut a = Alignments::default();
        // SAFETY: valid options by value and a writable out-struct of the documented layout.
        let s = unsafe { (self.api(codec).decompress_align)(codec.decompress_opts(), &mut a) };
        self.check(format!("{}DecompressGetRequiredAlignments", codec.symbol_name()), s)?;
        Ok(a)
    }

    /// Device scratch bytes to decode `chunks` chunks of at most `max_chunk` bytes, `max_total` in all.
    pub fn decompress_temp_bytes(
        &self,
        codec: NvCodec,
        chunks: usize,
        max_chunk: usize,
        max_total: usize,
    ) -> Result<usize, NvcompError> {
        let mut n = 0usize;
        // SAFETY: plain values and a writable out-pointer; this call enqueues nothing (null stream is unused).
        let s = unsafe {
            (self.api(codec).decompress_temp)(
                chunks,
                max_chunk,
                codec.decompress_opts(),
                &mut n,
                max_total,
                std::ptr::null_mut(),
            )
        };
        self.check(format!("{}DecompressGetTempSize", codec.symbol_name()), s)?;
        Ok(n)
    }

    /// Enqueues the decoding of `n` chunks on `stream`. Every array argument is a device address of an array of `n`
    /// entries: compressed chunk addresses and sizes, output buffer sizes, and where nvCOMP writes the decoded sizes
    /// and per-chunk statuses.
    ///
    /// # Safety
    /// All addresses must be device memory of the current context holding what the names say, aligned as
    /// [`Nvcomp::decompress_alignments`] requires, and stay valid until the work on `stream` completes; `temp` must
    /// be at least [`Nvcomp::decompress_temp_bytes`] bytes for this batch. nvCOMP's decoders other than LZ4 and
    /// Snappy assume valid input: corrupt streams may give undefined results (the caller checks checksums after).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn decompress_async(
        &self,
        codec: NvCodec,
        n: usize,
        in_ptrs: u64,
        in_sizes: u64,
        out_capacities: u64,
        out_sizes: u64,
        temp: u64,
        temp_bytes: usize,
        out_ptrs: u64,
        statuses: u64,
        stream: CUstream,
    ) -> Result<(), NvcompError> {
        // SAFETY: per this function's contract.
        let s = unsafe {
            (self.api(codec).decompress)(
                in_ptrs as *const *const c_void,
                in_sizes as *const usize,
                out_capacities as *const usize,
                out_sizes as *mut usize,
                n,
                temp as *mut c_void,
                temp_bytes,
                out_ptrs as *const *mut c_void,
                codec.decompress_opts(),
                statuses as *mut Status,
                stream,
            )
        };
        self.check(format!("{}DecompressAsync", codec.symbol_name()), s)
    }

    /// Buffer alignments the compressor of `codec` needs.
    pub fn compress_alignments(&self, codec: NvCodec) -> Result<Alignments, NvcompError> {
        let mut a = Alignments::default();
        // SAFETY: as for `decompress_alignments`.
        let s = unsafe { (self.api(codec).compress_align)(codec.compress_opts(), &mut a) };
        self.check(format!("{}CompressGetRequiredAlignments", codec.symbol_name()), s)?;
        Ok(a)
    }

    /// `(temp bytes, largest output per chunk)` to compress `chunks` chunks of at most `max_chunk` bytes.
    pub fn compress_sizes(
        &self,
        codec: NvCodec,
        chunks: usize,
        max_chunk: usize,
        max_total: usize,
    ) -> Result<(usize, usize), NvcompError> {
        let api = self.api(codec);
        let (mut temp, mut out) = (0usize, 0usize);
        // SAFETY: plain values and writable out-pointers; neither call enqueues work.
        let s = unsafe {
            (api.compress_temp)(chunks, max_chunk, codec.compress_opts(), &mut temp, max_total, std::ptr::null_mut())
        };
        self.check(format!("{}CompressGetTempSize", codec.symbol_name()), s)?;
        // SAFETY: as above.
        let s = unsafe { (api.compress_max_out)(max_chunk, codec.compress_opts(), &mut out) };
        self.check(format!("{}CompressGetMaxOutputChunkSize", codec.symbol_name()), s)?;
        Ok((temp, out))
    }

    /// Enqueues the compression of `n` chunks on `stream` (benchmarks and GPU-side packing).
    ///
    /// # Safety
    /// As for [`Nvcomp::decompress_async`]: device arrays of `n` entries (input addresses and sizes, output
    /// addresses with room for the largest output per chunk, output sizes, statuses), valid until the work
    /// completes, `temp` as large as [`Nvcomp::compress_sizes`] says.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn compress_async(
        &self,
        codec: NvCodec,
        n: usize,
        in_ptrs: u64,
        in_sizes: u64,
        max_chunk: usize,
        temp: u64,
        temp_bytes: usize,
        out_ptrs: u64,
        out_sizes: u64,
        statuses: u64,
        stream: CUstream,
    ) -> Result<(), NvcompError> {
        // SAFETY: per this function's contract.
        let s = unsafe {
            (self.api(codec).compress)(
                in_ptrs as *const *const c_void,
                in_sizes as *const usize,
                max_chunk,
                n,
                temp as *mut c_void,
                temp_bytes,
                out_ptrs as *const *mut c_void,
                out_sizes as *mut usize,
                codec.compress_opts(),
                statuses as *mut Status,
                stream,
            )
        };
        self.check(format!("{}CompressAsync", codec.symbol_name()), s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absence_is_an_error_with_a_reason_and_presence_binds_every_codec() {
        match nvcomp() {
            Ok(nv) => {
                assert!(nv.version.starts_with('5') || nv.version.starts_with('6'), "{nv:?}");
                for codec in NvCodec::ALL {
                    // Alignment queries need no GPU.
                    let a = nv.decompress_alignments(codec).unwrap();
                    assert!(a.input.is_power_of_two() && a.output.is_power_of_two(), "{codec:?}: {a:?}");
                }
            }
            Err(why) => {
                eprintln!("nvCOMP not loaded: {why}");
                assert!(why.contains("libnvcomp") || why.contains("nvCOMP"), "{why}");
            }
        }
    }
}
