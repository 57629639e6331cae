//! GPU unpacking against the CPU decoder, byte for byte; a corrupt chunk is a checksum error naming it; xxh3 on the
//! GPU equals the CPU's. `bench_gpu_decompression` (ignored; run with `--ignored --nocapture`) measures nvCOMP's
//! decompression rate per codec on weight-like bf16 planes and the whole decode-merge-hash path, and writes JSON to
//! `$WEIGHTLIFT_BENCH_OUT/unpack-gpu.json`. Each test prints why it skips where CUDA, NVRTC or nvCOMP is missing.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaStream, sys};
use weightlift_cuda::nvcomp::NvCodec;
use weightlift_cuda::unpack::{BatchError, ChunkJob, GpuCodec, GpuUnpacker, StreamSrc, UnpackError};
use weightlift_cuda::{DeviceBuffer, Gpu};
use weightlift_format::synth;
use weightlift_pack::{Codec, Level};

fn ready(test: &str, need_nvcomp: bool) -> Option<(Gpu, Arc<CudaStream>)> {
    let why = weightlift_cuda::available()
        .err()
        .or_else(|| weightlift_cuda::nvrtc::available().err())
        .or_else(|| if need_nvcomp { weightlift_cuda::nvcomp::nvcomp().err() } else { None });
    if let Some(why) = why {
        eprintln!("skipping {test}: {why}");
        return None;
    }
    let gpu = Gpu::open(0).unwrap();
    gpu.bind().unwrap();
    let stream = gpu.context().new_stream().unwrap();
    Some((gpu, stream))
}

fn upload(gpu: &Gpu, stream: &Arc<CudaStream>, bytes: &[u8]) -> DeviceBuffer {
    let buf = DeviceBuffer::alloc(gpu, bytes.len().max(1), stream).unwrap();
    // SAFETY: the buffer holds at least `bytes.len()` bytes; the stream is synchronized before `bytes` can go.
    unsafe { sys::cuMemcpyHtoDAsync_v2(buf.device_ptr(), bytes.as_ptr().cast(), bytes.len(), stream.cu_stream()) }
        .result()
        .unwrap();
    stream.synchronize().unwrap();
    buf
}

fn gpu_codec(codec: Codec) -> Option<GpuCodec> {
    match codec {
        Codec::Raw => None,
        Codec::Huffman => Some(GpuCodec::Huffman),
        Codec::Zstd => Some(GpuCodec::Nvcomp(NvCodec::Zstd)),
        Codec::Lz4 => Some(GpuCodec::Nvcomp(NvCodec::Lz4)),
        Codec::Deflate => Some(GpuCodec::Nvcomp(NvCodec::Deflate)),
    }
}

/// A stored blob, its streams `(offset, stored length, codec)`, its chunks `(first stream, raw offset, checksum)`.
type Encoded = (Vec<u8>, Vec<(usize, u64, Option<GpuCodec>)>, Vec<(usize, usize, u64)>);

/// Chunks of `raw` (2 planes each), each plane compressed with `codec` on the CPU, as one stored blob.
fn encode(raw: &[u8], chunk: usize, codec: Codec) -> Encoded {
    let (mut blob, mut streams, mut chunks) = (Vec::new(), Vec::new(), Vec::new());
    for (i, c) in raw.chunks(chunk).enumerate() {
        let half = c.len() / 2;
        let (mut a, mut b) = (vec![0u8; half], vec![0u8; half]);
        weightlift_pack::planes::split(c, &mut [&mut a[..], &mut b[..]]);
        let first = streams.len();
        for plane in [a, b] {
            let stored = weightlift_pack::compress(codec, Level(3), &plane).unwrap();
            blob.resize(blob.len().next_multiple_of(16), 0);
            streams.push((blob.len(), stored.len() as u64, gpu_codec(codec)));
            blob.extend_from_slice(&stored);
        }
        chunks.push((first, i * chunk, weightlift_pack::checksum(c)));
    }
    (blob, streams, chunks)
}

/// The decode batch for `encode`'s streams uploaded at `src` and chunks landing at `dst` (two byte planes each).
fn batch_of(
    streams: &[(usize, u64, Option<GpuCodec>)],
    chunks: &[(usize, usize, u64)],
    src: u64,
    dst: u64,
    chunk: usize,
    raw_len: usize,
) -> (Vec<StreamSrc>, Vec<ChunkJob>) {
    let srcs =
        streams.iter().map(|&(at, len, c)| StreamSrc { ptr: src + at as u64, stored_len: len, codec: c }).collect();
    let jobs = chunks
        .iter()
        .map(|&(first, at, sum)| ChunkJob {
            first_stream: first as u32,
            planes: 2,
            dst: dst + at as u64,
            raw_len: chunk.min(raw_len - at) as u64,
            checksum: sum,
        })
        .collect();
    (srcs, jobs)
}

