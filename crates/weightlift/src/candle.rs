//! Checkpoints as [`candle_core::Tensor`]s (the `candle` feature), keyed by name as
//! `candle_core::safetensors::load` returns them, so that code built on candle's loader (a `VarBuilder` over a
//! `HashMap<String, Tensor>`) can read through weightlift instead.
//!
//! weightlift reads the bytes into host memory (io_uring lanes, O_DIRECT where it pays); each tensor is then copied
//! once into the storage candle owns, since a candle CPU tensor holds a `Vec` of its element type and cannot adopt
//! a buffer of bytes. CPU only for now: candle's `cuda` feature (cudarc with `dynamic-linking`, which weightlift's
//! `fallback-dynamic-loading` now gives way to) is not built or tested here yet (docs/rust.md says what was checked).

use std::collections::HashMap;

use candle_core::{DType as CandleDType, Tensor};
use weightlift_format::{DType, TensorIndex};

use crate::device::Device;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::path::LoadOpts;
use crate::tensor::TensorData;

/// The candle type of a checkpoint type, where candle has one.
pub fn candle_dtype(dtype: DType) -> Option<CandleDType> {
    Some(match dtype {
        DType::U8 => CandleDType::U8,
        DType::U32 => CandleDType::U32,
        DType::I16 => CandleDType::I16,
        DType::I32 => CandleDType::I32,
        DType::I64 => CandleDType::I64,
        DType::BF16 => CandleDType::BF16,
        DType::F16 => CandleDType::F16,
        DType::F32 => CandleDType::F32,
        DType::F64 => CandleDType::F64,
        DType::F8E4M3 => CandleDType::F8E4M3,
        DType::F6E2M3 => CandleDType::F6E2M3,
        DType::F6E3M2 => CandleDType::F6E3M2,
        DType::F4 => CandleDType::F4,
        DType::F8E8M0 => CandleDType::F8E8M0,
        _ => return None,
    })
}

/// Loads every tensor of `index` onto `device` as candle tensors, by name. A tensor whose type candle lacks (bool,
/// i8, u16, u64, complex, GGML blocks) fails the whole load before anything is read, naming it.
pub fn load(engine: &Engine, index: &TensorIndex, device: &candle_core::Device) -> Result<HashMap<String, Tensor>> {
    let types = index
        .tensors
        .iter()
        .map(|t| {
            candle_dtype(t.dtype)
                .ok_or_else(|| Error::InvalidArgument(format!("tensor {:?}: candle has no {} type", t.name, t.dtype)))
        })
        .collect::<Result<Vec<_>>>()?;
    let loaded = engine.load(index, Device::Cpu, &LoadOpts::default())?;
    let mut out = HashMap::with_capacity(loaded.tensors.len());
    for (t, dtype) in loaded.tensors.into_iter().zip(types) {
        let staged;
        let bytes: &[u8] = match &t.data {
            TensorData::Host(b) => b,
            other => {
                staged = read_back(other)?;
                &staged
            }
        };
        let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
        let tensor = Tensor::from_raw_buffer(bytes, dtype, &shape, device)
            .map_err(|e| Error::InvalidArgument(format!("tensor {:?}: candle refused it: {e}", t.name)))?;
        out.insert(t.name, tensor);
    }
    Ok(out)
}

fn read_back(data: &TensorData) -> Result<Vec<u8>> {
    let mut bytes = vec![0u8; data.len()];
    data.read_back(0, &mut bytes)?;
    Ok(bytes)
}
