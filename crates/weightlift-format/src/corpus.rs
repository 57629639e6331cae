//! Hostile checkpoints: one malformed file (or set of files) per defect the readers must catch, each with the
//! error it must produce. Used by this crate's tests, the CLI's tests and as fuzzing seeds.

use std::collections::BTreeMap;

use crate::dtype::{DType, GgmlType};
use crate::gguf::{self, GgufArray, GgufTensorSpec, GgufValue};
use crate::safetensors::{self, TensorSpec};

/// One hostile case: the files to write, which of them to open, and the `ErrorKind` variant expected.
#[derive(Clone, Debug)]
pub struct Hostile {
    /// The defect, in a few words (the fuzz seeds are named after it).
    pub name: &'static str,
    /// (file name, contents); the first is the one to open.
    pub files: Vec<(String, Vec<u8>)>,
    /// Name of the expected `ErrorKind` variant.
    pub expect: &'static str,
}

fn st(header: &str, data_len: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend((0..data_len).map(|i| (i % 251) as u8 + 1));
    v
}

fn one(name: &'static str, file: &str, bytes: Vec<u8>, expect: &'static str) -> Hostile {
    Hostile { name, files: vec![(file.to_string(), bytes)], expect }
}

/// A valid GGUF header builder whose fields can be set to hostile values.
struct G(Vec<u8>);

