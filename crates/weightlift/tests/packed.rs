//! Loading packed checkpoints through the engine: every tensor's bytes equal the original file's (read with
//! `std::fs::read`), for every codec, whole and partial loads, host and (where there is one) GPU destinations with
//! both decoders; a corrupt chunk is a checksum error naming tensor and chunk; a truncated pack is a format error.

mod common;
use common::{check_against, gpu_or_skip};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use weightlift::{Decoder, Device, Engine, Error, LoadOpts, Settings, TensorData};
use weightlift_format::safetensors::{self, TensorSpec};
use weightlift_format::synth;
use weightlift_format::{DType, ErrorKind};
use weightlift_pack::{Codec, PackError, PackOptions};

fn none(_: u64, _: u64) {}

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    synth::tensor_bytes(seed, 1, 0, &mut v);
    v
}

/// A checkpoint of the shapes a pack meets: weights over several chunks, odd sizes, every plane count, an empty
/// tensor, all-equal bytes, random bytes, one byte.
fn checkpoint(dir: &Path) -> PathBuf {
    let tensors: Vec<(TensorSpec, Vec<u8>)> = vec![
        (TensorSpec::new("embed", DType::BF16, vec![1000, 777]), synth::bf16_weights(777_000, 1)),
        (TensorSpec::new("norm", DType::F32, vec![777]), random(777 * 4, 2)),
        (TensorSpec::new("empty", DType::F16, vec![0, 3]), Vec::new()),
        (TensorSpec::new("equal", DType::F64, vec![30_001]), vec![0x3f; 240_008]),
        (TensorSpec::new("bytes", DType::U8, vec![100_003]), random(100_003, 3)),
        (TensorSpec::new("one", DType::I8, vec![1]), vec![7]),
        (TensorSpec::new("layer.0.w", DType::BF16, vec![513, 1025]), synth::bf16_weights(513 * 1025, 4)),
    ];
    let refs: Vec<(TensorSpec, &[u8])> = tensors.iter().map(|(s, d)| (s.clone(), d.as_slice())).collect();
    let bytes = safetensors::serialize(&refs, &BTreeMap::new(), 8).unwrap();
    let path = dir.join("model.safetensors");
    std::fs::write(&path, bytes).unwrap();
    path
}

fn pack(input: &Path, codec: Codec) -> PathBuf {
    let out = input.with_extension(format!("{}.wlpack", codec.name()));
    let opts = PackOptions { codec, plane_chunk: 64 << 10, ..PackOptions::default() };
    weightlift_pack::pack(input, &out, &opts, &none).unwrap();
    out
}

fn engine() -> Engine {
    Engine::new(Settings::default()).unwrap()
}

#[test]
fn packed_loads_give_the_original_bytes_for_every_codec() {
    let dir = tempfile::tempdir().unwrap();
    let original = checkpoint(dir.path());
    let e = engine();
    for codec in Codec::ALL {
        let packed = pack(&original, codec);
        let loaded = e.load_pack(&packed, None, Device::Cpu, Decoder::Auto, &LoadOpts::default()).unwrap();
        assert_eq!(loaded.tensors.len(), 7, "{codec:?}");
        let names: Vec<&str> = loaded.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["embed", "norm", "empty", "equal", "bytes", "one", "layer.0.w"]);
        check_against(&original, &loaded);
        let stats = loaded.report.pack.as_ref().unwrap();
        assert_eq!(stats.decoder, "cpu");
        assert_eq!(stats.read_lanes, e.io().lanes(), "{codec:?}: a pack decoded on the CPU is read by every lane");
        assert_eq!(stats.raw_bytes, loaded.tensors.iter().map(|t| t.data.len() as u64).sum::<u64>());
        assert_eq!(loaded.report.bytes, stats.raw_bytes);
        if codec == Codec::Zstd {
            assert!(
                stats.stored_bytes < stats.raw_bytes * 9 / 10,
                "zstd stored {} of {}",
                stats.stored_bytes,
                stats.raw_bytes
            );
        }
        assert_eq!(stats.batch_bytes, weightlift::packed::BATCH_BYTES, "{codec:?}: the default batch on the CPU");
        let json = loaded.report.to_json();
        assert_eq!(json["pack"]["decoder"], "cpu", "{json}");
        assert_eq!(json["pack"]["batch_bytes"], weightlift::packed::BATCH_BYTES, "{json}");
    }
}

