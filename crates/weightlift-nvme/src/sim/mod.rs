//! A software NVMe controller: host threads that behave like a controller behind a register page in memory. They
//! answer the enable/ready handshake, poll doorbells, run admin commands (Identify, queue creation and deletion,
//! Number of Queues) and Read/Write/Flush against a backing file, move data into PRP-addressed memory (host memory,
//! or device memory through a hook standing in for peer-to-peer DMA), and post completions with the right phase.
//! Latency per command and failures at chosen LBAs can be injected.

mod config;
mod engine;
mod iommu;

pub use config::{Fault, SoftConfig, SoftStats};

use std::fs::OpenOptions;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::bus::{Bus, DeviceDma, DmaBuffer, DmaMapping, Mmio, MmioKind};
use crate::error::NvmeError;

use engine::SimShared;

/// A running software controller over a backing file; stopped when dropped.
#[derive(Debug)]
pub struct SoftNvme {
    shared: Arc<SimShared>,
    bus: Arc<SimBus>,
    threads: Vec<JoinHandle<()>>,
}

impl SoftNvme {
    /// Starts a controller whose namespace 1 is the file at `path`, rounded up to whole blocks (the tail past the
    /// file's end reads as zeros).
    pub fn start(path: &Path, config: SoftConfig) -> Result<SoftNvme, NvmeError> {
        if config.lba_size != 512 && config.lba_size != 4096 {
            return Err(NvmeError::invalid("block size", format!("{} (512 or 4096)", config.lba_size)));
        }
        if !(1..=16).contains(&config.mdts) {
            return Err(NvmeError::invalid("MDTS", format!("{} (1..=16)", config.mdts)));
        }
        if !(2..=65536).contains(&config.max_queue_entries)
            || config.max_io_queues == 0
            || config.max_io_queues == u16::MAX
            || config.doorbell_stride > 15
            || config.io_threads == 0
        {
            return Err(NvmeError::invalid("software controller configuration", format!("{config:?}")));
        }
        let file = OpenOptions::new().read(true).write(config.writable).open(path).map_err(|cause| {
            NvmeError::Backing { path: path.to_path_buf(), what: "cannot open backing file", cause }
        })?;
        let len = file
            .metadata()
            .map_err(|cause| NvmeError::Backing { path: path.to_path_buf(), what: "cannot stat backing file", cause })?
            .len();
        if len == 0 {
            return Err(NvmeError::invalid("backing file", format!("{} is empty", path.display())));
        }
        let shared = Arc::new(SimShared::new(path.to_path_buf(), file, len, config.clone())?);
        let mut threads = Vec::with_capacity(config.io_threads + 1);
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name).spawn(f).map_err(|cause| NvmeError::Backing {
                path: path.to_path_buf(),
                what: "cannot start a controller thread",
                cause,
            })
        };
        let sh = shared.clone();
        let started = (|| {
            threads.push(spawn("wl-nvme-ctrl".into(), Box::new(move || engine::run_admin(&sh)))?);
            for k in 0..config.io_threads {
                let sh = shared.clone();
                threads.push(spawn(format!("wl-nvme-io{k}"), Box::new(move || engine::run_io(&sh, k)))?);
            }
            Ok(())
        })();
        if let Err(e) = started {
            shared.stop.store(true, Ordering::Relaxed);
            for t in threads {
                let _ = t.join();
            }
            return Err(e);
        }
        let bus = Arc::new(SimBus::new(shared.clone()));
        Ok(SoftNvme { shared, bus, threads })
    }

    /// The register page and DMA memory, for [`crate::Controller::bring_up`].
    pub fn bus(&self) -> Arc<dyn Bus> {
        self.bus.clone()
    }

    /// The backing file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Adds a failure.
    pub fn inject(&self, fault: Fault) {
        self.shared.faults.lock().unwrap_or_else(|p| p.into_inner()).push(fault);
    }

    /// Removes every injected failure.
    pub fn clear_faults(&self) {
        self.shared.faults.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Sets the delay between fetching a command and posting its completion, for commands fetched from now on.
    pub fn set_latency(&self, latency: Duration) {
        self.shared.latency_ns.store(latency.as_nanos().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
    }

    /// What the controller has done so far.
    pub fn stats(&self) -> SoftStats {
        self.shared.stats()
    }

    /// Why the controller set its fatal status, if it did.
    pub fn fatal(&self) -> Option<String> {
        self.shared.fatal.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for SoftNvme {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::warn!("a software NVMe controller thread panicked");
            }
        }
    }
}

/// The software controller's side of [`Bus`]: its register page and its IOMMU.
#[derive(Debug)]
pub struct SimBus {
    shared: Arc<SimShared>,
    regs: Mmio,
}

impl SimBus {
    fn new(shared: Arc<SimShared>) -> SimBus {
        let (ptr, len) = shared.register_page();
        // SAFETY: the register page is page aligned, `len` bytes long, and owned by `shared`, which this bus keeps
        // alive; the controller threads access it only atomically.
        let regs = unsafe { Mmio::new(ptr, len, MmioKind::Memory) };
        SimBus { shared, regs }
    }
}

impl Bus for SimBus {
    fn registers(&self) -> &Mmio {
        &self.regs
    }

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer, NvmeError> {
        DmaBuffer::alloc(len, |ptr, n| {
            let addr = ptr as u64;
            Ok((addr, self.shared.iommu.map_host(addr, n as u64)?))
        })
    }

    fn map_device_memory(
        &self,
        addr: u64,
        len: u64,
        dma: Arc<dyn DeviceDma>,
    ) -> Result<Box<dyn DmaMapping>, NvmeError> {
        self.shared.iommu.map_device(addr, len, dma)
    }

    fn describe(&self) -> String {
        format!("software NVMe over {}", self.shared.path.display())
    }
}