impl G {
    fn new(version: u32, n_tensors: u64, n_kv: u64) -> G {
        let mut v = b"GGUF".to_vec();
        v.extend_from_slice(&version.to_le_bytes());
        v.extend_from_slice(&n_tensors.to_le_bytes());
        v.extend_from_slice(&n_kv.to_le_bytes());
        G(v)
    }
    fn u32(mut self, x: u32) -> G {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn u64(mut self, x: u64) -> G {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn str(self, s: &str) -> G {
        let mut g = self.u64(s.len() as u64);
        g.0.extend_from_slice(s.as_bytes());
        g
    }
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> G {
        let mut g = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            g = g.u64(d);
        }
        g.u32(ty).u64(offset)
    }
    /// Pads to 32 bytes and appends `data` bytes of data.
    fn data(mut self, data: usize) -> Vec<u8> {
        let n = self.0.len().next_multiple_of(32);
        self.0.resize(n, 0);
        self.0.extend((0..data).map(|i| (i % 251) as u8 + 1));
        self.0
    }
}

/// Bytes of the long metadata arrays of the corpus.
const LONG: u64 = 1 << 20;

/// A GGUF file whose one metadata value is an array of `count` elements of type `elem`, each encoded as `item`,
/// and whose one tensor lies past the end of the file.
fn long_array(elem: u32, count: u64, item: &[u8]) -> Vec<u8> {
    let mut g = G::new(3, 1, 1).str("big").u32(9).u32(elem).u64(count);
    for _ in 0..count {
        g.0.extend_from_slice(item);
    }
    g.tensor("t", &[64], 0, 0).data(16)
}

/// Tensors of the shard behind [`wide_shard_index`]: more than the largest real indexes (MoE models, 50-100 k).
pub const WIDE_SHARD_TENSORS: usize = 200_000;

/// A shard index whose one shard holds [`WIDE_SHARD_TENSORS`] tensors, all listed, plus one listed tensor the shard
/// lacks (checked last): every listed name is looked up in the shard, so a lookup that is not constant time makes
/// this hang rather than fail.
pub fn wide_shard_index() -> Hostile {
    let names: Vec<String> = (0..WIDE_SHARD_TENSORS).map(|i| format!("model.layers.{i}.w")).collect();
    let specs: Vec<(TensorSpec, &[u8])> =
        names.iter().map(|n| (TensorSpec::new(n, DType::U8, vec![1]), &[1u8][..])).collect();
    let shard = safetensors::serialize(&specs, &BTreeMap::new(), 8).unwrap_or_default();
    let mut map = serde_json::Map::new();
    for n in &names {
        map.insert(n.clone(), "s.safetensors".into());
    }
    map.insert("zz.missing".into(), "s.safetensors".into());
    let index = serde_json::json!({ "weight_map": map }).to_string().into_bytes();
    Hostile {
        name: "shard index of 200k tensors missing one",
        files: vec![("model.safetensors.index.json".into(), index), ("s.safetensors".into(), shard)],
        expect: "ShardTensorMissing",
    }
}

/// Every hostile case.
pub fn hostile() -> Vec<Hostile> {
    let mut v = vec![
        one("short file", "a.safetensors", vec![1, 2, 3, 4, 5], "HeaderTooSmall"),
        one(
            "header length past end",
            "a.safetensors",
            [1000u64.to_le_bytes().as_slice(), b"{}"].concat(),
            "HeaderPastEnd",
        ),
        one(
            "header larger than cap",
            "a.safetensors",
            [200_000_000u64.to_le_bytes().as_slice(), b"{}"].concat(),
            "HeaderTooLarge",
        ),
        one(
            "header length overflows",
            "a.safetensors",
            [u64::MAX.to_le_bytes().as_slice(), b"{}"].concat(),
            "HeaderTooLarge",
        ),
        one("truncated header", "a.safetensors", st(r#"{"a":{"dtype":"U8","shape":[2],"da"#, 2), "HeaderJson"),
        one(
            "not utf-8",
            "a.safetensors",
            {
                let mut b = st(r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#, 2);
                b[10] = 0xff;
                b
            },
            "HeaderNotUtf8",
        ),
        one("not json", "a.safetensors", st("{{{{", 0), "HeaderJson"),
        one("json nesting bomb", "a.safetensors", st(&format!(r#"{{"a":{}"#, "[".repeat(50_000)), 0), "HeaderJson"),
        one("header is an array", "a.safetensors", st("[1,2]", 0), "HeaderJson"),
        one(
            "overlapping offsets",
            "a.safetensors",
            st(
                r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#,
                6,
            ),
            "Overlap",
        ),
        one(
            "offsets past end",
            "a.safetensors",
            st(r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}"#, 4),
            "OffsetPastEnd",
        ),
        one(
            "gap between tensors",
            "a.safetensors",
            st(
                r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}"#,
                6,
            ),
            "Uncovered",
        ),
        one(
            "trailing bytes",
            "a.safetensors",
            st(r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#, 9),
            "Uncovered",
        ),
        one(
            "dtype x shape mismatch",
            "a.safetensors",
            st(r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, 8),
            "SizeMismatch",
        ),
        one(
            "shape product overflows",
            "a.safetensors",
            st(r#"{"a":{"dtype":"U8","shape":[4294967296,4294967296,2],"data_offsets":[0,8]}}"#, 8),
            "ShapeOverflow",
        ),
        one(
            "byte count overflows",
            "a.safetensors",
            st(r#"{"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}}"#, 8),
            "ShapeOverflow",
        ),
        one(
            "duplicate names",
            "a.safetensors",
            st(
                r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}"#,
                4,
            ),
            "DuplicateName",
        ),
        one(
            "unknown dtype",
            "a.safetensors",
            st(r#"{"a":{"dtype":"F12","shape":[2],"data_offsets":[0,2]}}"#, 2),
            "UnknownDtype",
        ),
        one(
            "reversed offsets",
            "a.safetensors",
            st(r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[4,2]}}"#, 4),
            "OffsetsReversed",
        ),
        one(
            "negative dimension",
            "a.safetensors",
            st(r#"{"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}}"#, 2),
            "InvalidEntry",
        ),
        one("missing data_offsets", "a.safetensors", st(r#"{"a":{"dtype":"U8","shape":[2]}}"#, 2), "InvalidEntry"),
        one(
            "non-string metadata",
            "a.safetensors",
            st(r#"{"__metadata__":{"n":3},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#, 2),
            "MetadataNotString",
        ),
        one(
            "packed f4 not whole bytes",
            "a.safetensors",
            st(r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#, 2),
            "NotWholeBytes",
        ),
        // GGUF
        one("gguf bad magic", "a.gguf", b"GGUX\x03\0\0\0".to_vec(), "BadMagic"),
        one("gguf version 1", "a.gguf", G::new(1, 0, 0).data(0), "UnsupportedVersion"),
        one("gguf version 99", "a.gguf", G::new(99, 0, 0).data(0), "UnsupportedVersion"),
        one("gguf big-endian", "a.gguf", G::new(3u32.swap_bytes(), 0, 0).data(0), "BigEndian"),
        one("gguf truncated in counts", "a.gguf", G::new(3, 0, 0).0[..12].to_vec(), "Truncated"),
        one("gguf absurd tensor count", "a.gguf", G::new(3, u64::MAX / 2, 0).data(64), "CountTooLarge"),
        one("gguf absurd metadata count", "a.gguf", G::new(3, 0, 1 << 60).data(64), "CountTooLarge"),
        one("gguf absurd string length", "a.gguf", G::new(3, 0, 1).u64(1 << 62).data(16), "StringTooLong"),
        one(
            "gguf absurd array length",
            "a.gguf",
            G::new(3, 0, 1).str("k").u32(9).u32(10).u64(1 << 61).data(16),
            "CountTooLarge",
        ),
        one("gguf unknown value type", "a.gguf", G::new(3, 0, 1).str("k").u32(77).u32(0).data(0), "UnknownValueType"),
        one(
            "gguf nesting too deep",
            "a.gguf",
            {
                let mut g = G::new(3, 0, 1).str("k").u32(9);
                for _ in 0..20 {
                    g = g.u32(9).u64(1);
                }
                g.u32(4).u64(0).data(0)
            },
            "NestingTooDeep",
        ),
        one("gguf truncated metadata", "a.gguf", G::new(3, 0, 2).str("general.name").u32(8).str("x").0, "Truncated"),
        one(
            "gguf bad alignment",
            "a.gguf",
            G::new(3, 0, 1).str("general.alignment").u32(4).u32(3).data(0),
            "BadAlignment",
        ),
        one(
            "gguf alignment not an integer",
            "a.gguf",
            G::new(3, 0, 1).str("general.alignment").u32(8).str("x").data(0),
            "MetadataType",
        ),
        one("gguf unknown ggml type", "a.gguf", G::new(3, 1, 0).tensor("t", &[32], 31, 0).data(64), "UnknownGgmlType"),
        one(
            "gguf too many dims",
            "a.gguf",
            G::new(3, 1, 0).tensor("t", &[1, 1, 1, 1, 1], 0, 0).data(64),
            "TooManyDims",
        ),
        one("gguf tensor past end", "a.gguf", G::new(3, 1, 0).tensor("t", &[64], 0, 0).data(100), "TensorPastEnd"),
        one(
            "gguf tensor offset overflows",
            "a.gguf",
            G::new(3, 1, 0).tensor("t", &[64], 0, u64::MAX - 31).data(100),
            "TensorPastEnd",
        ),
        one("gguf misaligned tensor", "a.gguf", G::new(3, 1, 0).tensor("t", &[4], 0, 4).data(64), "TensorMisaligned"),
        one(
            "gguf overlapping tensors",
            "a.gguf",
            G::new(3, 2, 0).tensor("a", &[16], 0, 0).tensor("b", &[16], 0, 32).data(256),
            "Overlap",
        ),
        one(
            "gguf duplicate tensor",
            "a.gguf",
            G::new(3, 2, 0).tensor("a", &[8], 0, 0).tensor("a", &[8], 0, 32).data(256),
            "DuplicateName",
        ),
        one(
            "gguf partial quant block",
            "a.gguf",
            G::new(3, 1, 0).tensor("q", &[100, 2], 12, 0).data(1024),
            "NotWholeBlocks",
        ),
        one(
            "gguf dims overflow",
            "a.gguf",
            G::new(3, 1, 0).tensor("t", &[1 << 40, 1 << 40], 0, 0).data(64),
            "ShapeOverflow",
        ),
        one(
            "gguf duplicate metadata key",
            "a.gguf",
            G::new(3, 0, 2).str("k").u32(4).u32(1).str("k").u32(4).u32(2).data(0),
            "DuplicateMetadataKey",
        ),
        // Long metadata arrays cost about their size in the file, whatever their element type (the test bounds the
        // parser's memory by a small multiple of the file): here they are followed by a tensor past the end.
        one("gguf long uint8 array", "a.gguf", long_array(0, LONG, &[0]), "TensorPastEnd"),
        one("gguf long array of empty strings", "a.gguf", long_array(8, LONG / 8, &[0; 8]), "TensorPastEnd"),
        one("gguf long array of empty arrays", "a.gguf", long_array(9, LONG / 12, &[0; 12]), "TensorPastEnd"),
        one("not a checkpoint", "a.bin", b"hello, world, this is text".to_vec(), "UnknownFormat"),
    ];
    // Sharded checkpoints.
    let shard =
        safetensors::serialize(&[(TensorSpec::new("w", DType::U8, vec![3]), &[7u8, 8, 9][..])], &BTreeMap::new(), 8)
            .unwrap_or_default();
    v.push(Hostile {
        name: "shard missing a listed tensor",
        files: vec![
            (
                "model.safetensors.index.json".into(),
                br#"{"weight_map":{"w":"s1.safetensors","v":"s1.safetensors"}}"#.to_vec(),
            ),
            ("s1.safetensors".into(), shard.clone()),
        ],
        expect: "ShardTensorMissing",
    });
    v.push(Hostile {
        name: "shard path escapes",
        files: vec![("model.safetensors.index.json".into(), br#"{"weight_map":{"w":"../s1.safetensors"}}"#.to_vec())],
        expect: "ShardIndex",
    });
    v.push(Hostile {
        name: "shard path absolute",
        files: vec![("model.safetensors.index.json".into(), br#"{"weight_map":{"w":"/etc/passwd"}}"#.to_vec())],
        expect: "ShardIndex",
    });
    v.push(Hostile {
        name: "shard index without weight_map",
        files: vec![("model.safetensors.index.json".into(), br#"{"metadata":{}}"#.to_vec())],
        expect: "ShardIndex",
    });
    v.push(Hostile {
        name: "shard index nesting bomb",
        files: vec![(
            "model.safetensors.index.json".into(),
            format!(r#"{{"weight_map":{}"#, "[".repeat(50_000)).into(),
        )],
        expect: "ShardIndex",
    });
    v.push(Hostile {
        name: "shard file missing",
        files: vec![("model.safetensors.index.json".into(), br#"{"weight_map":{"w":"gone.safetensors"}}"#.to_vec())],
        expect: "Open",
    });
    v.push(Hostile {
        name: "tensor in two shards",
        files: vec![
            (
                "model.safetensors.index.json".into(),
                br#"{"weight_map":{"w":"s1.safetensors","x":"s2.safetensors"}}"#.to_vec(),
            ),
            ("s1.safetensors".into(), shard.clone()),
            ("s2.safetensors".into(), {
                let specs = [
                    (TensorSpec::new("w", DType::U8, vec![3]), &[1u8, 2, 3][..]),
                    (TensorSpec::new("x", DType::U8, vec![1]), &[4u8][..]),
                ];
                safetensors::serialize(&specs, &BTreeMap::new(), 8).unwrap_or_default()
            }),
        ],
        expect: "DuplicateAcrossFiles",
    });
    v
}

/// A small valid GGUF file image (for fuzzing seeds and tests).
pub fn valid_gguf() -> Vec<u8> {
    let kv = vec![
        ("general.architecture".to_string(), GgufValue::String("llama".into())),
        ("a".to_string(), GgufValue::Array(GgufArray::Array(vec![GgufArray::U32(vec![1])]))),
    ];
    let specs = [
        GgufTensorSpec { name: "w".into(), ggml: GgmlType::Q4_0, shape: vec![2, 64] },
        GgufTensorSpec { name: "b".into(), ggml: GgmlType::F32, shape: vec![3] },
    ];
    let Ok(lay) = gguf::layout(&kv, &specs) else { return Vec::new() };
    let mut out = Vec::new();
    let _ = lay.write_to(&mut out, 4096, |i, off, buf| {
        crate::synth::tensor_bytes(1, i as u64, off, buf);
        Ok(())
    });
    out
}

/// A pack image from a header, chunk and stream records, and `data` bytes of stream data after the aligned tables;
/// the index checksum is computed, so each case reaches the check it targets.
fn pack_image(header: &serde_json::Value, chunks: &[[u64; 4]], streams: &[[u64; 4]], data: usize) -> Vec<u8> {
    let mut h = serde_json::to_vec(header).unwrap_or_default();
    h.resize(h.len().next_multiple_of(16), b' ');
    let tables: Vec<u8> = chunks.iter().chain(streams).flatten().flat_map(|w| w.to_le_bytes()).collect();
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(&h);
    hasher.update(&tables);
    let mut v = crate::wlpack::MAGIC.to_vec();
    for w in [h.len() as u64, tables.len() as u64, hasher.digest()] {
        v.extend_from_slice(&w.to_le_bytes());
    }
    v.extend_from_slice(&h);
    v.extend_from_slice(&tables);
    v.resize(v.len().next_multiple_of(16), 0);
    v.extend((0..data).map(|i| (i % 251) as u8));
    v
}

/// Where stream data starts for a header and record counts (what the reader computes).
fn data_start(header: &serde_json::Value, records: usize) -> u64 {
    let h = serde_json::to_vec(header).unwrap_or_default().len().next_multiple_of(16) as u64;
    (32 + h + 32 * records as u64).next_multiple_of(16)
}

/// A valid small pack's parts: a 24-byte safetensors file of an 8-byte gap and one BF16 tensor of 8 elements, as 2
/// chunks and 3 raw streams of 8 bytes.
fn pack_parts() -> (serde_json::Value, Vec<[u64; 4]>, Vec<[u64; 4]>) {
    let header = serde_json::json!({
        "wlpack": 1, "checksum": "xxh3-64", "source": "safetensors",
        "files": [{"name": "m.safetensors", "len": 24}],
        "tensors": [{"name": "w", "dtype": "BF16", "shape": [8], "file": 0, "offset": 8, "nbytes": 16, "planes": 2, "chunks": [0, 1]}],
        "gaps": [{"file": 0, "offset": 0, "nbytes": 8, "chunks": [1, 1]}],
        "chunks": 2, "streams": 3,
    });
    let ds = data_start(&header, 5);
    let chunks = vec![[0, 16, 7, 0], [0, 8, 9, 2]];
    let streams = vec![[ds, 8, 8, 0], [ds + 16, 8, 8, 1 << 8], [ds + 32, 8, 8, 0]];
    (header, chunks, streams)
}

/// A valid pack image (fuzzing seed; the reader accepts it).
pub fn valid_pack() -> Vec<u8> {
    let (h, c, s) = pack_parts();
    pack_image(&h, &c, &s, 40)
}

/// Changes a valid pack's header, chunk records and stream records; returns the stream data length to write.
type PackEdit<'a> = &'a dyn Fn(&mut serde_json::Value, &mut Vec<[u64; 4]>, &mut Vec<[u64; 4]>) -> usize;

/// Hostile packs: one defect each, with the `ErrorKind` variant `wlpack::read` must give.
pub fn hostile_packs() -> Vec<Hostile> {
    let (h, c, s) = pack_parts();
    let with = |edit: PackEdit| {
        let (mut h, mut c, mut s) = (h.clone(), c.clone(), s.clone());
        let data = edit(&mut h, &mut c, &mut s);
        pack_image(&h, &c, &s, data)
    };
    let valid = valid_pack();
    let patched = |at: usize, bytes: &[u8]| {
        let mut v = valid.clone();
        v[at..at + bytes.len()].copy_from_slice(bytes);
        v
    };
    let p = |name: &'static str, bytes: Vec<u8>, expect: &'static str| one(name, "a.wlpack", bytes, expect);
    vec![
        p("pack bad magic", patched(0, b"WLPACX"), "PackBadMagic"),
        p("pack version 2", patched(7, &[2]), "PackUnsupportedVersion"),
        p("pack truncated preamble", valid[..20].to_vec(), "Truncated"),
        p("pack header length absurd", patched(8, &u64::MAX.to_le_bytes()), "HeaderTooLarge"),
        p("pack header past end", patched(8, &(1u64 << 20).to_le_bytes()), "HeaderPastEnd"),
        p("pack tables past end", patched(16, &(u64::MAX - 31).to_le_bytes()), "PackTablesPastEnd"),
        p("pack index checksum", patched(40, b"x"), "PackIndexChecksum"),
        p("pack truncated data", valid[..valid.len() - 1].to_vec(), "PackStream"),
        p("pack trailing bytes", [valid.as_slice(), &[0]].concat(), "PackTrailing"),
        p(
            "pack chunk counts overflow",
            with(&|h, _, _| {
                h["chunks"] = u64::MAX.into();
                40
            }),
            "PackHeader",
        ),
        p("pack not json", pack_image(&serde_json::json!("just a string"), &c, &s, 40), "PackHeader"),
        p(
            "pack unknown field",
            with(&|h, _, _| {
                h["extra"] = 1.into();
                40
            }),
            "PackHeader",
        ),
        p(
            "pack file name with slash",
            with(&|h, _, _| {
                h["files"][0]["name"] = "../m.safetensors".into();
                40
            }),
            "PackFileName",
        ),
        p(
            "pack unknown dtype",
            with(&|h, _, _| {
                h["tensors"][0]["dtype"] = "F12".into();
                40
            }),
            "UnknownDtype",
        ),
        p(
            "pack dtype × shape mismatch",
            with(&|h, _, _| {
                h["tensors"][0]["shape"] = serde_json::json!([9]);
                40
            }),
            "PackItem",
        ),
        p(
            "pack bad plane count",
            with(&|h, _, _| {
                h["tensors"][0]["planes"] = 3.into();
                40
            }),
            "PackItem",
        ),
        p(
            "pack file index past files",
            with(&|h, _, _| {
                h["gaps"][0]["file"] = 5.into();
                40
            }),
            "PackItem",
        ),
        p(
            "pack items not in chunk order",
            with(&|h, _, _| {
                h["gaps"][0]["chunks"] = serde_json::json!([0, 1]);
                40
            }),
            "PackItem",
        ),
        p(
            "pack gap in file coverage",
            with(&|h, _, _| {
                h["files"][0]["len"] = 30.into();
                40
            }),
            "PackCoverage",
        ),
        p(
            "pack overlapping items",
            with(&|h, _, _| {
                h["gaps"][0]["offset"] = 4.into();
                h["files"][0]["len"] = 20.into();
                40
            }),
            "PackCoverage",
        ),
        p(
            "pack item past its file",
            with(&|h, _, _| {
                h["tensors"][0]["offset"] = u64::MAX.into();
                40
            }),
            "PackCoverage",
        ),
        p(
            "pack chunk of zero bytes",
            with(&|_, c, _| {
                c[1][1] = 0;
                40
            }),
            "PackChunk",
        ),
        p(
            "pack chunk past its item",
            with(&|_, c, _| {
                c[0][1] = u64::MAX - 1;
                40
            }),
            "PackChunk",
        ),
        p(
            "pack chunk offset gap",
            with(&|_, c, _| {
                c[1][0] = 4;
                40
            }),
            "PackChunk",
        ),
        p(
            "pack chunk first stream",
            with(&|_, c, _| {
                c[1][3] = 1;
                40
            }),
            "PackChunk",
        ),
        p(
            "pack unknown codec",
            with(&|_, _, s| {
                s[0][3] = 77;
                40
            }),
            "PackStream",
        ),
        p(
            "pack stream plane order",
            with(&|_, _, s| {
                s[1][3] = 0;
                40
            }),
            "PackStream",
        ),
        p(
            "pack raw stream size",
            with(&|_, _, s| {
                s[2][1] = 9;
                41
            }),
            "PackStream",
        ),
        p(
            "pack stream misaligned",
            with(&|_, _, s| {
                s[1][0] += 1;
                41
            }),
            "PackStream",
        ),
        p(
            "pack streams overlap",
            with(&|_, _, s| {
                s[1][0] = s[0][0];
                24
            }),
            "PackStream",
        ),
        p(
            "pack stream decodes to wrong size",
            with(&|_, _, s| {
                s[0][2] = 1 << 40;
                40
            }),
            "PackStream",
        ),
    ]
}
