//! Packs and unpacks byte for byte: every dtype, odd and empty tensors, all-equal and random data, weight-like
//! values, aligned and sharded safetensors, GGUF; a corrupt chunk is a checksum error naming tensor and chunk; a
//! truncated pack is a format error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use weightlift_format::safetensors::{self, TensorSpec};
use weightlift_format::synth::{self, Container, Layout, Spec};
use weightlift_format::{DType, ErrorKind};
use weightlift_pack::{Codec, Level, Pack, PackError, PackOptions};

fn none(_: u64, _: u64) {}

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    synth::tensor_bytes(seed, 1, 0, &mut v);
    v
}

fn every_dtype_file() -> Vec<u8> {
    let mut tensors: Vec<(TensorSpec, Vec<u8>)> = Vec::new();
    for (i, dtype) in DType::plain().enumerate() {
        let elems: u64 = if dtype.bits() == Some(4) {
            2 * 1001
        } else if dtype.bits() == Some(6) {
            4 * 333
        } else {
            3 * 1001 + 1
        };
        let shape = vec![elems];
        let n = dtype.byte_size(&shape).unwrap() as usize;
        tensors.push((TensorSpec::new(format!("t{i}.{}", dtype.name()), dtype, shape), random(n, i as u64)));
        tensors.push((TensorSpec::new(format!("empty.{}", dtype.name()), dtype, vec![0, 5]), Vec::new()));
    }
    tensors.push((TensorSpec::new("equal", DType::F32, vec![70_001]), vec![0x3c; 280_004]));
    tensors.push((TensorSpec::new("weights", DType::BF16, vec![300, 1001]), synth::bf16_weights(300_300, 7)));
    tensors.push((TensorSpec::new("one_byte", DType::U8, vec![1]), vec![42]));
    let refs: Vec<(TensorSpec, &[u8])> = tensors.iter().map(|(s, d)| (s.clone(), d.as_slice())).collect();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(&refs, &meta, 8).unwrap()
}

fn round_trip(input: &Path, dir: &Path, opts: &PackOptions) -> (PathBuf, Vec<PathBuf>) {
    let packed = dir.join(format!("{}.{}.wlpack", input.file_name().unwrap().to_string_lossy(), opts.codec.name()));
    weightlift_pack::pack(input, &packed, opts, &none).unwrap();
    let pack = Pack::open(&packed).unwrap();
    weightlift_pack::verify(&pack, 2, &none).unwrap();
    let out = dir.join(format!("out-{}-{}", opts.codec.name(), input.file_name().unwrap().to_string_lossy()));
    let written = weightlift_pack::unpack(&pack, &out, 2, &none).unwrap();
    (packed, written)
}

#[test]
fn every_dtype_and_codec_round_trips_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("all.safetensors");
    let original = every_dtype_file();
    std::fs::write(&input, &original).unwrap();
    for codec in Codec::ALL {
        for plane_chunk in [64 << 10, 1000] {
            let opts = PackOptions { codec, plane_chunk, threads: 2, ..PackOptions::default() };
            let (packed, written) = round_trip(&input, dir.path(), &opts);
            assert_eq!(std::fs::read(&written[0]).unwrap(), original, "{codec:?} {plane_chunk}");
            let index = Pack::open(&packed).unwrap().index;
            let weights = index.items.iter().find(|i| i.tensor_name() == Some("weights")).unwrap();
            assert_eq!(weights.planes, 2);
            if codec == Codec::Zstd && plane_chunk > 1000 {
                let exponent: u64 = weights.chunks.clone().map(|c| index.chunk_streams(c, 2)[1].stored_len).sum();
                let raw = weights.nbytes / 2;
                assert!(exponent * 2 < raw, "exponent plane of weights did not shrink: {exponent} of {raw}");
                let equal = index.items.iter().find(|i| i.tensor_name() == Some("equal")).unwrap();
                let stored: u64 = equal
                    .chunks
                    .clone()
                    .map(|c| index.chunk_streams(c, 4).iter().map(|s| s.stored_len).sum::<u64>())
                    .sum();
                assert!(stored * 100 < equal.nbytes, "all-equal tensor stored in {stored} bytes");
            }
        }
    }
}