#[test]
fn gpu_decode_matches_the_cpu_decoder_and_catches_a_corrupt_chunk() {
    let Some((gpu, stream)) = ready("gpu_decode_matches_the_cpu_decoder_and_catches_a_corrupt_chunk", true) else {
        return;
    };
    let mut raw = synth::bf16_weights(600_001, 3);
    raw.extend(std::iter::repeat_n(0x3c, 70_000));
    let mut unpacker = GpuUnpacker::new(&gpu, stream.clone()).unwrap();
    for codec in Codec::ALL {
        let chunk = 128 << 10;
        let (mut blob, streams, chunks) = encode(&raw, chunk, codec);
        for corrupt in [false, true] {
            if corrupt {
                // A raw stream decodes whatever it holds: only the checksum can catch the flipped byte. A Huffman
                // stream's flipped bit in its bits decodes to other bytes or fails to decode: either is an error
                // naming chunk 3.
                let (at, len, _) = streams[2 * 3];
                let flip = if codec == Codec::Huffman { at + len as usize - 9 } else { at + 5 };
                blob[flip] ^= 0x20;
                if !matches!(codec, Codec::Raw | Codec::Huffman) {
                    continue;
                }
            }
            let src = upload(&gpu, &stream, &blob);
            let dst = DeviceBuffer::alloc(&gpu, raw.len() + 3, &stream).unwrap();
            let base = dst.device_ptr() + 3; // odd destination, as in upstream safetensors files
            let (srcs, jobs) = batch_of(&streams, &chunks, src.device_ptr(), base, chunk, raw.len());
            // SAFETY: sources and destinations are live device buffers of the sizes described; the batch is waited.
            let batch = unsafe { unpacker.decode_batch(&jobs, &srcs) }.unwrap();
            let result = batch.wait();
            if corrupt {
                match result {
                    Err(UnpackError::Batch(BatchError::Checksum { chunk, .. })) => assert_eq!(chunk, 3),
                    Err(UnpackError::Batch(BatchError::Decode { chunk, codec: "huffman", .. }))
                        if codec == Codec::Huffman =>
                    {
                        assert_eq!(chunk, 3)
                    }
                    other => panic!("{codec:?}: expected a checksum error on chunk 3, got {other:?}"),
                }
                continue;
            }
            result.unwrap_or_else(|e| panic!("{codec:?}: {e}"));
            let mut back = vec![0u8; raw.len() + 3];
            dst.read_back(0, &mut back).unwrap();
            assert!(back[3..] == raw[..], "{codec:?}: GPU decode differs from the original bytes");
            unpacker.recycle(batch);
        }
    }
}

/// Huffman streams decode on the GPU without nvCOMP; a malformed header or segment table is a decode error naming
/// the chunk and plane, and the unpacker decodes the next batch right.
#[test]
fn huffman_streams_decode_without_nvcomp_and_hostile_ones_are_errors() {
    let Some((gpu, stream)) = ready("huffman_streams_decode_without_nvcomp_and_hostile_ones_are_errors", false) else {
        return;
    };
    let raw = synth::bf16_weights(300_000, 5);
    let chunk = 128 << 10;
    let (good, streams, chunks) = encode(&raw, chunk, Codec::Huffman);
    assert!(streams.iter().any(|s| s.2 == Some(GpuCodec::Huffman)));
    let mut unpacker = GpuUnpacker::new(&gpu, stream.clone()).unwrap();
    // Chunk 1's exponent plane (stream 3): its code lengths, its segment shift, a segment end, the last end.
    let (at, len, _) = streams[3];
    let mid = at + len as usize / 2;
    let hostile: [(usize, u8); 4] = [(at, 12), (at + 1, 2), (mid, !good[mid]), (at + 2, 0xff)];
    for flip in hostile.into_iter().map(Some).chain([None]) {
        let mut blob = good.clone();
        if let Some((i, v)) = flip {
            blob[i] = v;
        }
        let src = upload(&gpu, &stream, &blob);
        let dst = DeviceBuffer::alloc(&gpu, raw.len(), &stream).unwrap();
        let (srcs, jobs) = batch_of(&streams, &chunks, src.device_ptr(), dst.device_ptr(), chunk, raw.len());
        // SAFETY: sources and destinations are live device buffers of the sizes described; the batch is waited.
        let batch = unsafe { unpacker.decode_batch(&jobs, &srcs) }.unwrap();
        match (flip, batch.wait()) {
            (None, r) => {
                r.unwrap();
                let mut back = vec![0u8; raw.len()];
                dst.read_back(0, &mut back).unwrap();
                assert!(back == raw, "GPU Huffman decode differs from the original bytes");
            }
            (Some(_), Err(UnpackError::Batch(BatchError::Decode { chunk, plane, codec, .. }))) => {
                assert_eq!((chunk, plane, codec), (1, 1, "huffman"));
            }
            (Some(_), Err(UnpackError::Batch(BatchError::Checksum { chunk, .. }))) => assert_eq!(chunk, 1),
            (Some(f), other) => panic!("{f:?}: expected an error on chunk 1, got {other:?}"),
        }
        unpacker.recycle(batch);
    }
}

