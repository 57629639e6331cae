//! The engine's error type: one enum over what can go wrong in a load, each variant keeping its source (and with
//! it the file, offset, device, driver call or status code).

use weightlift_cuda::CudaError;
use weightlift_cuda::unpack::UnpackError;
use weightlift_format::FormatError;
use weightlift_io::IoError;
use weightlift_nvme::NvmeError;

/// Why a load (or any other engine call) failed. Displays as one line; the variants below the engine's own keep
/// the lower crate's error, with its context, as their source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A checkpoint's headers are malformed or unreadable.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Reading (or writing) file data failed, host memory ran out, or a setting is malformed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The CUDA driver or cuFile refused something, device memory ran out, or CUDA is missing.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The GPU-initiated NVMe path failed.
    #[error(transparent)]
    Nvme(#[from] NvmeError),
    /// A caller passed something unusable.
    #[error("{0}")]
    InvalidArgument(String),
    /// A packed checkpoint's chunk does not decode, or decodes to bytes whose checksum differs.
    #[error(transparent)]
    Pack(#[from] weightlift_pack::PackError),
    /// A requested tensor does not exist.
    #[error("no tensor {name:?} in {where_}")]
    TensorNotFound {
        /// The name asked for.
        name: String,
        /// What was searched (a file, a checkpoint, a stream).
        where_: String,
    },
    /// A read by LBA reaches past the device's last block.
    #[error("{}: LBA {lba} + {count} blocks lies past the device's {blocks} blocks", path.display())]
    LbaOutOfRange {
        /// The device (or the file standing for one).
        path: std::path::PathBuf,
        /// The first block asked for.
        lba: u64,
        /// Blocks asked for.
        count: u64,
        /// Blocks the device has.
        blocks: u64,
    },
    /// A region table has no range of this kind.
    #[error("no region of kind {kind:?} (known: {known:?})")]
    UnknownKind {
        /// The kind asked for.
        kind: String,
        /// The kinds the table has.
        known: Vec<String>,
    },
    /// Loaded bytes differ from the file (only when verification was asked for).
    #[error("verification failed: {0}")]
    Verify(String),
}

impl Error {
    /// Whether host or device memory ran out.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::Io(IoError::OutOfMemory { .. }) | Error::Cuda(CudaError::OutOfMemory { .. }))
    }

    /// Whether the load was cancelled (`LoadOpts::cancel`).
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Error::Io(IoError::Cancelled))
    }
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A GPU decoder failure that is not about the data: CUDA's error, or why the decoder could not run.
pub(crate) fn gpu_decoder(e: UnpackError) -> Error {
    match e {
        UnpackError::Cuda(c) => Error::Cuda(c),
        other => Error::Cuda(weightlift_cuda::CudaError::Unavailable(format!("the GPU decoder: {other}"))),
    }
}

/// `e`, saying that the caller asked for cuFile (the status code, if any, is kept).
pub(crate) fn cufile_requested_but(e: weightlift_cuda::CudaError, what: &str) -> Error {
    match e {
        weightlift_cuda::CudaError::CufileUnavailable(why) => {
            Error::Cuda(weightlift_cuda::CudaError::CufileUnavailable(format!("{what}: {why}")))
        }
        other => Error::Cuda(other),
    }
}