#[test]
fn aligned_sharded_and_gguf_checkpoints_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let aligned = dir.path().join("aligned.safetensors");
    synth::generate(
        &aligned,
        &Spec {
            layout: Layout::ManySmall { tensors: Some(40) },
            container: Container::Safetensors,
            size: 0,
            seed: 3,
            align: Some(4096),
        },
    )
    .unwrap();
    let gguf = dir.path().join("llama.gguf");
    synth::generate(
        &gguf,
        &Spec { layout: Layout::Llama, container: Container::Gguf, size: 4 << 20, seed: 4, align: None },
    )
    .unwrap();
    for input in [&aligned, &gguf] {
        let (_, written) = round_trip(input, dir.path(), &PackOptions::default());
        assert!(std::fs::read(&written[0]).unwrap() == std::fs::read(input).unwrap(), "{}", input.display());
    }
    // Two shards and their index.
    let shards = dir.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    let a = safetensors::serialize(
        &[(TensorSpec::new("a", DType::BF16, vec![5000]), &synth::bf16_weights(5000, 1)[..])],
        &BTreeMap::new(),
        8,
    )
    .unwrap();
    let b = safetensors::serialize(
        &[(TensorSpec::new("b", DType::F16, vec![3]), &[1u8, 2, 3, 4, 5, 6][..])],
        &BTreeMap::new(),
        8,
    )
    .unwrap();
    std::fs::write(shards.join("model-00001-of-00002.safetensors"), &a).unwrap();
    std::fs::write(shards.join("model-00002-of-00002.safetensors"), &b).unwrap();
    let index = br#"{"metadata":{"total_size":10006},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#;
    std::fs::write(shards.join("model.safetensors.index.json"), index).unwrap();
    let (_, written) = round_trip(&shards.join("model.safetensors.index.json"), dir.path(), &PackOptions::default());
    assert_eq!(written.len(), 3);
    for w in &written {
        let name = w.file_name().unwrap();
        assert_eq!(std::fs::read(w).unwrap(), std::fs::read(shards.join(name)).unwrap(), "{}", w.display());
    }
}

#[test]
fn a_corrupt_chunk_names_its_tensor_and_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("m.safetensors");
    let data = random(3 * 70_000, 9);
    let file =
        safetensors::serialize(&[(TensorSpec::new("w", DType::BF16, vec![105_000]), &data[..])], &BTreeMap::new(), 8)
            .unwrap();
    std::fs::write(&input, file).unwrap();
    // Raw streams only: a flipped byte decodes fine and only the checksum can catch it.
    let opts = PackOptions { codec: Codec::Raw, ..PackOptions::default() };
    let packed = dir.path().join("m.wlpack");
    weightlift_pack::pack(&input, &packed, &opts, &none).unwrap();
    let pack = Pack::open(&packed).unwrap();
    let item = pack.index.items.iter().find(|i| i.tensor_name() == Some("w")).unwrap().clone();
    let target = pack.index.chunk_streams(item.chunks.start + 1, 2)[1];
    let mut bytes = std::fs::read(&packed).unwrap();
    bytes[(target.offset + 17) as usize] ^= 0x40;
    std::fs::write(&packed, &bytes).unwrap();
    let pack = Pack::open(&packed).unwrap();
    match weightlift_pack::verify(&pack, 1, &none) {
        Err(PackError::Checksum { item, chunk, .. }) => assert_eq!((item.as_str(), chunk), ("w", 1)),
        other => panic!("expected a checksum error, got {other:?}"),
    }
    let message = weightlift_pack::verify(&pack, 1, &none).unwrap_err().to_string();
    assert!(message.contains("\"w\", chunk 1") && !message.contains('\n'), "{message}");
    // A zstd stream with a flipped byte fails to decode or fails its checksum, never passes.
    let packed = dir.path().join("z.wlpack");
    weightlift_pack::pack(
        &input,
        &packed,
        &PackOptions { codec: Codec::Zstd, level: Level(3), ..PackOptions::default() },
        &none,
    )
    .unwrap();
    let pack = Pack::open(&packed).unwrap();
    let s = pack.index.streams.iter().find(|s| s.codec == Codec::Zstd).copied();
    if let Some(s) = s {
        let mut bytes = std::fs::read(&packed).unwrap();
        bytes[(s.offset + s.stored_len / 2) as usize] ^= 0x10;
        std::fs::write(&packed, &bytes).unwrap();
        let pack = Pack::open(&packed).unwrap();
        assert!(matches!(
            weightlift_pack::verify(&pack, 1, &none),
            Err(PackError::Checksum { .. } | PackError::Codec { .. })
        ));
    }
}

