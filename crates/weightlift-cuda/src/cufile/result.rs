//! cuFile's calls returning `Result`: every status turned into a [`CufileError`] naming the call and what the code
//! means. The owners in [`super`] call only these.

use std::ffi::{c_int, c_void};

use super::sys::{Api, Descr, DescrHandle, DriverProps, HANDLE_TYPE_FD, RawStatus};
use crate::error::CufileError;

pub(crate) fn describe(code: i64) -> String {
    match code {
        0 => "success".into(),
        5001 => "driver not initialised".into(),
        5007 => "platform not supported".into(),
        5008 => "I/O not supported".into(),
        5009 => "device not supported".into(),
        5010 => "nvidia-fs driver error".into(),
        5011 => "CUDA driver error".into(),
        5012 => "invalid CUDA pointer".into(),
        5013 => "invalid CUDA memory type".into(),
        5014 => "CUDA pointer range error".into(),
        5018 => "invalid file type".into(),
        5019 => "invalid file open flags (O_DIRECT needed)".into(),
        5020 => "O_DIRECT not set".into(),
        5022 => "invalid value".into(),
        5023 => "memory already registered".into(),
        5024 => "memory not registered".into(),
        5025 => "permission denied".into(),
        5027 => "file handle not registered".into(),
        5028 => "file handle already registered".into(),
        5029 => "device not found".into(),
        5030 => "internal error".into(),
        5034 => "I/O disabled".into(),
        c if c < 0 && c > -5000 => std::io::Error::from_raw_os_error((-c) as i32).to_string(),
        c => format!("cuFile error {c}"),
    }
}

pub(crate) fn check(call: &'static str, s: RawStatus) -> Result<(), CufileError> {
    if s.err == 0 { Ok(()) } else { Err(CufileError { call, code: s.err as i64, what: describe(s.err as i64) }) }
}

/// `cuFileDriverOpen` then `cuFileDriverGetProperties`, and the version where the library reports it.
pub(crate) fn open(api: &Api) -> Result<(DriverProps, Option<i32>), CufileError> {
    // SAFETY: cuFileDriverOpen takes no arguments; the caller initialised the CUDA driver it needs.
    check("cuFileDriverOpen", unsafe { (api.driver_open)() })?;
    let mut props = DriverProps::default();
    // SAFETY: `props` has the layout of CUfileDrvProps_t and is writable.
    check("cuFileDriverGetProperties", unsafe { (api.props)(&mut props) })?;
    let version = api.version.and_then(|f| {
        let mut v = 0;
        // SAFETY: valid out-pointer.
        (unsafe { f(&mut v) }.err == 0).then_some(v)
    });
    Ok((props, version))
}

/// `cuFileHandleRegister` of an open descriptor.
///
/// # Safety
/// `fd` must stay open until the handle is deregistered.
pub(crate) unsafe fn handle_register(api: &Api, fd: c_int) -> Result<*mut c_void, CufileError> {
    let mut descr = Descr { type_: HANDLE_TYPE_FD, handle: DescrHandle { fd }, fs_ops: std::ptr::null() };
    let mut raw: *mut c_void = std::ptr::null_mut();
    // SAFETY: both pointers are valid for the call; `fd` is open per the contract.
    check("cuFileHandleRegister", unsafe { (api.handle_register)(&mut raw, &mut descr) })?;
    Ok(raw)
}

/// A read or write's return: bytes moved, or the negative status as an error.
pub(crate) fn transferred(call: &'static str, r: isize) -> Result<usize, CufileError> {
    if r < 0 { Err(CufileError { call, code: r as i64, what: describe(r as i64) }) } else { Ok(r as usize) }
}
