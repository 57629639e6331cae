//! The `candle-cuda` feature: every tensor weightlift loads onto a candle CUDA device equals, in type, shape and
//! device bytes, what candle's own safetensors loader puts there from the same file, and the file's bytes. Skips,
//! saying why, where candle cannot open `cuda:0`.
#![cfg(feature = "candle-cuda")]

use std::collections::BTreeMap;

use weightlift::candle_core::{self, Tensor};
use weightlift::format::DType;
use weightlift::format::safetensors::{TensorSpec, serialize};
use weightlift::format::synth;
use weightlift::{Engine, Error, Settings};

/// candle's `cuda:0`, or why there is none (after checking that weightlift says so too, as a typed error).
fn device() -> Option<candle_core::Device> {
    match candle_core::Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            let engine = Engine::new(Settings::default()).unwrap();
            let ours = engine.gpu(0).expect_err("candle has no cuda:0 but weightlift has");
            assert!(matches!(ours, Error::Cuda(_)), "{ours:?}");
            let why = e.to_string(); // candle appends a backtrace where RUST_BACKTRACE is set
            println!("skipped: candle cannot open cuda:0 ({}); weightlift: {ours}", why.lines().next().unwrap_or(""));
            None
        }
    }
}

/// A safetensors file holding one tensor of each of candle's fourteen types, with seeded random bytes; odd row
/// counts, so that offsets are not all aligned, and rows of 40 elements, so that the 4- and 6-bit types fill whole
/// bytes.
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
        DType::F6E2M3,
        DType::F6E3M2,
        DType::F4,
        DType::F8E8M0,
    ];
    let mut tensors = Vec::new();
    for (i, dtype) in types.into_iter().enumerate() {
        let shape = vec![3 + 2 * i as u64, 40];
        let n = dtype.byte_size(&shape).unwrap() as usize;
        let mut data = vec![0u8; n];
        synth::tensor_bytes(11, i as u64, 0, &mut data);
        tensors.push((TensorSpec::new(format!("t{i}.{}", dtype.name()), dtype, shape), data));
    }
    let refs: Vec<(TensorSpec, &[u8])> = tensors.iter().map(|(s, d)| (s.clone(), d.as_slice())).collect();
    let path = dir.join("all.safetensors");
    std::fs::write(&path, serialize(&refs, &BTreeMap::new(), 8).unwrap()).unwrap();
    path
}

/// The bytes of `t`'s device storage, copied to the host as stored (candle's own conversions would refuse its MX
/// types).
fn device_bytes(t: &Tensor) -> Vec<u8> {
    weightlift::candle::device_bytes(t).unwrap()
}

#[test]
fn cuda_tensors_equal_candles_own_loader() {
    let Some(gpu) = device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();

    let ours = weightlift::candle::load(&engine, &index, &gpu).unwrap();
    let theirs = candle_core::safetensors::load(&path, &gpu).unwrap();
    let file = std::fs::read(&path).unwrap();
    assert_eq!(ours.len(), index.tensors.len());
    assert_eq!(ours.len(), theirs.len());
    for entry in &index.tensors {
        let (a, b) = (&ours[&entry.name], &theirs[&entry.name]);
        assert!(a.device().same_device(&gpu), "{}: on {:?}", entry.name, a.device());
        assert_eq!(a.dtype(), b.dtype(), "{}", entry.name);
        assert_eq!(a.dims(), b.dims(), "{}", entry.name);
        let bytes = device_bytes(a);
        assert_eq!(bytes, device_bytes(b), "{}: bytes differ from candle's loader", entry.name);
        assert_eq!(
            bytes,
            &file[entry.offset as usize..entry.end() as usize],
            "{}: bytes differ from the file",
            entry.name
        );
        assert!(bytes.iter().any(|&x| x != 0), "{}: all zero, the comparison would prove little", entry.name);
    }
    // candle computes with them on the device (its kernels: comparison, cast, sum) as with its own.
    let u32_name = &index.tensors.iter().find(|t| t.dtype == DType::U32).unwrap().name;
    let (a, b) = (&ours[u32_name], &theirs[u32_name]);
    let equal = a.eq(b).unwrap().to_dtype(candle_core::DType::U32).unwrap().sum_all().unwrap();
    assert_eq!(equal.to_scalar::<u32>().unwrap() as usize, a.elem_count());
}

#[test]
fn a_type_candle_lacks_fails_naming_the_tensor_on_cuda() {
    let Some(gpu) = device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u16.safetensors");
    let data = [1u8, 2, 3, 4];
    let spec = TensorSpec::new("counts", DType::U16, vec![2]);
    std::fs::write(&path, serialize(&[(spec, &data[..])], &BTreeMap::new(), 8).unwrap()).unwrap();
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    let err = weightlift::candle::load(&engine, &index, &gpu).unwrap_err().to_string();
    assert!(err.contains("\"counts\"") && err.contains("candle has no"), "{err}");
}

#[test]
fn device_bytes_refuses_a_tensor_not_on_cuda() {
    // Needs no GPU: a host tensor is refused before any device is touched.
    let t = Tensor::arange(1f32, 7., &candle_core::Device::Cpu).unwrap();
    let e = weightlift::candle::device_bytes(&t).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("not CUDA"), "{e}");
}