#[test]
fn a_truncated_or_tampered_pack_is_a_format_error() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("all.safetensors");
    std::fs::write(&input, every_dtype_file()).unwrap();
    let packed = dir.path().join("all.wlpack");
    weightlift_pack::pack(&input, &packed, &PackOptions::default(), &none).unwrap();
    let bytes = std::fs::read(&packed).unwrap();
    let kind = |b: &[u8]| {
        let p = dir.path().join("bad.wlpack");
        std::fs::write(&p, b).unwrap();
        match Pack::open(&p) {
            Err(PackError::Format(e)) => e.kind,
            other => panic!("expected a format error, got {other:?}"),
        }
    };
    for cut in [bytes.len() - 1, bytes.len() / 2, 100, 31, 0] {
        let k = kind(&bytes[..cut]);
        assert!(
            matches!(
                k,
                ErrorKind::Truncated { .. }
                    | ErrorKind::PackStream { .. }
                    | ErrorKind::PackTrailing { .. }
                    | ErrorKind::HeaderPastEnd { .. }
                    | ErrorKind::PackTablesPastEnd { .. }
            ),
            "cut at {cut}: {k:?}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(kind(&longer), ErrorKind::PackTrailing { .. }));
    let mut flipped = bytes.clone();
    flipped[40] ^= 1;
    assert!(matches!(kind(&flipped), ErrorKind::PackIndexChecksum { .. }));
}

/// Options that cannot be honoured are refused before anything is read or written, not clamped without a word.
#[test]
fn options_out_of_range_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("a.safetensors");
    std::fs::write(&input, every_dtype_file()).unwrap();
    let out = dir.path().join("a.wlpack");
    let bad = [
        PackOptions { plane_chunk: 0, ..PackOptions::default() },
        PackOptions { plane_chunk: 1 << 40, ..PackOptions::default() },
        PackOptions { level: Level(99), ..PackOptions::default() },
        PackOptions { codec: Codec::Deflate, level: Level(10), ..PackOptions::default() },
    ];
    for opts in bad {
        let e = weightlift_pack::pack(&input, &out, &opts, &none).expect_err("accepted");
        assert!(matches!(e, PackError::Invalid(_)), "{opts:?}: {e}");
    }
    assert!(!out.exists());
}

/// Neither pack nor unpack ever writes over its input, by any name.
#[test]
fn a_pack_or_unpack_over_its_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("a.safetensors");
    let original = every_dtype_file();
    std::fs::write(&input, &original).unwrap();
    let link = dir.path().join("link.safetensors");
    std::fs::hard_link(&input, &link).unwrap();
    for out in [&input, &link] {
        let e = weightlift_pack::pack(&input, out, &PackOptions::default(), &none).expect_err("packed over the input");
        assert!(matches!(&e, PackError::Format(f) if matches!(f.kind, ErrorKind::OutputIsInput { .. })), "{e}");
    }
    assert_eq!(std::fs::read(&input).unwrap(), original);
    let packed = dir.path().join("a.wlpack");
    weightlift_pack::pack(&input, &packed, &PackOptions::default(), &none).unwrap();
    let before = std::fs::read(&packed).unwrap();
    let pack = Pack::open(&packed).unwrap();
    let e = weightlift_pack::unpack(&pack, &packed, 1, &none).expect_err("unpacked over the pack");
    assert!(matches!(&e, PackError::Format(f) if matches!(f.kind, ErrorKind::OutputIsInput { .. })), "{e}");
    assert_eq!(std::fs::read(&packed).unwrap(), before);
    let mut left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    left.sort();
    assert_eq!(left, ["a.safetensors", "a.wlpack", "link.safetensors"]);
}