/// Batches of one chunk and a read-ahead of one byte (every batch larger than the window, small batches sharing
/// device-sized blocks): the load still makes progress and gives every byte.
#[test]
fn tiny_batches_and_read_ahead_still_load_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let original = checkpoint(dir.path());
    let packed = pack(&original, Codec::Zstd);
    for (batch, ahead) in [(1u64, 1u64), (4096, 1), (1, 1 << 30)] {
        let e = Engine::new(Settings::default().pack_batch_bytes(batch).prefetch_bytes(ahead)).unwrap();
        let loaded = e.load_pack(&packed, None, Device::Cpu, Decoder::Auto, &LoadOpts::default()).unwrap();
        check_against(&original, &loaded);
        let stats = loaded.report.pack.as_ref().unwrap();
        assert!(stats.batches > 1, "batch {batch}, read-ahead {ahead}: {} batches", stats.batches);
    }
}

#[test]
fn a_subset_loads_in_the_order_asked_and_pinned_host_memory_works_where_cuda_does() {
    let dir = tempfile::tempdir().unwrap();
    let original = checkpoint(dir.path());
    let packed = pack(&original, Codec::Lz4);
    let e = engine();
    let loaded = e.load_pack(&packed, Some(&[6, 0, 2]), Device::Cpu, Decoder::Cpu, &LoadOpts::default()).unwrap();
    let names: Vec<&str> = loaded.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["layer.0.w", "embed", "empty"]);
    check_against(&original, &loaded);
    // Only the chunks of the tensors asked for were read.
    let stats = loaded.report.pack.as_ref().unwrap();
    let all = e.load_pack(&packed, None, Device::Cpu, Decoder::Cpu, &LoadOpts::default()).unwrap();
    assert!(stats.stored_bytes < all.report.pack.as_ref().unwrap().stored_bytes);
    assert!(matches!(
        e.load_pack(&packed, Some(&[7]), Device::Cpu, Decoder::Auto, &LoadOpts::default()),
        Err(Error::InvalidArgument(m)) if m.contains("position 7")
    ));
    if weightlift_cuda::available().is_ok() {
        let pinned = e.load_pack(&packed, None, Device::PinnedCpu, Decoder::Auto, &LoadOpts::default()).unwrap();
        assert!(pinned.tensors.iter().all(|t| matches!(t.data, TensorData::Pinned(_))));
        check_against(&original, &pinned);
    }
}

#[test]
fn the_gpu_decoder_is_refused_for_host_destinations() {
    let dir = tempfile::tempdir().unwrap();
    let packed = pack(&checkpoint(dir.path()), Codec::Zstd);
    let err = engine().load_pack(&packed, None, Device::Cpu, Decoder::Gpu, &LoadOpts::default()).unwrap_err();
    assert!(err.to_string().contains("needs a CUDA destination"), "{err}");
    assert!(Decoder::parse("fast").is_err());
}

/// Flips one byte inside stream `s` of the pack.
fn corrupt_stream(packed: &Path, s: usize) -> PathBuf {
    let index = weightlift_format::wlpack::read(packed).unwrap();
    let stream = index.streams[s];
    let mut bytes = std::fs::read(packed).unwrap();
    bytes[(stream.offset + stream.stored_len / 2) as usize] ^= 0x10;
    let out = packed.with_extension("corrupt.wlpack");
    std::fs::write(&out, bytes).unwrap();
    out
}

/// The first stream stored with `codec` in a tensor named `name`, and the tensor's chunk it belongs to.
fn stream_of(packed: &Path, codec: Codec) -> Option<(usize, String, u64)> {
    let index = weightlift_format::wlpack::read(packed).unwrap();
    index.tensors().find_map(|item| {
        item.chunks.clone().find_map(|c| {
            let first = index.chunks[c].first_stream as usize;
            (first..first + item.planes as usize)
                .find(|&s| index.streams[s].codec == codec)
                .map(|s| (s, item.tensor_name().unwrap().to_string(), (c - item.chunks.start) as u64))
        })
    })
}

