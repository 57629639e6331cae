//! Device strings and raw destinations, parsed where they cross from Python: once, into typed values.

use pyo3::prelude::*;
use weightlift::{Device, RawDest};

use crate::errors;

/// `s` ("cpu", "cuda:1", ...) as a device, or an `InvalidArgumentError` naming it.
pub(crate) fn parse_device(s: &str) -> PyResult<Device> {
    s.parse::<Device>().map_err(|e| errors::invalid_argument(&e))
}

/// The address `ptr` of memory on `device` as a destination of a raw read.
pub(crate) fn raw_dest(device: &str, ptr: usize) -> PyResult<RawDest> {
    Ok(match parse_device(device)? {
        Device::Cpu | Device::PinnedCpu => RawDest::Host(ptr as *mut u8),
        Device::Cuda(ordinal) => RawDest::Device { ordinal, ptr: ptr as u64 },
    })
}
