//! weightlift packs (`.wlpack`, laid out in [`weightlift_format::wlpack`]): a checkpoint whose tensors are split into
//! byte planes (the exponent bytes of bf16/f16/f32 weights together, the mantissa bytes apart) and compressed chunk
//! by chunk with codecs a GPU decodes (weightlift's segmented Huffman by default, decoded by its own kernel; zstd,
//! LZ4, raw deflate through nvCOMP's batched decoders), each chunk checked with xxh3-64 after decoding.
//!
//! - [`pack`]: the multithreaded CPU encoder (safetensors, sharded safetensors, GGUF in),
//! - [`Pack`], [`unpack`], [`verify`]: the CPU decoder, one chunk at a time or a whole pack back into its original
//!   files byte for byte,
//! - [`manifest`]: chunk checksums of plain checkpoints, for verifying later loads.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod codec;
mod decode;
mod encode;
mod error;
pub mod huffman;
pub mod manifest;
pub mod planes;

pub use codec::{Level, compress, decompress};
pub use decode::{Pack, decode_chunk, output_paths, unpack, verify};
pub use encode::{PackOptions, PackSummary, pack};
pub use error::PackError;
pub use weightlift_format::wlpack::{Codec, PackIndex};

/// The checksum every chunk carries: xxh3-64 with seed 0 (what the GPU kernels compute too).
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}
