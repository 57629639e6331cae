//! The engine's error type: one enum over what can go wrong in a load, each naming the file, tensor or device.

use weightlift_format::FormatError;
use weightlift_io::IoError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A checkpoint's headers are malformed or unreadable.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Reading (or writing) file data failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// A caller passed something unusable.
    #[error("{0}")]
    InvalidArgument(String),
    /// A requested tensor does not exist.
    #[error("no tensor {name:?} in {where_}")]
    TensorNotFound { name: String, where_: String },
    /// Host or device memory ran out.
    #[error("out of {what} memory allocating {bytes} bytes{detail}")]
    OutOfMemory { what: &'static str, bytes: u64, detail: String },
    /// The CUDA driver refused something, or is missing.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// Loaded bytes differ from the file (only when verification was asked for).
    #[error("verification failed: {0}")]
    Verify(String),
}

impl From<weightlift_cuda::CudaError> for Error {
    fn from(e: weightlift_cuda::CudaError) -> Error {
        match e {
            weightlift_cuda::CudaError::OutOfMemory { device, bytes, free, total } => Error::OutOfMemory {
                what: "device",
                bytes,
                detail: format!(" on cuda:{device} ({free} of {total} bytes free)"),
            },
            other => Error::Cuda(other.to_string().trim_start_matches("CUDA ").to_string()),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
