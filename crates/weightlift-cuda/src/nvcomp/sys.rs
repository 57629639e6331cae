//! nvCOMP's C types and entry points (the low-level batched API of nvCOMP 5 and 6), bound by hand. Nothing here
//! is called; [`super::Nvcomp`] calls them and turns each status into a `Result`.

use std::ffi::{c_char, c_void};

use cudarc::driver::sys::CUstream;

use crate::library::sym;

/// An nvCOMP options struct (all are 64 bytes of ints and padding, passed by value; in the x86-64 and AArch64 C
/// calling conventions any 64-byte aggregate of alignment ≤ 8 is passed the same way).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub(crate) struct Opts([u8; 64]);

const _: () = assert!(std::mem::size_of::<Opts>() == 64);

impl Opts {
    pub fn zero() -> Opts {
        Opts([0; 64])
    }

    pub fn set_i32(&mut self, at: usize, v: i32) {
        self.0[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
}

/// `nvcompAlignmentRequirements_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Alignments {
    /// Alignment in bytes each compressed input must start at.
    pub input: usize,
    /// Alignment in bytes each decompressed output must start at.
    pub output: usize,
    /// Alignment in bytes of the temporary buffer.
    pub temp: usize,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Properties {
    pub version: u32,
    pub cudart_version: u32,
}

pub(crate) type Status = i32;
pub(crate) type FnAlign = unsafe extern "C" fn(Opts, *mut Alignments) -> Status;
pub(crate) type FnTemp = unsafe extern "C" fn(usize, usize, Opts, *mut usize, usize, CUstream) -> Status;
pub(crate) type FnMaxOut = unsafe extern "C" fn(usize, Opts, *mut usize) -> Status;
pub(crate) type FnDecompress = unsafe extern "C" fn(
    *const *const c_void,
    *const usize,
    *const usize,
    *mut usize,
    usize,
    *mut c_void,
    usize,
    *const *mut c_void,
    Opts,
    *mut Status,
    CUstream,
) -> Status;
pub(crate) type FnCompress = unsafe extern "C" fn(
    *const *const c_void,
    *const usize,
    usize,
    usize,
    *mut c_void,
    usize,
    *const *mut c_void,
    *mut usize,
    Opts,
    *mut Status,
    CUstream,
) -> Status;
pub(crate) type FnProps = unsafe extern "C" fn(*mut Properties) -> Status;
pub(crate) type FnStatusString = unsafe extern "C" fn(Status) -> *const c_char;

/// One codec's entry points.
#[derive(Clone, Copy)]
pub(crate) struct CodecApi {
    pub decompress_align: FnAlign,
    pub decompress_temp: FnTemp,
    pub decompress: FnDecompress,
    pub compress_align: FnAlign,
    pub compress_temp: FnTemp,
    pub compress_max_out: FnMaxOut,
    pub compress: FnCompress,
}

/// The entry points of the codec named `n` in nvCOMP's symbols (`nvcompBatched<n>DecompressAsync`).
pub(crate) fn bind_codec(lib: &'static libloading::Library, n: &str) -> Result<CodecApi, String> {
    Ok(CodecApi {
        decompress_align: sym(lib, &format!("nvcompBatched{n}DecompressGetRequiredAlignments"))?,
        decompress_temp: sym(lib, &format!("nvcompBatched{n}DecompressGetTempSize"))?,
        decompress: sym(lib, &format!("nvcompBatched{n}DecompressAsync"))?,
        compress_align: sym(lib, &format!("nvcompBatched{n}CompressGetRequiredAlignments"))?,
        compress_temp: sym(lib, &format!("nvcompBatched{n}CompressGetTempSize"))?,
        compress_max_out: sym(lib, &format!("nvcompBatched{n}CompressGetMaxOutputChunkSize"))?,
        compress: sym(lib, &format!("nvcompBatched{n}CompressAsync"))?,
    })
}
