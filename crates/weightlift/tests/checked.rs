//! Loads given expected checksums (`LoadOpts::checks`): each tensor is hashed as it lands, during the load. Right
//! sums pass and every byte still equals `std::fs::read` of the file; one wrong sum fails the load naming tensor and
//! chunk; malformed checks are refused. Host loads here; device loads where there is a GPU (hashed on it), with
//! many small tensors sharing device blocks.

mod common;
use common::gpu_or_skip;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use weightlift::{Checks, ChunkSum, Device, Engine, Error, LoadOpts, Settings};
use weightlift_format::safetensors::{self, TensorSpec};
use weightlift_format::{DType, TensorIndex, synth};

const CHUNK: u64 = 1 << 20;

fn checkpoint(dir: &Path, small: usize) -> PathBuf {
    let mut tensors: Vec<(TensorSpec, Vec<u8>)> = vec![
        (TensorSpec::new("embed", DType::BF16, vec![1500, 1111]), synth::bf16_weights(1500 * 1111, 1)),
        (TensorSpec::new("empty", DType::F16, vec![0, 3]), Vec::new()),
        (TensorSpec::new("one", DType::U8, vec![1]), vec![9]),
    ];
    for i in 0..small {
        let n = 1 + (i * 7919) % 3000;
        tensors.push((
            TensorSpec::new(format!("small.{i}"), DType::BF16, vec![n as u64]),
            synth::bf16_weights(n, i as u64),
        ));
    }
    tensors.push((TensorSpec::new("last", DType::BF16, vec![3, 700_001]), synth::bf16_weights(2_100_003, 9)));
    let refs: Vec<(TensorSpec, &[u8])> = tensors.iter().map(|(s, d)| (s.clone(), d.as_slice())).collect();
    let path = dir.join("model.safetensors");
    std::fs::write(&path, safetensors::serialize(&refs, &BTreeMap::new(), 8).unwrap()).unwrap();
    path
}

/// The expected sums of every tensor of `index`, in index order, from the file's own bytes.
fn sums(index: &TensorIndex, file: &[u8]) -> Checks {
    let tensors = index
        .tensors
        .iter()
        .map(|t| {
            (0..t.nbytes.div_ceil(CHUNK))
                .map(|k| {
                    let (start, len) = (k * CHUNK, CHUNK.min(t.nbytes - k * CHUNK));
                    let at = (t.offset + start) as usize;
                    ChunkSum { start, len, expected: weightlift_pack::checksum(&file[at..at + len as usize]) }
                })
                .collect()
        })
        .collect();
    Checks { tensors }
}

fn load(
    engine: &Engine,
    index: &TensorIndex,
    device: Device,
    checks: &Checks,
) -> weightlift::Result<weightlift::Loaded> {
    engine.load(index, device, &LoadOpts { checks: Some(checks), ..LoadOpts::default() })
}

fn same_as_file(loaded: &weightlift::Loaded, index: &TensorIndex, file: &[u8]) {
    for (t, e) in loaded.tensors.iter().zip(&index.tensors) {
        let mut got = vec![0u8; t.data.len()];
        t.data.read_back(0, &mut got).unwrap();
        assert!(got == file[e.offset as usize..(e.offset + e.nbytes) as usize], "{}", e.name);
    }
}

fn exercise(device: Device, small: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path(), small);
    let file = std::fs::read(&path).unwrap();
    let index = weightlift_format::open(std::slice::from_ref(&path), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    let checks = sums(&index, &file);
    let chunks: usize = checks.tensors.iter().map(Vec::len).sum();
    let bytes: u64 = index.tensors.iter().map(|t| t.nbytes).sum();

    let loaded = load(&engine, &index, device, &checks).unwrap();
    same_as_file(&loaded, &index, &file);
    let stats = loaded.report.checks.clone().expect("the report says what was checked");
    assert_eq!((stats.chunks, stats.bytes), (chunks as u64, bytes));
    match device {
        Device::Cuda(n) => assert_eq!(stats.on, format!("cuda:{n}")),
        _ => assert_eq!(stats.on, "cpu"),
    }
    // Every tensor reported landing through the pipeline's lanes: all of it was hashed during the load.
    assert_eq!(stats.overlapped_bytes, bytes, "{stats:?}");
    assert_eq!(loaded.report.to_json()["checks"]["chunks"], chunks);

    // One wrong sum: the load fails naming the tensor and the chunk.
    let last = index.tensors.len() - 1;
    let mut wrong = checks.clone();
    wrong.tensors[last][2].expected ^= 1;
    let err = load(&engine, &index, device, &wrong).unwrap_err();
    assert!(matches!(err, Error::Verify(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("\"last\"") && msg.contains("chunk 2"), "{msg}");
    if let Device::Cuda(n) = device {
        assert!(msg.contains(&format!("checked on cuda:{n}")), "{msg}");
    }
    // The same mismatch in the first tensor of the file.
    let mut wrong = checks.clone();
    wrong.tensors[0][0].expected = wrong.tensors[0][0].expected.wrapping_add(1);
    let msg = load(&engine, &index, device, &wrong).unwrap_err().to_string();
    assert!(msg.contains("\"embed\"") && msg.contains("chunk 0"), "{msg}");

    // Malformed checks are refused before anything is read.
    let mut past = checks.clone();
    past.tensors[2] = vec![ChunkSum { start: 0, len: 2, expected: 0 }];
    let msg = load(&engine, &index, device, &past).unwrap_err().to_string();
    assert!(msg.contains("\"one\"") && msg.contains("past its 1 bytes"), "{msg}");
    let short = Checks { tensors: checks.tensors[1..].to_vec() };
    assert!(matches!(load(&engine, &index, device, &short), Err(Error::InvalidArgument(_))));

    // Unchecked tensors (empty lists) are loaded as they are.
    let mut some = checks.clone();
    some.tensors[0].clear();
    let loaded = load(&engine, &index, device, &some).unwrap();
    same_as_file(&loaded, &index, &file);
    assert_eq!(loaded.report.checks.unwrap().chunks, chunks as u64 - checks.tensors[0].len() as u64);
}

#[test]
fn host_loads_check_every_tensor_as_it_lands() {
    exercise(Device::Cpu, 300);
}

#[test]
fn device_loads_check_every_block_on_the_gpu() {
    if !gpu_or_skip("device_loads_check_every_block_on_the_gpu") {
        return;
    }
    if let Err(why) = weightlift_cuda::nvrtc::available() {
        eprintln!("skipping: the hash kernels need NVRTC: {why}");
        return;
    }
    // 3,000 small tensors share device blocks: each is hashed at its offset inside its block.
    exercise(Device::Cuda(0), 3000);
}

#[test]
fn raw_reads_refuse_checks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raw.bin");
    std::fs::write(&path, vec![1u8; 4096]).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    let mut out = vec![0u8; 4096];
    let checks = Checks::default();
    let opts = LoadOpts { checks: Some(&checks), ..LoadOpts::default() };
    let dest = weightlift::RawDest::Host(out.as_mut_ptr());
    // SAFETY: `out` holds 4096 writable bytes, untouched until the call returns.
    let r = unsafe { engine.read_at(&path, 0, 4096, dest, &opts) };
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
}
