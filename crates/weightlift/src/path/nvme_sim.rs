//! GPU loads through GPU-initiated NVMe commands (BaM's design): for each file, weightlift's software NVMe
//! controller serves the file as its namespace, and CUDA kernels build submission entries, ring doorbells and poll
//! completions to read each destination's ranges. No drive exists on these machines, so the controller is
//! software; the queue code the kernels run is the code that would drive a real one (see docs/nvme.md).

use std::time::Instant;

use weightlift_io::{IoEngine, IoReport};
use weightlift_nvme::gpu::{GpuLoader, GpuOptions};
use weightlift_nvme::{BringUp, ByteRange, Controller, SoftConfig, SoftNvme};

use super::gpu_path::{DeviceRead, GpuPath, PathOutcome};
use crate::error::{Error, Result};
use crate::report::{NvmeStats, PathUsed};

pub(crate) struct NvmePath;

impl GpuPath for NvmePath {
    fn read(
        &self,
        io: &IoEngine,
        req: &DeviceRead<'_>,
        allocate: &mut dyn FnMut() -> Result<()>,
    ) -> Result<PathOutcome> {
        allocate()?;
        let t0 = Instant::now();
        let threads = io.params().threads as usize;
        let mut stats = NvmeStats::default();
        let mut report = IoReport::blank(weightlift_io::ReadEngineUsed::Pread, "the software controller".into());
        for (f, file) in req.files.iter().enumerate() {
            // This file's extents, grouped by destination (one kernel launch each).
            let mut by_dest: Vec<(u32, Vec<ByteRange>)> = Vec::new();
            for e in req.extents.iter().filter(|e| e.file as usize == f && e.len > 0) {
                let r = ByteRange { offset: e.offset, len: e.len, dest_offset: e.dest_offset };
                match by_dest.iter_mut().find(|(d, _)| *d == e.dest) {
                    Some((_, v)) => v.push(r),
                    None => by_dest.push((e.dest, vec![r])),
                }
            }
            if by_dest.is_empty() {
                continue;
            }
            let config = SoftConfig { lba_size: 4096, io_threads: threads.clamp(1, 16), ..SoftConfig::default() };
            let soft = SoftNvme::start(&file.path, config)?;
            let ctrl = Controller::bring_up(soft.bus(), BringUp::default())?;
            let mut loader = GpuLoader::new(req.gpu, &ctrl, &GpuOptions::default())?;
            for (dest, ranges) in by_dest {
                let (ptr, len, _) = req.targets.wait(dest).map_err(|e| Error::InvalidArgument(e.to_string()))?;
                // SAFETY: the destination is device memory of this GPU that the caller keeps allocated and unused
                // by others for the whole read (`Targets`' contract).
                let r = unsafe { loader.load_raw(&ranges, ptr, len) }?;
                stats.commands += r.commands;
                stats.transferred += r.transferred;
                stats.kernel_secs += r.elapsed.as_secs_f64();
                if let Some(p) = req.opts.progress {
                    p.fetch_add(r.bytes, std::sync::atomic::Ordering::Relaxed);
                }
            }
            if let Some(fatal) = soft.fatal() {
                return Err(
                    weightlift_nvme::NvmeError::ControllerFailed(format!("{}: {fatal}", file.path.display())).into()
                );
            }
            report.lanes = loader.queue_pairs();
        }
        report.read_engine_reason = format!(
            "GPU-initiated NVMe: {} commands from CUDA kernels to weightlift's software controller ({:.0} IOPS)",
            stats.commands,
            if stats.kernel_secs > 0.0 { stats.commands as f64 / stats.kernel_secs } else { 0.0 }
        );
        report.requested_bytes = req.extents.iter().map(|e| e.len).sum();
        report.buffered_bytes = stats.transferred;
        report.ops = stats.commands;
        report.io_secs = t0.elapsed().as_secs_f64();
        report.direct_reason = "the software controller reads its backing file with pread".into();
        Ok(PathOutcome { path: PathUsed::NvmeSim, io: report, copy_span_secs: None, nvme: Some(stats) })
    }
}
