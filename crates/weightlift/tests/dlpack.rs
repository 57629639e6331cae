//! The `dlpack` feature: every tensor of a safetensors file of random bytes, loaded and exported, reads back through
//! DLPack (the legacy C struct as a C consumer reads it, and the versioned one through dlpark's import) with the
//! file's shape, compact strides, type code, bits and lanes, byte offset, device and every byte; a type DLPack lacks
//! fails naming the tensor. On a GPU the same for device and pinned memory (skipped, saying why, elsewhere).
#![cfg(feature = "dlpack")]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use weightlift::dlpark::Managed;
use weightlift::dlpark::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use weightlift::format::safetensors::{TensorSpec, serialize};
use weightlift::format::{DType, TensorIndex, synth};
use weightlift::{Device, Engine, LoadOpts, Settings, TensorData};

/// Every type DLPack has a code for, with the code and bits it must export as (numbers from DLPack's `dlpack.h`,
/// not from dlpark's constants).
const TYPES: [(DType, u8, u8); 19] = [
    (DType::Bool, 6, 8),
    (DType::U8, 1, 8),
    (DType::I8, 0, 8),
    (DType::U16, 1, 16),
    (DType::I16, 0, 16),
    (DType::U32, 1, 32),
    (DType::I32, 0, 32),
    (DType::U64, 1, 64),
    (DType::I64, 0, 64),
    (DType::F16, 2, 16),
    (DType::BF16, 4, 16),
    (DType::F32, 2, 32),
    (DType::F64, 2, 64),
    (DType::C64, 5, 64),
    (DType::F8E4M3, 10, 8),
    (DType::F8E5M2, 12, 8),
    (DType::F8E8M0, 14, 8),
    (DType::F8E4M3Fnuz, 11, 8),
    (DType::F8E5M2Fnuz, 13, 8),
];

fn code_and_bits(dtype: DType) -> (u8, u8) {
    TYPES.iter().find(|(d, _, _)| *d == dtype).map(|&(_, c, b)| (c, b)).unwrap()
}

/// A tensor of each type (odd shapes, so offsets are not all aligned), a scalar, a tensor of no elements, and one
/// over 1 MiB (a mapped host buffer rather than the allocator's), filled with seeded random bytes.
fn checkpoint(dir: &Path) -> PathBuf {
    let mut tensors: Vec<(TensorSpec, Vec<u8>)> = Vec::new();
    let mut add = |name: String, dtype: DType, shape: Vec<u64>| {
        let mut data = vec![0u8; dtype.byte_size(&shape).unwrap() as usize];
        synth::tensor_bytes(11, tensors.len() as u64, 0, &mut data);
        if dtype == DType::Bool {
            data.iter_mut().for_each(|b| *b &= 1);
        }
        tensors.push((TensorSpec::new(name, dtype, shape), data));
    };
    for (i, (dtype, _, _)) in TYPES.iter().enumerate() {
        add(format!("t{i}.{}", dtype.name()), *dtype, vec![3 + i as u64, 2, 37]);
    }
    add("scalar".into(), DType::F32, vec![]);
    add("empty".into(), DType::F16, vec![0, 5]);
    add("large".into(), DType::BF16, vec![1031, 613]);
    let refs: Vec<(TensorSpec, &[u8])> = tensors.iter().map(|(s, d)| (s.clone(), d.as_slice())).collect();
    let path = dir.join("all.safetensors");
    std::fs::write(&path, serialize(&refs, &BTreeMap::new(), 8).unwrap()).unwrap();
    path
}

/// Checks a descriptor against the file: shape, compact strides, type, byte offset, device, and (through `bytes`,
/// which reads `len` bytes at an address of the descriptor's device) every byte of the tensor's region of `file`.
fn check(
    t: &DLTensor,
    index: &TensorIndex,
    i: usize,
    file: &[u8],
    device: (u32, i32),
    bytes: &dyn Fn(u64, usize) -> Vec<u8>,
) {
    let entry = &index.tensors[i];
    let what = &entry.name;
    assert_eq!(t.ndim as usize, entry.shape.len(), "{what}: ndim");
    // SAFETY: the descriptor's shape and strides hold `ndim` values each (DLPack's contract, checked here for the
    // producer under test), alive while the managed tensor is.
    let (shape, strides) = unsafe {
        if t.ndim == 0 {
            (&[][..], &[][..])
        } else {
            (
                std::slice::from_raw_parts(t.shape, t.ndim as usize),
                std::slice::from_raw_parts(t.strides, t.ndim as usize),
            )
        }
    };
    let want_shape: Vec<i64> = entry.shape.iter().map(|&d| d as i64).collect();
    assert_eq!(shape, want_shape.as_slice(), "{what}: shape");
    let mut want_strides = vec![0i64; shape.len()];
    let mut stride = 1;
    for axis in (0..shape.len()).rev() {
        want_strides[axis] = stride;
        stride *= shape[axis];
    }
    assert_eq!(strides, want_strides.as_slice(), "{what}: strides");
    let (code, bits) = code_and_bits(entry.dtype);
    assert_eq!((t.dtype.code.0, t.dtype.bits, t.dtype.lanes), (code, bits, 1), "{what}: dtype");
    assert_eq!(t.byte_offset, 0, "{what}: byte_offset");
    assert_eq!((t.device.device_type.0, t.device.device_id), device, "{what}: device");
    let want = &file[entry.offset as usize..entry.end() as usize];
    if want.is_empty() {
        assert!(t.data.is_null(), "{what}: a tensor of no bytes has a NULL data pointer");
        return;
    }
    assert!(!t.data.is_null(), "{what}: data");
    let got = bytes(t.data as u64 + t.byte_offset, want.len());
    assert!(got == want, "{what}: the bytes behind the descriptor differ from the file's");
    assert!(got.iter().any(|&b| b != 0), "{what}: all zero, the comparison would prove little");
}