#[test]
fn gpu_xxh3_equals_the_cpu_for_every_length_class() {
    let Some((gpu, stream)) = ready("gpu_xxh3_equals_the_cpu_for_every_length_class", false) else { return };
    let data = synth::bf16_weights(200_000, 9);
    let buf = upload(&gpu, &stream, &data);
    let ranges: Vec<(u64, u64)> = [0u64, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 100_000, 399_000]
        .iter()
        .enumerate()
        .map(|(i, &len)| (buf.device_ptr() + i as u64, len))
        .collect();
    let mut unpacker = GpuUnpacker::new(&gpu, stream).unwrap();
    // SAFETY: every range lies inside `buf`, which outlives the waited batch.
    let batch = unsafe { unpacker.hash_batch(&ranges) }.unwrap();
    batch.wait().unwrap();
    for ((ptr, len), got) in ranges.iter().zip(batch.hashes()) {
        let at = (ptr - buf.device_ptr()) as usize;
        assert_eq!(got, xxhash_rust::xxh3::xxh3_64(&data[at..at + *len as usize]), "{len} bytes at {at}");
    }
}

/// Times `f` (enqueuing work on `stream`) `runs` times; best seconds.
fn best(stream: &Arc<CudaStream>, runs: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..runs {
        stream.synchronize().unwrap();
        let t = Instant::now();
        f();
        stream.synchronize().unwrap();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

#[test]
#[ignore = "benchmark: run on a GPU machine with --ignored --nocapture"]
fn bench_gpu_decompression() {
    let Some((gpu, stream)) = ready("bench_gpu_decompression", true) else { return };
    let mb: usize = std::env::var("WEIGHTLIFT_BENCH_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(512);
    let raw = synth::bf16_weights(mb << 19, 11);
    let chunk = 128 << 10;
    let mut report = serde_json::Map::new();
    report.insert("gpu".into(), gpu.info().name.clone().into());
    report.insert("raw_bytes".into(), (raw.len() as u64).into());
    // The full path (decode + merge + xxh3) on CPU-written streams.
    let mut unpacker = GpuUnpacker::new(&gpu, stream.clone()).unwrap();
    for codec in Codec::ALL {
        let (blob, streams, chunks) = encode(&raw, chunk, codec);
        let src = upload(&gpu, &stream, &blob);
        let dst = DeviceBuffer::alloc(&gpu, raw.len(), &stream).unwrap();
        let (srcs, jobs) = batch_of(&streams, &chunks, src.device_ptr(), dst.device_ptr(), chunk, raw.len());
        let secs = best(&stream, 5, || {
            // SAFETY: as in the tests above; each batch is waited before the next.
            let b = unsafe { unpacker.decode_batch(&jobs, &srcs) }.unwrap();
            b.wait().unwrap();
            unpacker.recycle(b);
        });
        let v = serde_json::json!({"ratio": blob.len() as f64 / raw.len() as f64, "raw_gbps": raw.len() as f64 / secs / 1e9, "seconds": secs});
        eprintln!("full path {}: {v}", codec.name());
        report.insert(format!("full_path_{}", codec.name()), v);
    }
    // nvCOMP alone, every codec, compressing on the GPU: the exponent plane (high bytes) and the mantissa plane.
    let nv = weightlift_cuda::nvcomp::nvcomp().unwrap();
    let half = raw.len() / 2;
    let (mut lo, mut hi) = (vec![0u8; half], vec![0u8; half]);
    weightlift_pack::planes::split(&raw, &mut [&mut lo[..], &mut hi[..]]);
    for (plane_name, plane) in [("exponent", &hi), ("mantissa", &lo)] {
        for codec in NvCodec::ALL {
            match nvcomp_round(&gpu, &stream, &nv, codec, plane, 64 << 10) {
                Ok(v) => {
                    eprintln!("nvcomp {} {plane_name}: {v}", codec.name());
                    report.insert(format!("nvcomp_{}_{plane_name}", codec.name()), v);
                }
                Err(e) => {
                    eprintln!("nvcomp {} {plane_name}: {e}", codec.name());
                    report.insert(format!("nvcomp_{}_{plane_name}", codec.name()), serde_json::json!({"error": e}));
                }
            }
        }
    }
    if let Some(dir) = std::env::var_os("WEIGHTLIFT_BENCH_OUT") {
        let path = std::path::Path::new(&dir).join("unpack-gpu.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&report).unwrap()).unwrap();
        eprintln!("wrote {}", path.display());
    }
}

/// Compresses `data` in chunks with nvCOMP on the GPU, checks a decompression gives it back, and times it.
fn nvcomp_round(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    nv: &weightlift_cuda::nvcomp::Nvcomp,
    codec: NvCodec,
    data: &[u8],
    chunk: usize,
) -> Result<serde_json::Value, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let n = data.len().div_ceil(chunk);
    let (ctemp, max_out) = nv.compress_sizes(codec, n, chunk, data.len()).map_err(|x| e(&x))?;
    let max_out = max_out.next_multiple_of(256);
    let input = upload(gpu, stream, data);
    let comp = DeviceBuffer::alloc(gpu, n * max_out, stream).map_err(|x| e(&x))?;
    let out = DeviceBuffer::alloc(gpu, data.len(), stream).map_err(|x| e(&x))?;
    let words = |v: Vec<u64>| v.into_iter().flat_map(u64::to_le_bytes).collect::<Vec<u8>>();
    let sizes: Vec<u64> = (0..n).map(|i| chunk.min(data.len() - i * chunk) as u64).collect();
    let in_ptrs = upload(gpu, stream, &words((0..n).map(|i| input.device_ptr() + (i * chunk) as u64).collect()));
    let in_sizes = upload(gpu, stream, &words(sizes.clone()));
    let c_ptrs = upload(gpu, stream, &words((0..n).map(|i| comp.device_ptr() + (i * max_out) as u64).collect()));
    let c_sizes = DeviceBuffer::alloc(gpu, 8 * n, stream).map_err(|x| e(&x))?;
    let o_ptrs = upload(gpu, stream, &words((0..n).map(|i| out.device_ptr() + (i * chunk) as u64).collect()));
    let o_sizes = DeviceBuffer::alloc(gpu, 8 * n, stream).map_err(|x| e(&x))?;
    let statuses = DeviceBuffer::alloc(gpu, 4 * n, stream).map_err(|x| e(&x))?;
    let temp = DeviceBuffer::alloc(gpu, ctemp.max(1), stream).map_err(|x| e(&x))?;
    let s = stream.cu_stream();
    // SAFETY: every array holds `n` entries and every buffer the sizes nvCOMP asked for; synchronized below.
    unsafe {
        nv.compress_async(
            codec,
            n,
            in_ptrs.device_ptr(),
            in_sizes.device_ptr(),
            chunk,
            temp.device_ptr(),
            ctemp,
            c_ptrs.device_ptr(),
            c_sizes.device_ptr(),
            statuses.device_ptr(),
            s,
        )
    }
    .map_err(|x| e(&x))?;
    stream.synchronize().map_err(|x| e(&x))?;
    let mut csz = vec![0u8; 8 * n];
    c_sizes.read_back(0, &mut csz).map_err(|x| e(&x))?;
    let stored: u64 = csz.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).sum();
    let dtemp = nv.decompress_temp_bytes(codec, n, chunk, data.len()).map_err(|x| e(&x))?;
    let dtemp_buf = DeviceBuffer::alloc(gpu, dtemp.max(1), stream).map_err(|x| e(&x))?;
    let secs = best(stream, 5, || {
        // SAFETY: as above; the compressed sizes are nvCOMP's own.
        unsafe {
            nv.decompress_async(
                codec,
                n,
                c_ptrs.device_ptr(),
                c_sizes.device_ptr(),
                in_sizes.device_ptr(),
                o_sizes.device_ptr(),
                dtemp_buf.device_ptr(),
                dtemp,
                o_ptrs.device_ptr(),
                statuses.device_ptr(),
                s,
            )
        }
        .unwrap();
    });
    let mut back = vec![0u8; data.len()];
    out.read_back(0, &mut back).map_err(|x| e(&x))?;
    if back != data {
        return Err("decompressed bytes differ from the input".into());
    }
    Ok(
        serde_json::json!({"ratio": stored as f64 / data.len() as f64, "decompress_gbps": data.len() as f64 / secs / 1e9, "chunk": chunk}),
    )
}
