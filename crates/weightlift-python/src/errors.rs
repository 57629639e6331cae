//! Engine errors as Python exceptions: the hierarchy lives in `weightlift._errors` (plain Python, so that classes
//! can derive from both `WeightliftError` and the builtin Python users expect: `FileNotFoundError`,
//! `PermissionError`, `MemoryError`, `ValueError`, `KeyError`).

use std::io;

use pyo3::prelude::*;
use weightlift::Error;
use weightlift::format::ErrorKind;
use weightlift::io::IoError;

fn raise(class: &str, message: String, status: Option<i64>) -> PyErr {
    Python::attach(|py| match py.import("weightlift._errors").and_then(|m| m.getattr(class)) {
        Ok(cls) => match cls.call1((message.clone(),)) {
            Ok(obj) => {
                // cuFile's status code, where the failure carries one (`except CudaError as e: e.status`).
                let _ = obj.setattr("status", status);
                PyErr::from_value(obj)
            }
            Err(e) => e,
        },
        Err(e) => e,
    })
}

/// cuFile's status code behind an error: a cuFile call's own, or the cause of a read or write through cuFile.
fn cufile_status(e: &Error) -> Option<i64> {
    use weightlift::cuda::CudaError;
    use weightlift::cuda::cufile::CufileError;
    match e {
        Error::Cuda(CudaError::Cufile(c)) => Some(c.code),
        Error::Io(IoError::Read { cause, .. } | IoError::Write { cause, .. }) => {
            cause.get_ref().and_then(|inner| inner.downcast_ref::<CufileError>()).map(|c| c.code)
        }
        _ => None,
    }
}

fn io_class(kind: Option<io::ErrorKind>, default: &'static str) -> &'static str {
    match kind {
        Some(io::ErrorKind::NotFound) => "WeightliftFileNotFoundError",
        Some(io::ErrorKind::PermissionDenied) => "WeightliftPermissionError",
        Some(io::ErrorKind::IsADirectory) => "WeightliftIsADirectoryError",
        _ => default,
    }
}

/// An object's error as a local file's of the same meaning (a missing object is a `FileNotFoundError`, refused
/// credentials a `PermissionError`), and a URL that names no object as an invalid argument.
fn remote_class(e: &weightlift::remote::RemoteError) -> &'static str {
    match e.io_kind() {
        io::ErrorKind::InvalidInput => "InvalidArgumentError",
        kind => io_class(Some(kind), "IoError"),
    }
}

pub fn invalid_argument(message: &str) -> PyErr {
    raise("InvalidArgumentError", message.to_string(), None)
}

pub fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    let class = match &e {
        Error::Format(f) => match &f.kind {
            ErrorKind::Open(cause) => io_class(Some(cause.kind()), "IoError"),
            ErrorKind::Remote(r) => remote_class(r),
            ErrorKind::NotAFile { .. } => "NotARegularFileError",
            ErrorKind::Read { .. } | ErrorKind::Write(_) => "IoError",
            _ => "FormatError",
        },
        e if e.is_out_of_memory() => "OutOfMemoryError",
        Error::Io(IoError::Setting { .. }) | Error::Io(IoError::Destinations(_)) => "InvalidArgumentError",
        Error::Io(IoError::NotAFile { .. }) => "NotARegularFileError",
        Error::Io(IoError::Remote(r)) => remote_class(r),
        Error::Io(io) => io_class(io.io_kind(), "IoError"),
        Error::Cuda(_) | Error::Nvme(_) => "CudaError",
        Error::TensorNotFound { .. } => "TensorNotFoundError",
        Error::InvalidArgument(_) | Error::LbaOutOfRange { .. } | Error::UnknownKind { .. } => "InvalidArgumentError",
        Error::Verify(_) | Error::Pack(weightlift_pack::PackError::Checksum { .. }) => "ChecksumError",
        // A stored stream that does not decode is damaged data, as a malformed header is.
        Error::Pack(weightlift_pack::PackError::Codec { .. }) => "FormatError",
        Error::Pack(weightlift_pack::PackError::Format(_) | weightlift_pack::PackError::Invalid(_)) => "FormatError",
        Error::Pack(weightlift_pack::PackError::Io { .. }) => "IoError",
        _ => "WeightliftError",
    };
    raise(class, message, cufile_status(&e))
}
