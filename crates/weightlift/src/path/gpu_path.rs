//! What every data path into GPU memory is given and gives back, and the trait each implements: below the paths
//! and their choice (`super`), so that both can name it.

use std::sync::Arc;

use weightlift_cuda::{Gpu, Targets};
use weightlift_io::{Extent, IoEngine, IoReport, OpenFile};

use crate::error::Result;
use crate::opts::LoadOpts;
use crate::report::{NvmeStats, PathUsed};

/// A read into device memory, as every path receives it: byte ranges of opened files, each landing in a
/// destination of `targets`.
pub(crate) struct DeviceRead<'a> {
    pub gpu: &'a Gpu,
    pub files: &'a [Arc<OpenFile>],
    pub extents: &'a [Extent],
    pub dest_lens: &'a [u64],
    pub targets: &'a Arc<Targets>,
    pub opts: &'a LoadOpts<'a>,
    /// Told about every landing (paths with lanes call it; the others land everything before returning).
    pub observer: Option<&'a weightlift_io::Observer<'a>>,
}

/// What a path did.
pub(crate) struct PathOutcome {
    pub path: PathUsed,
    pub io: IoReport,
    pub copy_span_secs: Option<f64>,
    pub nvme: Option<NvmeStats>,
}

/// One data path into GPU memory.
pub(crate) trait GpuPath: Send + Sync {
    /// Reads every extent into its destination. `allocate` publishes the destinations into `req.targets`: the path
    /// calls it exactly once, as soon as it can overlap the allocations with its own work (the pipeline: right
    /// after its reads started; the others: first).
    fn read(
        &self,
        io: &IoEngine,
        req: &DeviceRead<'_>,
        allocate: &mut dyn FnMut() -> Result<()>,
    ) -> Result<PathOutcome>;
}
