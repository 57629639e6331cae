//! GPU loads through NVIDIA cuFile (GPUDirect Storage): each extent is read by `cuFileRead` in chunks straight
//! into its destination, by several threads at once. Where nvidia-fs (or P2PDMA) is present this moves data from
//! storage to GPU memory without a host copy; elsewhere cuFile runs in compat mode (host bounce buffers), which the
//! pipeline outruns, so `auto` picks cuFile only when it runs peer-to-peer (see `path::decide`).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use weightlift_cuda::cufile::{Cufile, CufileHandle};
use weightlift_io::{IoEngine, IoError, IoReport};

use super::gpu_path::{DeviceRead, GpuPath, PathOutcome};
use crate::error::{Error, Result};
use crate::report::PathUsed;

/// Largest single cuFileRead (cuFile's default max_direct_io_size is 16 MiB).
const CHUNK: u64 = 16 << 20;

pub(crate) struct CufilePath {
    cufile: Cufile,
}

impl CufilePath {
    pub fn new(cufile: Cufile) -> CufilePath {
        CufilePath { cufile }
    }
}

/// One cuFileRead: file, file offset, destination address, bytes.
type Item = (usize, u64, u64, u64);

impl GpuPath for CufilePath {
    fn read(
        &self,
        io: &IoEngine,
        req: &DeviceRead<'_>,
        allocate: &mut dyn FnMut() -> Result<()>,
    ) -> Result<PathOutcome> {
        allocate()?;
        let t0 = Instant::now();
        // cuFile wants O_DIRECT descriptors for peer-to-peer (compat mode accepts buffered ones).
        let files: Vec<File> = req
            .files
            .iter()
            .map(|f| {
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&f.path)
                    .or_else(|_| File::open(&f.path))
                    .map_err(|cause| Error::Io(IoError::Open { path: f.path.clone(), cause }))
            })
            .collect::<Result<_>>()?;
        let handles: Vec<CufileHandle> = files
            .iter()
            // SAFETY: `files` outlives `handles` (dropped after them at the end of this function).
            .map(|f| unsafe { self.cufile.register(f.as_raw_fd()) }.map_err(|e| Error::Cuda(e.into())))
            .collect::<Result<_>>()?;
        let mut items: Vec<Item> = Vec::new();
        for e in req.extents {
            let (ptr, _, _) = req.targets.wait(e.dest).map_err(|e| Error::InvalidArgument(e.to_string()))?;
            let mut done = 0;
            while done < e.len {
                let n = (e.len - done).min(CHUNK);
                items.push((e.file as usize, e.offset + done, ptr + e.dest_offset + done, n));
                done += n;
            }
        }
        let ops = self.run(req, &handles, &items, io.params().threads as usize)?;
        drop(handles);
        drop(files);
        let mut report = IoReport::blank(
            weightlift_io::ReadEngineUsed::Pread,
            format!("cuFile ({}), {:?}", self.cufile.library, self.cufile.mode),
        );
        report.requested_bytes = req.extents.iter().map(|e| e.len).sum();
        report.direct_bytes = report.requested_bytes;
        report.ops = ops;
        report.lanes = io.params().threads as usize;
        report.io_secs = t0.elapsed().as_secs_f64();
        report.direct_reason = "cuFile reads (O_DIRECT descriptors where the filesystem allows)".into();
        Ok(PathOutcome { path: PathUsed::Cufile, io: report, copy_span_secs: None, nvme: None })
    }
}

impl CufilePath {
    /// Runs `items` on `threads` threads; returns the cuFileRead calls made.
    fn run(&self, req: &DeviceRead<'_>, handles: &[CufileHandle], items: &[Item], threads: usize) -> Result<u64> {
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let results: Vec<Result<u64>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads.clamp(1, items.len().max(1)))
                .map(|_| s.spawn(|| self.worker(req, handles, items, &next, &failed)))
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|_| Err(IoError::Panicked("a cuFile thread panicked".into()).into())))
                .collect()
        });
        let mut ops = 0;
        for r in results {
            ops += r?;
        }
        Ok(ops)
    }

    fn worker(
        &self,
        req: &DeviceRead<'_>,
        handles: &[CufileHandle],
        items: &[Item],
        next: &AtomicUsize,
        failed: &AtomicBool,
    ) -> Result<u64> {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        req.gpu.bind()?;
        let mut ops = 0;
        while !failed.load(Ordering::Relaxed) && !req.opts.cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            let Some(&(file, offset, dest, len)) = items.get(next.fetch_add(1, Ordering::Relaxed)) else { break };
            let path = &req.files[file].path;
            let mut got = 0;
            while got < len {
                // SAFETY: `dest .. dest + len` lies in a destination the caller keeps allocated for the whole read
                // (`Targets`' contract) and that nothing else touches meanwhile.
                let r = unsafe { handles[file].read(dest, (len - got) as usize, offset + got, got) };
                ops += 1;
                match r {
                    Ok(0) => {
                        failed.store(true, Ordering::Relaxed);
                        let expected_end = offset + len;
                        return Err(
                            IoError::Truncated { path: path.clone(), offset: offset + got, expected_end }.into()
                        );
                    }
                    Ok(n) => got += n as u64,
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        // The cuFile status stays reachable as the cause (`std::error::Error::source`).
                        let cause = std::io::Error::other(e);
                        return Err(
                            IoError::Read { path: path.clone(), offset: offset + got, len: len - got, cause }.into()
                        );
                    }
                }
            }
            if let Some(p) = req.opts.progress {
                p.fetch_add(len, Ordering::Relaxed);
            }
        }
        if req.opts.cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(IoError::Cancelled.into());
        }
        Ok(ops)
    }
}