/// A corrupted stream is an error naming the tensor and its chunk (checksum for raw streams, whose bytes decode
/// whatever they are; checksum or codec error for compressed ones), and the engine loads the good pack afterwards.
pub fn corrupt_chunks_are_named(device: Device, decoder: Decoder) {
    let dir = tempfile::tempdir().unwrap();
    let original = checkpoint(dir.path());
    let e = engine();
    for codec in [Codec::Raw, Codec::Zstd, Codec::Huffman] {
        if decoder == Decoder::Gpu && gpu_decoder_missing(codec).is_some() {
            continue;
        }
        let packed = pack(&original, codec);
        let (s, tensor, chunk) = stream_of(&packed, codec).expect("a stream of that codec");
        let bad = corrupt_stream(&packed, s);
        let err = e.load_pack(&bad, None, device, decoder, &LoadOpts::default()).unwrap_err();
        let text = err.to_string();
        match &err {
            Error::Pack(PackError::Checksum { item, chunk: k, .. }) => {
                assert_eq!((item.as_str(), *k), (tensor.as_str(), chunk), "{text}")
            }
            Error::Pack(PackError::Codec { item, chunk: k, .. }) if codec != Codec::Raw => {
                assert_eq!((item.as_str(), *k), (tensor.as_str(), chunk), "{text}")
            }
            other => panic!("{codec:?}: unexpected error {other:?}"),
        }
        assert!(text.contains(&tensor) && text.contains("corrupt.wlpack"), "{text}");
        check_against(&original, &e.load_pack(&packed, None, device, decoder, &LoadOpts::default()).unwrap());
    }
}

#[test]
fn a_corrupt_chunk_is_a_checksum_error_naming_tensor_and_chunk_on_the_cpu() {
    corrupt_chunks_are_named(Device::Cpu, Decoder::Auto);
}

#[test]
fn truncated_and_missing_packs_are_format_and_io_errors() {
    let dir = tempfile::tempdir().unwrap();
    let packed = pack(&checkpoint(dir.path()), Codec::Zstd);
    let bytes = std::fs::read(&packed).unwrap();
    let cut = dir.path().join("cut.wlpack");
    for len in [0, 20, 200, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&cut, &bytes[..len]).unwrap();
        match engine().load_pack(&cut, None, Device::Cpu, Decoder::Auto, &LoadOpts::default()) {
            Err(Error::Format(f)) => {
                assert!(f.to_string().contains("cut.wlpack"), "{len}: {f}");
                if len > 0 && len < 32 {
                    assert!(matches!(f.kind, ErrorKind::Truncated { .. }), "{len}: {f}");
                }
            }
            other => panic!("{len}: expected a format error, got {other:?}"),
        }
    }
    let missing = engine()
        .load_pack(&dir.path().join("nope.wlpack"), None, Device::Cpu, Decoder::Auto, &LoadOpts::default())
        .unwrap_err();
    assert!(missing.to_string().contains("nope.wlpack"), "{missing}");
}

/// Why the GPU decoder cannot run here for packs of `codec` (it needs NVRTC besides the driver, and nvCOMP for
/// nvCOMP's codecs).
fn gpu_decoder_missing(codec: Codec) -> Option<String> {
    let nvcomp = || if codec.needs_nvcomp() { weightlift_cuda::nvcomp::nvcomp().err() } else { None };
    weightlift_cuda::nvrtc::available().err().or_else(nvcomp)
}

#[test]
fn packed_loads_onto_the_gpu_with_both_decoders() {
    if !gpu_or_skip("packed_loads_onto_the_gpu_with_both_decoders") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let original = checkpoint(dir.path());
    let e = engine();
    for codec in Codec::ALL {
        let missing = gpu_decoder_missing(codec);
        eprintln!("GPU decoder for {codec:?}: {}", missing.as_deref().unwrap_or("available"));
        let packed = pack(&original, codec);
        for decoder in [Decoder::Auto, Decoder::Cpu] {
            let loaded = e.load_pack(&packed, None, Device::Cuda(0), decoder, &LoadOpts::default()).unwrap();
            assert!(loaded.tensors.iter().all(|t| matches!(t.data, TensorData::Device(_))));
            check_against(&original, &loaded);
            let stats = loaded.report.pack.as_ref().unwrap();
            let expect = if decoder == Decoder::Auto && missing.is_none() { "gpu" } else { "cpu" };
            assert_eq!(stats.decoder, expect, "{codec:?} {decoder:?}: {}", stats.decoder_reason);
            // A pack decoded on the GPU is read by fewer lanes, leaving CPUs to the decoder.
            let lanes = e.io().lanes();
            let read = if expect == "gpu" { weightlift::packed::gpu_decode_read_lanes(lanes) } else { lanes };
            assert_eq!(stats.read_lanes, read, "{codec:?} {decoder:?}");
            // nvCOMP's decoders get larger batches; the CPU decoder and weightlift's kernels the default.
            let batch = if expect == "gpu" && codec.needs_nvcomp() {
                weightlift::packed::NVCOMP_BATCH_BYTES
            } else {
                weightlift::packed::BATCH_BYTES
            };
            assert_eq!(stats.batch_bytes, batch, "{codec:?} {decoder:?}");
        }
        let subset = e.load_pack(&packed, Some(&[3, 0]), Device::Cuda(0), Decoder::Auto, &LoadOpts::default()).unwrap();
        check_against(&original, &subset);
    }
    for codec in [Codec::Huffman, Codec::Zstd] {
        if gpu_decoder_missing(codec).is_none() {
            let packed = pack(&original, codec);
            check_against(
                &original,
                &e.load_pack(&packed, None, Device::Cuda(0), Decoder::Gpu, &LoadOpts::default()).unwrap(),
            );
        }
    }
}

