//! weightlift's own path: the engine's lanes read into pinned staging and each completed read is copied to the
//! device on the lane's stream, overlapped with the next reads.

use std::sync::Arc;

use weightlift_cuda::{CudaPinner, DeviceSink};
use weightlift_io::{IoEngine, LoadOptions, LoadRequest, Observed, Pinner, Sink};

use super::gpu_path::{DeviceRead, GpuPath, PathOutcome};
use crate::error::Result;
use crate::report::PathUsed;

/// weightlift's pipeline: the engine's lanes read into pinned staging slots and copy each completed read to the
/// device on the lane's stream, overlapped with the next reads.
pub(crate) struct Pipeline;

impl GpuPath for Pipeline {
    fn read(
        &self,
        io: &IoEngine,
        req: &DeviceRead<'_>,
        allocate: &mut dyn FnMut() -> Result<()>,
    ) -> Result<PathOutcome> {
        let sink = DeviceSink::new(req.gpu, req.targets.clone(), io.lanes());
        let pinner: Arc<dyn Pinner> = Arc::new(CudaPinner::new(req.gpu));
        let opts = LoadOptions {
            progress: req.opts.progress,
            cancel: req.opts.cancel,
            faults: req.opts.faults,
            pinner: Some(pinner),
        };
        let lreq = LoadRequest { files: req.files, extents: req.extents, dest_lens: req.dest_lens };
        let mut allocated = Ok(());
        let observed = req.observer.map(|observer| Observed { inner: &sink, observer });
        let target: &dyn Sink = match &observed {
            Some(o) => o,
            None => &sink,
        };
        let loaded = io.load_with(&lreq, &opts, target, || {
            allocated = allocate();
            if let Err(e) = &allocated {
                req.targets.fail(format!("allocating the destinations failed: {e}"));
            }
        });
        // An allocation failure makes the lanes fail too; the allocation's own error is the one to report.
        allocated?;
        let io_report = loaded?;
        let path = PathUsed::Pipeline(io_report.read_engine);
        Ok(PathOutcome { path, io: io_report, copy_span_secs: Some(sink.copy_span_secs()), nvme: None })
    }
}