/// `len` bytes of host memory at `addr`.
fn host_bytes(addr: u64, len: usize) -> Vec<u8> {
    // SAFETY: `addr` is the data pointer of a live host tensor of `len` bytes (what `check` is verifying: a wrong
    // pointer would fault or differ).
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
}

fn load(engine: &Engine, index: &TensorIndex, device: Device) -> Vec<weightlift::Tensor> {
    engine.load(index, device, &LoadOpts::default()).unwrap().tensors
}

#[test]
fn every_tensor_reads_back_through_the_legacy_c_struct() {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let file = std::fs::read(&path).unwrap();
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    for (i, tensor) in load(&engine, &index, Device::Cpu).into_iter().enumerate() {
        let raw: *mut DLManagedTensor = weightlift::dlpack::export::<DLManagedTensor>(tensor).unwrap().into_raw();
        // SAFETY: `raw` is the live managed tensor just handed over; nothing else holds it.
        let t = unsafe { &(*raw).dl_tensor };
        check(t, &index, i, &file, (1, 0), &host_bytes);
        // As a C consumer releases it.
        // SAFETY: the deleter is called once, with the pointer it came with; `t` is not used after.
        unsafe { ((*raw).deleter.expect("a deleter"))(raw) };
    }
}

#[test]
fn every_tensor_reads_back_through_dlparks_import_of_the_versioned_struct() {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let file = std::fs::read(&path).unwrap();
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    for (i, tensor) in load(&engine, &index, Device::Cpu).into_iter().enumerate() {
        let what = tensor.name.clone();
        let raw = weightlift::dlpack::export::<DLManagedTensorVersioned>(tensor).unwrap().into_raw();
        // SAFETY: a versioned managed tensor just exported, owned by nothing else.
        let imported = unsafe { Managed::from_raw(raw) }.unwrap();
        assert_eq!(imported.version(), DLPackVersion::CURRENT, "{what}");
        assert!(imported.flags().is_empty(), "{what}: no flags (writable, not a copy)");
        let view = imported.validate_export().unwrap();
        assert_eq!(view.byte_offset(), 0, "{what}");
        // SAFETY: the descriptor is alive and unchanged while `imported` is.
        check(unsafe { imported.tensor() }, &index, i, &file, (1, 0), &host_bytes);
        // SAFETY: host memory holding the tensor's bytes while `imported` lives.
        let bytes = unsafe { view.cpu_bytes() }.unwrap();
        assert_eq!(bytes, &file[index.tensors[i].offset as usize..index.tensors[i].end() as usize], "{what}");
    }
}

#[test]
fn types_dlpack_lacks_fail_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("packed.safetensors");
    let (f4, f6) = ([0x21u8; 12], [0x35u8; 3]);
    let specs = [
        (TensorSpec::new("fp4", DType::F4, vec![4, 6]), &f4[..]),
        (TensorSpec::new("fp6", DType::F6E2M3, vec![4]), &f6[..]),
    ];
    std::fs::write(&path, serialize(&specs, &BTreeMap::new(), 8).unwrap()).unwrap();
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    for tensor in load(&engine, &index, Device::Cpu) {
        let (name, dtype) = (tensor.name.clone(), tensor.dtype);
        assert!(weightlift::dlpack::data_type(dtype).is_none(), "{name}");
        let err = weightlift::dlpack::export::<DLManagedTensor>(tensor).err().expect("an error").to_string();
        assert!(err.contains(&format!("{name:?}")) && err.contains(dtype.name()), "{err}");
    }
    assert!(weightlift::dlpack::data_type(DType::parse("Q4_0").unwrap()).is_none());
}

#[test]
fn gpu_and_pinned_tensors_read_back_through_the_descriptor() {
    if !common::gpu_or_skip("gpu_and_pinned_tensors_read_back_through_the_descriptor") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let file = std::fs::read(&path).unwrap();
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    let gpu = engine.gpu(0).unwrap();
    let device_bytes = |addr: u64, len: usize| {
        let mut out = vec![0u8; len];
        // SAFETY: `addr` is the data pointer of a live device tensor of `len` bytes on cuda:0.
        unsafe { weightlift::cuda::copy_device_to_host(&gpu, addr, &mut out) }.unwrap();
        out
    };
    // A consumer on a non-blocking stream of its own: releases are ordered after it.
    let stream = gpu.context().new_stream().unwrap();
    for (i, tensor) in load(&engine, &index, Device::Cuda(0)).into_iter().enumerate() {
        let TensorData::Device(d) = &tensor.data else { panic!("{}: not in device memory", tensor.name) };
        let at = d.device_ptr();
        let managed = if i % 2 == 0 {
            weightlift::dlpack::export::<DLManagedTensor>(tensor).unwrap()
        } else {
            // SAFETY: `stream` is a stream of cuda:0's primary context, alive past the drop below.
            unsafe { weightlift::dlpack::export_for_stream::<DLManagedTensor>(tensor, stream.cu_stream()) }.unwrap()
        };
        // SAFETY: the descriptor is alive and unchanged while `managed` is.
        let t = unsafe { managed.tensor() };
        assert!(t.data.is_null() || t.data as u64 == at, "{i}: the device address");
        check(t, &index, i, &file, (2, 0), &device_bytes);
        drop(managed);
    }
    stream.synchronize().unwrap();
    for (i, tensor) in load(&engine, &index, Device::PinnedCpu).into_iter().enumerate() {
        let managed = weightlift::dlpack::export::<DLManagedTensorVersioned>(tensor).unwrap();
        // SAFETY: as above.
        check(unsafe { managed.tensor() }, &index, i, &file, (3, 0), &host_bytes);
    }
}