#[test]
fn a_corrupt_chunk_is_named_on_the_gpu_with_both_decoders() {
    if !gpu_or_skip("a_corrupt_chunk_is_named_on_the_gpu_with_both_decoders") {
        return;
    }
    corrupt_chunks_are_named(Device::Cuda(0), Decoder::Cpu);
    if gpu_decoder_missing(Codec::Huffman).is_none() {
        corrupt_chunks_are_named(Device::Cuda(0), Decoder::Gpu);
    }
}

/// A pack of about 300 MB decoded on the GPU over many batches (several in flight), device memory back after.
#[test]
fn a_large_pack_streams_through_many_batches_on_the_gpu() {
    if !gpu_or_skip("a_large_pack_streams_through_many_batches_on_the_gpu")
        || gpu_decoder_missing(Codec::Huffman).is_some()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tensors: Vec<(TensorSpec, Vec<u8>)> = (0..12)
        .map(|i| (TensorSpec::new(format!("w{i}"), DType::BF16, vec![4096, 3001]), synth::bf16_weights(4096 * 3001, i)))
        .collect();
    let refs: Vec<(TensorSpec, &[u8])> = tensors.iter().map(|(s, d)| (s.clone(), d.as_slice())).collect();
    let original = dir.path().join("large.safetensors");
    std::fs::write(&original, safetensors::serialize(&refs, &BTreeMap::new(), 8).unwrap()).unwrap();
    let packed = pack(&original, Codec::Huffman);
    let e = Engine::new(Settings::default().pack_batch_bytes(48 << 20)).unwrap();
    let gpu = e.gpu(0).unwrap();
    let before = gpu.mem_info().unwrap().0;
    for _ in 0..3 {
        let loaded = e.load_pack(&packed, None, Device::Cuda(0), Decoder::Auto, &LoadOpts::default()).unwrap();
        let stats = loaded.report.pack.clone().unwrap();
        assert!(stats.batches >= 3, "{stats:?}");
        assert_eq!(stats.batch_bytes, 48 << 20, "the setting, not the default");
        eprintln!("{:.3} s, {:.2} GB/s raw, {stats:?}", loaded.report.seconds, loaded.report.gbps());
        check_against(&original, &loaded);
    }
    // The engine keeps its GPU decoder's scratch memory between loads (224 MiB here, on the H100) until asked to
    // release it; a load's own memory (its tensors, the stored batches) goes when they are dropped.
    e.release_memory();
    gpu.synchronize().unwrap();
    let after = gpu.mem_info().unwrap().0;
    // The memory pools of the stream-ordered allocator may keep some; a leak of a load would be ~300 MB.
    assert!(before.abs_diff(after) < 64 << 20, "free device memory {before} before, {after} after");
}

#[test]
fn progress_counts_raw_bytes_and_a_set_cancel_flag_stops_the_load() {
    let dir = tempfile::tempdir().unwrap();
    let packed = pack(&checkpoint(dir.path()), Codec::Zstd);
    let e = engine();
    let progress = std::sync::atomic::AtomicU64::new(0);
    let opts = LoadOpts { progress: Some(&progress), ..LoadOpts::default() };
    let loaded = e.load_pack(&packed, None, Device::Cpu, Decoder::Auto, &opts).unwrap();
    assert_eq!(progress.load(std::sync::atomic::Ordering::Relaxed), loaded.report.bytes);
    let cancel = std::sync::atomic::AtomicBool::new(true);
    let opts = LoadOpts { cancel: Some(&cancel), ..LoadOpts::default() };
    let err = e.load_pack(&packed, None, Device::Cpu, Decoder::Auto, &opts).unwrap_err();
    assert!(matches!(err, Error::Io(weightlift_io::IoError::Cancelled)), "{err:?}");
    // The engine loads again afterwards.
    assert_eq!(e.load_pack(&packed, None, Device::Cpu, Decoder::Auto, &LoadOpts::default()).unwrap().tensors.len(), 7);
}
