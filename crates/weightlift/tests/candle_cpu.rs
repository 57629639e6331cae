//! The `candle` feature on the CPU: every tensor weightlift hands candle equals, in type, shape and bytes, what
//! candle's own safetensors loader makes of the same file, and the file's bytes themselves.
#![cfg(feature = "candle")]

use std::collections::BTreeMap;

use weightlift::candle_core::{self, Tensor};
use weightlift::format::DType;
use weightlift::format::safetensors::{TensorSpec, serialize};
use weightlift::format::synth;
use weightlift::{Engine, Settings};

fn bytes_of(t: &Tensor) -> Vec<u8> {
    let mut out = Vec::new();
    t.write_bytes(&mut out).unwrap();
    out
}

/// A safetensors file holding one tensor of each of ten types candle has (not its MX types), filled with seeded
/// random bytes (odd shapes, so that offsets are not all aligned).
fn checkpoint(dir: &std::path::Path) -> std::path::PathBuf {
    let types = [
        DType::BF16,
        DType::F16,
        DType::F32,
        DType::F64,
        DType::U8,
        DType::U32,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F8E4M3,
    ];
    let mut tensors = Vec::new();
    for (i, dtype) in types.into_iter().enumerate() {
        let shape = vec![3 + i as u64, 37];
        let n = dtype.byte_size(&shape).unwrap() as usize;
        let mut data = vec![0u8; n];
        synth::tensor_bytes(7, i as u64, 0, &mut data);
        tensors.push((TensorSpec::new(format!("t{i}.{}", dtype.name()), dtype, shape), data));
    }
    let refs: Vec<(TensorSpec, &[u8])> = tensors.iter().map(|(s, d)| (s.clone(), d.as_slice())).collect();
    let path = dir.join("all.safetensors");
    std::fs::write(&path, serialize(&refs, &BTreeMap::new(), 8).unwrap()).unwrap();
    path
}

#[test]
fn candle_tensors_equal_candles_own_loader() {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();

    let ours = weightlift::candle::load(&engine, &index, &candle_core::Device::Cpu).unwrap();
    let theirs = candle_core::safetensors::load(&path, &candle_core::Device::Cpu).unwrap();
    let file = std::fs::read(&path).unwrap();
    assert_eq!(ours.len(), index.tensors.len());
    assert_eq!(ours.len(), theirs.len());
    for entry in &index.tensors {
        let (a, b) = (&ours[&entry.name], &theirs[&entry.name]);
        assert_eq!(a.dtype(), b.dtype(), "{}", entry.name);
        assert_eq!(a.dims(), b.dims(), "{}", entry.name);
        let bytes = bytes_of(a);
        assert_eq!(bytes, bytes_of(b), "{}: bytes differ from candle's loader", entry.name);
        assert_eq!(
            bytes,
            &file[entry.offset as usize..entry.end() as usize],
            "{}: bytes differ from the file",
            entry.name
        );
        assert!(bytes.iter().any(|&x| x != 0), "{}: all zero, the comparison would prove little", entry.name);
    }
}

#[test]
fn a_type_candle_lacks_fails_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u16.safetensors");
    let data = [1u8, 2, 3, 4];
    let spec = TensorSpec::new("counts", DType::U16, vec![2]);
    std::fs::write(&path, serialize(&[(spec, &data[..])], &BTreeMap::new(), 8).unwrap()).unwrap();
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    let err = weightlift::candle::load(&engine, &index, &candle_core::Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("\"counts\"") && err.contains("candle has no"), "{err}");
}
