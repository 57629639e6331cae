//! Property tests: whatever the writers lay out, the readers give back exactly (names, dtypes, shapes, byte
//! ranges, bytes), and the upstream `safetensors` crate agrees.

use std::collections::BTreeMap;

use proptest::prelude::*;
use weightlift_format::gguf::{self, GgufArray, GgufTensorSpec, GgufValue};
use weightlift_format::safetensors::{self, TensorSpec};
use weightlift_format::{DType, GgmlType, Metadata};

fn st_dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::plain().collect::<Vec<_>>())
}

fn st_tensor() -> impl Strategy<Value = TensorSpec> {
    ("[a-z][a-z0-9_.]{0,12}", st_dtype(), prop::collection::vec(0u64..6, 0..4)).prop_map(|(name, dtype, mut shape)| {
        // Packed sub-byte dtypes need an element count that fills whole bytes.
        if let Some(bits) = dtype.bits().filter(|b| b % 8 != 0) {
            shape.push(8 / gcd(bits, 8));
        }
        TensorSpec::new(name, dtype, shape)
    })
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn unique(specs: Vec<TensorSpec>) -> Vec<TensorSpec> {
    let mut seen = std::collections::HashSet::new();
    specs.into_iter().filter(|s| seen.insert(s.name.clone())).collect()
}

fn upstream_dtype(d: DType) -> &'static str {
    d.name()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn safetensors_round_trip(specs in prop::collection::vec(st_tensor(), 0..12).prop_map(unique),
                              align in prop::sample::select(vec![8u64, 64, 4096]),
                              meta in prop::collection::btree_map("[a-z]{1,6}", "[ -~]{0,10}", 0..3),
                              seed in any::<u64>()) {
        let data: Vec<Vec<u8>> = specs.iter().enumerate().map(|(i, s)| {
            let n = s.dtype.byte_size(&s.shape).unwrap() as usize;
            let mut v = vec![0u8; n];
            weightlift_format::synth::tensor_bytes(seed, i as u64, 0, &mut v);
            v
        }).collect();
        let pairs: Vec<(TensorSpec, &[u8])> = specs.iter().cloned().zip(data.iter().map(Vec::as_slice)).collect();
        let image = safetensors::serialize(&pairs, &meta, align).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        std::fs::write(&path, &image).unwrap();

        let index = safetensors::read(&path).unwrap();
        prop_assert_eq!(index.tensors.len(), specs.len());
        for (spec, bytes) in specs.iter().zip(&data) {
            let t = index.get(&spec.name).unwrap();
            prop_assert_eq!(t.dtype, spec.dtype);
            prop_assert_eq!(&t.shape, &spec.shape);
            prop_assert_eq!(&image[t.offset as usize..t.end() as usize], bytes.as_slice());
            if align > 8 && t.nbytes > 0 {
                prop_assert_eq!(t.offset % align, 0);
            }
        }
        let Metadata::Safetensors(read_meta) = &index.files[0].metadata else { panic!("metadata kind") };
        for (k, v) in &meta {
            prop_assert_eq!(read_meta.get(k), Some(v));
        }

        // The upstream reader accepts the file and sees the same tensors (plus padding tensors when aligned).
        let up = ::safetensors::SafeTensors::deserialize(&image).unwrap();
        for (spec, bytes) in specs.iter().zip(&data) {
            let view = up.tensor(&spec.name).unwrap();
            prop_assert_eq!(format!("{:?}", view.dtype()), upstream_dtype(spec.dtype));
            let shape: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
            prop_assert_eq!(&shape, &spec.shape);
            prop_assert_eq!(view.data(), bytes.as_slice());
        }
        let extra = up.names().into_iter().filter(|n| !specs.iter().any(|s| s.name == **n)).count();
        if align == 8 { prop_assert_eq!(extra, 0); }
    }

    #[test]
    fn gguf_round_trip(n in 0usize..8, seed in any::<u64>(), align in prop::sample::select(vec![None, Some(64u64), Some(4096)])) {
        let types = GgmlType::ALL;
        let specs: Vec<GgufTensorSpec> = (0..n).map(|i| {
            let g = types[(seed as usize).wrapping_add(i * 7) % types.len()];
            let rows = 1 + (seed >> (i % 50)) % 3;
            GgufTensorSpec { name: format!("t{i}"), ggml: g, shape: vec![rows, g.block_size() * (1 + i as u64 % 2)] }
        }).collect();
        let mut kv = vec![
            ("general.architecture".to_string(), GgufValue::String("test".into())),
            ("n".to_string(), GgufValue::Array(GgufArray::Array(vec![GgufArray::F64(vec![1.5]), GgufArray::String(vec![])]))),
            ("e".to_string(), GgufValue::Array(GgufArray::U8(vec![]))),
            ("u".to_string(), GgufValue::Array(GgufArray::U8((0..=255).collect()))),
            ("s".to_string(), GgufValue::Array(GgufArray::String(vec!["a".into(), String::new(), "é".into()]))),
        ];
        if let Some(a) = align { kv.push(("general.alignment".to_string(), GgufValue::U64(a))); }
        let lay = gguf::layout(&kv, &specs).unwrap();
        let mut image = Vec::new();
        lay.write_to(&mut image, 4096, |i, off, buf| { weightlift_format::synth::tensor_bytes(seed, i as u64, off, buf); Ok(()) }).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        std::fs::write(&path, &image).unwrap();
        let index = gguf::read(&path).unwrap();
        prop_assert_eq!(index.files[0].gguf_version, Some(3));
        let Metadata::Gguf(read_kv) = &index.files[0].metadata else { panic!("metadata kind") };
        prop_assert_eq!(read_kv, &kv);
        prop_assert_eq!(index.tensors.len(), specs.len());
        for (spec, laid) in specs.iter().zip(&lay.tensors) {
            let t = index.get(&spec.name).unwrap();
            prop_assert_eq!(t.dtype, spec.ggml.dtype());
            prop_assert_eq!(&t.shape, &spec.shape);
            prop_assert_eq!(t.offset, laid.offset);
            prop_assert_eq!(t.nbytes, laid.nbytes);
            prop_assert_eq!(t.offset % align.unwrap_or(32), 0);
        }
    }
}

#[test]
fn upstream_written_file_reads_identically() {
    use ::safetensors::tensor::{Dtype, TensorView};
    let a: Vec<u8> = (0..24u8).collect();
    let b: Vec<u8> = (0..6u8).map(|x| x * 3 + 1).collect();
    let views = vec![
        ("a".to_string(), TensorView::new(Dtype::F32, vec![2, 3], &a).unwrap()),
        ("b".to_string(), TensorView::new(Dtype::BF16, vec![3], &b).unwrap()),
    ];
    let mut meta = std::collections::HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    let image = ::safetensors::serialize(views, Some(meta)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("up.safetensors");
    std::fs::write(&path, &image).unwrap();
    let index = safetensors::read(&path).unwrap();
    let ta = index.get("a").unwrap();
    assert_eq!((ta.dtype, ta.shape.clone()), (DType::F32, vec![2, 3]));
    assert_eq!(&image[ta.offset as usize..ta.end() as usize], a.as_slice());
    let tb = index.get("b").unwrap();
    assert_eq!(&image[tb.offset as usize..tb.end() as usize], b.as_slice());
    let Metadata::Safetensors(m) = &index.files[0].metadata else { panic!() };
    assert_eq!(m, &BTreeMap::from([("format".to_string(), "pt".to_string())]));
}
