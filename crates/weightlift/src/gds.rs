//! GPU loads through NVIDIA cuFile (GPUDirect Storage): each device block is read by `cuFileRead` in chunks, by
//! several threads at once. Where nvidia-fs (or P2PDMA) is present this moves data from storage to GPU memory
//! without a host copy; elsewhere cuFile runs in compat mode (host bounce buffers), which the io_uring pipeline
//! beats, so `auto` picks cuFile only when it runs peer-to-peer.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use weightlift_cuda::Gpu;
use weightlift_cuda::cufile::{Cufile, CufileHandle};
use weightlift_io::{IoError, IoReport};

use crate::error::{Error, Result};
use crate::placement::Block;

/// Largest single cuFileRead (cuFile's default max_direct_io_size is 16 MiB).
const CHUNK: u64 = 16 << 20;

/// Reads `blocks` of `paths` into the device ranges `dests` (address, length) with `threads` threads.
pub(crate) fn load_blocks(
    cufile: &Cufile,
    gpu: &Gpu,
    paths: &[PathBuf],
    blocks: &[Block],
    dests: &[(u64, u64)],
    threads: usize,
    progress: Option<&AtomicU64>,
) -> Result<IoReport> {
    let t0 = Instant::now();
    let mut files: Vec<File> = Vec::with_capacity(paths.len());
    for p in paths {
        let direct = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(p);
        let f = match direct {
            Ok(f) => f,
            // compat mode accepts buffered descriptors; peer-to-peer needs O_DIRECT and will say so on register.
            Err(_) => File::open(p).map_err(|cause| Error::Io(IoError::Open { path: p.clone(), cause }))?,
        };
        files.push(f);
    }
    let handles: Vec<CufileHandle> = files
        .iter()
        .zip(paths)
        .map(|(f, p)| {
            // SAFETY: `files` outlives `handles` (dropped after them at the end of this function).
            unsafe { cufile.register(f.as_raw_fd()) }.map_err(|e| Error::Cuda(format!("{}: {e}", p.display())))
        })
        .collect::<Result<_>>()?;
    let mut items = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let mut done = 0;
        while done < b.len {
            let n = (b.len - done).min(CHUNK);
            items.push((b.file, b.start + done, dests[i].0, done, n));
            done += n;
        }
    }
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let setup = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let results: Vec<Result<u64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.clamp(1, items.len().max(1)))
            .map(|_| {
                s.spawn(|| -> Result<u64> {
                    gpu.bind()?;
                    let mut ops = 0;
                    while !failed.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(file, offset, base, dev_off, len)) = items.get(i) else { break };
                        let mut got = 0;
                        while got < len {
                            // SAFETY: `base + dev_off .. + len` lies in a device block of `gpu` that the caller keeps
                            // allocated for the whole load and that nothing else touches meanwhile.
                            let r =
                                unsafe { handles[file].read(base, (len - got) as usize, offset + got, dev_off + got) };
                            match r {
                                Ok(0) => {
                                    failed.store(true, Ordering::Relaxed);
                                    return Err(Error::Io(IoError::Truncated {
                                        path: paths[file].clone(),
                                        offset: offset + got,
                                        expected_end: offset + len,
                                    }));
                                }
                                Ok(n) => got += n as u64,
                                Err(e) => {
                                    failed.store(true, Ordering::Relaxed);
                                    let cause = std::io::Error::other(e.to_string());
                                    return Err(Error::Io(IoError::Read {
                                        path: paths[file].clone(),
                                        offset: offset + got,
                                        len: len - got,
                                        cause,
                                    }));
                                }
                            }
                            ops += 1;
                        }
                        if let Some(p) = progress {
                            p.fetch_add(len, Ordering::Relaxed);
                        }
                    }
                    Ok(ops)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err(Error::Cuda("a cuFile thread panicked".into()))))
            .collect()
    });
    let mut report = IoReport { backend: "gds", ..IoReport::default() };
    for r in results {
        report.ops += r?;
    }
    drop(handles);
    drop(files);
    report.backend_reason = format!(
        "cuFile ({}), {}",
        cufile.library,
        match &cufile.mode {
            weightlift_cuda::cufile::CufileMode::PeerToPeer(m) => format!("peer-to-peer via {m}"),
            weightlift_cuda::cufile::CufileMode::Compat(m) => format!("compat mode: {m}"),
        }
    );
    report.requested_bytes = blocks.iter().map(|b| b.len).sum();
    report.direct_bytes = report.requested_bytes;
    report.lanes = threads;
    report.setup_secs = setup;
    report.io_secs = t1.elapsed().as_secs_f64();
    report.direct_reason = "cuFile reads (O_DIRECT descriptors where the filesystem allows)".into();
    Ok(report)
}
