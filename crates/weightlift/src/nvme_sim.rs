//! GPU loads through GPU-initiated NVMe commands (BaM's design): for each file, weightlift's software NVMe
//! controller serves the file as its namespace, and CUDA kernels build submission entries, ring doorbells and poll
//! completions to read each device block. No drive exists on these machines, so the controller is software; the
//! queue code the kernels run is the code that would drive a real one (see docs/nvme.md).

use std::path::PathBuf;
use std::time::Instant;

use weightlift_cuda::{DeviceBuffer, Gpu};
use weightlift_io::IoReport;
use weightlift_nvme::gpu::{GpuLoader, GpuOptions};
use weightlift_nvme::{BringUp, ByteRange, Controller, SoftConfig, SoftNvme};

use crate::error::{Error, Result};
use crate::placement::Block;

/// What the GPU-initiated load did, beside the usual report.
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmeStats {
    pub commands: u64,
    pub transferred: u64,
    pub kernel_secs: f64,
}

fn err(e: weightlift_nvme::NvmeError) -> Error {
    Error::Io(weightlift_io::IoError::Uring(format!("nvme-sim: {e}")))
}

/// Reads `blocks` of `paths` into `buffers` (one per block) through GPU-driven queues.
pub(crate) fn load_blocks(
    gpu: &Gpu,
    paths: &[PathBuf],
    blocks: &[Block],
    buffers: &mut [DeviceBuffer],
    threads: usize,
) -> Result<(IoReport, NvmeStats)> {
    let t0 = Instant::now();
    let mut stats = NvmeStats::default();
    let mut report = IoReport { backend: "nvme-sim", ..IoReport::default() };
    for (f, path) in paths.iter().enumerate() {
        let mine: Vec<usize> = (0..blocks.len()).filter(|&i| blocks[i].file == f && blocks[i].len > 0).collect();
        if mine.is_empty() {
            continue;
        }
        let config = SoftConfig { lba_size: 4096, io_threads: threads.clamp(1, 16), ..SoftConfig::default() };
        let soft = SoftNvme::start(path, config).map_err(err)?;
        let ctrl = Controller::bring_up(soft.bus(), BringUp::default()).map_err(err)?;
        let mut loader = GpuLoader::new(gpu, &ctrl, &GpuOptions::default()).map_err(err)?;
        for i in mine {
            let b = blocks[i];
            let r = loader
                .load(&[ByteRange { offset: b.start, len: b.len, dest_offset: 0 }], &mut buffers[i])
                .map_err(|e| {
                    Error::Io(weightlift_io::IoError::Read {
                        path: path.clone(),
                        offset: b.start,
                        len: b.len,
                        cause: std::io::Error::other(e.to_string()),
                    })
                })?;
            stats.commands += r.commands;
            stats.transferred += r.transferred;
            stats.kernel_secs += r.elapsed.as_secs_f64();
        }
        if let Some(fatal) = soft.fatal() {
            return Err(Error::Io(weightlift_io::IoError::Uring(format!(
                "nvme-sim controller for {}: {fatal}",
                path.display()
            ))));
        }
        report.lanes = loader.queue_pairs();
    }
    report.backend_reason = format!(
        "GPU-initiated NVMe: {} commands from CUDA kernels to weightlift's software controller ({:.0} IOPS)",
        stats.commands,
        if stats.kernel_secs > 0.0 { stats.commands as f64 / stats.kernel_secs } else { 0.0 }
    );
    report.requested_bytes = blocks.iter().map(|b| b.len).sum();
    report.buffered_bytes = stats.transferred;
    report.ops = stats.commands;
    report.io_secs = t0.elapsed().as_secs_f64();
    report.direct_reason = "the software controller reads its backing file with pread".into();
    Ok((report, stats))
}

/// Reads ranges `(offset, len, dest_offset)` of each file (`ranges[f]` for `paths[f]`) into one device buffer.
pub(crate) fn load_ranges(
    gpu: &Gpu,
    paths: &[PathBuf],
    ranges: &[Vec<(u64, u64, u64)>],
    dest: &mut DeviceBuffer,
    threads: usize,
) -> Result<(IoReport, NvmeStats)> {
    let t0 = Instant::now();
    let mut stats = NvmeStats::default();
    let mut report = IoReport { backend: "nvme-sim", ..IoReport::default() };
    for (path, mine) in paths.iter().zip(ranges) {
        if mine.is_empty() {
            continue;
        }
        let config = SoftConfig { lba_size: 4096, io_threads: threads.clamp(1, 16), ..SoftConfig::default() };
        let soft = SoftNvme::start(path, config).map_err(err)?;
        let ctrl = Controller::bring_up(soft.bus(), BringUp::default()).map_err(err)?;
        let mut loader = GpuLoader::new(gpu, &ctrl, &GpuOptions::default()).map_err(err)?;
        let list: Vec<ByteRange> =
            mine.iter().map(|&(offset, len, dest_offset)| ByteRange { offset, len, dest_offset }).collect();
        let r = loader.load(&list, dest).map_err(|e| {
            Error::Io(weightlift_io::IoError::Read {
                path: path.clone(),
                offset: 0,
                len: 0,
                cause: std::io::Error::other(e.to_string()),
            })
        })?;
        stats.commands += r.commands;
        stats.transferred += r.transferred;
        stats.kernel_secs += r.elapsed.as_secs_f64();
        report.lanes = loader.queue_pairs();
    }
    report.backend_reason =
        format!("GPU-initiated NVMe: {} commands to weightlift's software controller", stats.commands);
    report.ops = stats.commands;
    report.buffered_bytes = stats.transferred;
    report.io_secs = t0.elapsed().as_secs_f64();
    Ok((report, stats))
}
