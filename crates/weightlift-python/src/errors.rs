//! Engine errors as Python exceptions: the hierarchy lives in `weightlift._errors` (plain Python, so that classes
//! can derive from both `WeightliftError` and the builtin Python users expect: `FileNotFoundError`,
//! `PermissionError`, `MemoryError`, `ValueError`, `KeyError`).

use std::io;

use pyo3::prelude::*;
use weightlift::Error;
use weightlift::format::ErrorKind;
use weightlift::io::IoError;

fn raise(class: &str, message: String) -> PyErr {
    Python::attach(|py| match py.import("weightlift._errors").and_then(|m| m.getattr(class)) {
        Ok(cls) => match cls.call1((message.clone(),)) {
            Ok(obj) => PyErr::from_value(obj),
            Err(e) => e,
        },
        Err(e) => e,
    })
}

fn io_class(kind: Option<io::ErrorKind>, default: &'static str) -> &'static str {
    match kind {
        Some(io::ErrorKind::NotFound) => "WeightliftFileNotFoundError",
        Some(io::ErrorKind::PermissionDenied) => "WeightliftPermissionError",
        Some(io::ErrorKind::IsADirectory) => "WeightliftIsADirectoryError",
        _ => default,
    }
}

pub fn invalid_argument(message: &str) -> PyErr {
    raise("InvalidArgumentError", message.to_string())
}

pub fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    let class = match &e {
        Error::Format(f) => match &f.kind {
            ErrorKind::Open(cause) => io_class(Some(cause.kind()), "IoError"),
            ErrorKind::Read { .. } | ErrorKind::Write(_) => "IoError",
            _ => "FormatError",
        },
        Error::Io(IoError::Setting { .. }) => "InvalidArgumentError",
        Error::Io(IoError::Staging { .. }) => "OutOfMemoryError",
        Error::Io(io) => io_class(io.io_kind(), "IoError"),
        Error::OutOfMemory { .. } => "OutOfMemoryError",
        Error::Cuda(_) => "CudaError",
        Error::TensorNotFound { .. } => "TensorNotFoundError",
        Error::InvalidArgument(_) => "InvalidArgumentError",
        _ => "WeightliftError",
    };
    raise(class, message)
}
