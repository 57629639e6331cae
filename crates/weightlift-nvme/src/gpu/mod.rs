//! The GPU path: a kernel drives the NVMe queues itself (see [`KERNEL_SOURCE`]), and [`GpuLoader`] loads byte
//! ranges of the namespace into device memory through it.
//!
//! - Tier 1 ([`Tier::HostStaging`]): queues, PRP lists and data slots in pinned host memory mapped into the
//!   device's address space; the controller writes each slot, the GPU copies it into the destination.
//! - Tier 2 ([`Tier::DeviceStaging`]): data slots in device memory; the PRPs carry device addresses, which the
//!   software controller reaches through a copy-engine hook standing in for a drive's peer-to-peer writes.
//!
//! The controller's registers (BAR0) are mapped into the device too, so the kernel rings the doorbells: for the
//! software controller they are ordinary memory; for a drive under VFIO they are registered as I/O memory.
//! Nothing here runs before [`weightlift_cuda::available`] and the symbol checks succeed.

mod cuda;
mod kernel;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg, sys};
use memmap2::MmapMut;
use weightlift_cuda::{DeviceBuffer, Gpu};

use crate::bus::{DmaBuffer, DmaMapping, MmioKind};
use crate::error::NvmeError;
use crate::host::{Controller, RawQueuePair};
use crate::io::LoadReport;
use crate::plan::{ByteRange, plan};
use crate::prp::{SlotPrps, list_qwords};
use crate::queue::{CqRing, SqRing};
use crate::spec::{IoOpcode, PAGE_SIZE, Status};

pub use cuda::{compile, nvrtc_available};
pub use kernel::{KERNEL_NAME, KERNEL_SOURCE, MAX_SLOTS, kernel_source};

use cuda::{CudaDma, HostRegistration};
use kernel::{Control, FAIL_ABORTED, FAIL_BAD_COMPLETION, FAIL_STATUS, FAIL_TIMEOUT, GpuCmd, Outcome, QpDesc, SlotPrp};

/// Largest slot: its PRP list must fit in one page without chaining (see [`SlotPrps`]).
const MAX_SLOT_BYTES: u64 = 2 << 20;

/// Where the data lands before the GPU copies it to its destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// BaM tier 1: pinned host memory mapped into the device.
    HostStaging,
    /// BaM tier 2: device memory, written by (a stand-in for) peer-to-peer DMA. The stand-in issues CUDA copies
    /// while the kernel polls: device-wide synchronisation from other threads during a load can stall them until
    /// the kernel's timeout.
    DeviceStaging,
}

/// How the GPU path is laid out.
#[derive(Clone, Debug)]
pub struct GpuOptions {
    /// Where the data lands first: pinned host memory, or device memory.
    pub tier: Tier,
    /// Queue pairs, one thread block each.
    pub queue_pairs: u16,
    /// Entries per queue (commands in flight per pair: `entries - 1`, at most [`MAX_SLOTS`]).
    pub entries: u32,
    /// Bytes per command; `None` takes the controller's MDTS (at most 2 MiB).
    pub slot_bytes: Option<u64>,
    /// Threads per block (a multiple of 32): they build entries and copy data.
    pub threads_per_block: u32,
    /// How long the kernel waits for a completion before giving up.
    pub timeout: Duration,
}

impl Default for GpuOptions {
    fn default() -> GpuOptions {
        GpuOptions {
            tier: Tier::HostStaging,
            queue_pairs: 8,
            entries: 64,
            slot_bytes: None,
            threads_per_block: 256,
            timeout: Duration::from_secs(10),
        }
    }
}

/// An anonymous mapping registered into the device's address space.
struct Mapped {
    // Unregistered before the mapping goes.
    reg: HostRegistration,
    mem: MmapMut,
}

impl Mapped {
    fn new(gpu: &Gpu, len: usize) -> Result<Mapped, NvmeError> {
        let len = len.max(1).next_multiple_of(PAGE_SIZE);
        let mut mem = MmapMut::map_anon(len)
            .map_err(|e| NvmeError::Dma { bytes: len as u64, reason: format!("mapped host memory: {e}") })?;
        // SAFETY: the mapping lives in the same struct and is dropped after the registration (field order).
        let reg = unsafe { HostRegistration::new(gpu, mem.as_mut_ptr(), len, false) }?;
        Ok(Mapped { reg, mem })
    }

    /// `T` at byte `offset`, for the host.
    fn at<T>(&self, offset: usize) -> Option<*mut T> {
        let fits = offset.is_multiple_of(std::mem::align_of::<T>())
            && offset.checked_add(std::mem::size_of::<T>()).is_some_and(|end| end <= self.mem.len());
        // SAFETY: in bounds, checked above.
        fits.then(|| unsafe { self.mem.as_ptr().cast_mut().add(offset) }.cast())
    }

    fn device(&self, offset: usize) -> u64 {
        self.reg.device_ptr() + offset as u64
    }
}

struct GpuQueue {
    // Registrations go before the memory they cover; the queues are deleted (by `raw`) before their memory.
    _sq_reg: HostRegistration,
    _cq_reg: HostRegistration,
    _data_reg: Option<HostRegistration>,
    raw: RawQueuePair,
    _data: Option<DmaBuffer>,
    _lists: DmaBuffer,
    sq: SqRing,
    cq: CqRing,
}

/// Loads byte ranges of a controller's namespace into device memory with GPU-driven queues.
pub struct GpuLoader {
    // Declaration order is drop order: the kernel's module and stream, then the queues (unregistered and deleted),
    // then the device window (revoked) before the device memory behind it.
    func: CudaFunction,
    _module: Arc<CudaModule>,
    stream: Arc<CudaStream>,
    queues: Vec<GpuQueue>,
    _device_window: Option<Box<dyn DmaMapping>>,
    _device_slots: Option<DeviceBuffer>,
    mapped: Mapped,
    _bar0: HostRegistration,
    gpu: Gpu,
    ctrl: Controller,
    opts: GpuOptions,
    slot_bytes: u64,
    outcome_at: usize,
    abort_at: usize,
    poisoned: Option<String>,
}

impl std::fmt::Debug for GpuLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GpuLoader(cuda:{}, {:?}, {} queue pairs, {} slot bytes)",
            self.gpu.ordinal(),
            self.opts.tier,
            self.queues.len(),
            self.slot_bytes
        )
    }
}

fn driver(step: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> NvmeError {
    move |e| NvmeError::Gpu { step, detail: e.to_string() }
}

fn align8(n: usize) -> usize {
    n.next_multiple_of(8)
}

impl GpuLoader {
    /// Compiles the kernel, creates `opts.queue_pairs` queue pairs on `ctrl`, and maps their queues, slots, PRP
    /// tables and the controller's doorbells into `gpu`'s address space.
    pub fn new(gpu: &Gpu, ctrl: &Controller, opts: &GpuOptions) -> Result<GpuLoader, NvmeError> {
        cuda::check_driver()?;
        let ns = ctrl.namespace();
        let lba = u64::from(ns.lba_size);
        let max_entries = ctrl.info().cap.max_queue_entries().min(MAX_SLOTS + 1);
        if opts.queue_pairs == 0 || !(2..=max_entries).contains(&opts.entries) {
            return Err(NvmeError::invalid(
                "GPU queues",
                format!("{} pairs of {} entries (1.. pairs of 2..={max_entries})", opts.queue_pairs, opts.entries),
            ));
        }
        if opts.threads_per_block == 0 || !opts.threads_per_block.is_multiple_of(32) || opts.threads_per_block > 1024 {
            return Err(NvmeError::invalid(
                "threads per block",
                format!("{} (a multiple of 32 up to 1024)", opts.threads_per_block),
            ));
        }
        let slot_bytes =
            opts.slot_bytes.unwrap_or(ctrl.info().max_transfer).min(ctrl.info().max_transfer).min(MAX_SLOT_BYTES) / lba
                * lba;
        if slot_bytes == 0 {
            return Err(NvmeError::invalid("slot size", format!("less than one {lba}-byte block")));
        }
        let slots = opts.entries - 1;
        let stride = slot_bytes.next_multiple_of(PAGE_SIZE as u64);
        let list_stride = (list_qwords(0, slot_bytes, 0) as usize * 8).next_power_of_two().max(8);

        let ptx = compile(&kernel_source(), Some(gpu.info().compute_capability))?;
        gpu.bind().map_err(|e| NvmeError::Gpu { step: "bind the context", detail: e.to_string() })?;
        let module = gpu.context().load_module(ptx).map_err(driver("load the kernel (cuModuleLoadData)"))?;
        let func = module.load_function(KERNEL_NAME).map_err(driver("find the kernel (cuModuleGetFunction)"))?;
        let stream = gpu.context().new_stream().map_err(driver("create a stream"))?;

        let regs = ctrl.bus().registers();
        // SAFETY: the register window lives as long as the bus, which `ctrl` (kept in the loader) holds; the
        // registration is dropped first.
        let bar0 = unsafe { HostRegistration::new(gpu, regs.as_ptr(), regs.len(), regs.kind() == MmioKind::Device) }?;

        let nqp = usize::from(opts.queue_pairs);
        let total_slots = nqp as u64 * u64::from(slots);
        let (device_slots, device_window, device_base) = match opts.tier {
            Tier::HostStaging => (None, None, 0),
            Tier::DeviceStaging => {
                let len = total_slots * stride;
                let buf = DeviceBuffer::alloc(gpu, (len + PAGE_SIZE as u64) as usize, &stream)
                    .map_err(|e| NvmeError::Gpu { step: "allocate device slots", detail: e.to_string() })?;
                stream.synchronize().map_err(driver("allocate device slots"))?;
                let base = buf.device_ptr().next_multiple_of(PAGE_SIZE as u64);
                let window = ctrl.bus().map_device_memory(base, len, Arc::new(CudaDma::new(gpu)))?;
                (Some(buf), Some(window), base)
            }
        };

        let descs_len = nqp * std::mem::size_of::<QpDesc>();
        let outcome_at = align8(descs_len);
        let abort_at = align8(outcome_at + std::mem::size_of::<Outcome>());
        let prps_at = align8(abort_at + 4).next_multiple_of(32);
        let prp_bytes = std::mem::size_of::<SlotPrp>();
        let mapped = Mapped::new(gpu, prps_at + total_slots as usize * prp_bytes)?;

        let mut queues = Vec::with_capacity(nqp);
        for qp in 0..nqp {
            let raw = ctrl.create_raw_queue_pair(opts.entries)?;
            // SAFETY: the queues' memory is owned by `raw`, which the `GpuQueue` drops after these registrations.
            let sq_reg = unsafe { HostRegistration::new(gpu, raw.sq().as_ptr(), raw.sq().len(), false) }?;
            // SAFETY: as above.
            let cq_reg = unsafe { HostRegistration::new(gpu, raw.cq().as_ptr(), raw.cq().len(), false) }?;
            let lists = ctrl.bus().alloc_dma(slots as usize * list_stride)?;
            let (data, data_reg) = match opts.tier {
                Tier::HostStaging => {
                    let d = ctrl.bus().alloc_dma((u64::from(slots) * stride) as usize)?;
                    // SAFETY: `d` moves into the same `GpuQueue`, dropped after the registration.
                    let r = unsafe { HostRegistration::new(gpu, d.as_ptr(), d.len(), false) }?;
                    (Some(d), Some(r))
                }
                Tier::DeviceStaging => (None, None),
            };
            let (slot_bus, slot_dev) = match (&data, &data_reg) {
                (Some(d), Some(r)) => (d.bus_addr(), r.device_ptr()),
                _ => {
                    let base = device_base + qp as u64 * u64::from(slots) * stride;
                    (base, base)
                }
            };
            let table_at = prps_at + qp * slots as usize * prp_bytes;
            for s in 0..slots as usize {
                let list_at = s * list_stride;
                let (p, list) = SlotPrps::new(
                    slot_bus + s as u64 * stride,
                    slot_bytes,
                    lists.bus_addr() + list_at as u64,
                    list_stride,
                )?;
                for (i, e) in list.iter().enumerate() {
                    lists.store_u64(list_at + 8 * i, *e)?;
                }
                let entry = SlotPrp { prp1: p.prp1, page2: p.page2, list: p.list, first: p.first };
                let dst = mapped
                    .at::<SlotPrp>(table_at + s * prp_bytes)
                    .ok_or_else(|| NvmeError::invalid("slot PRP table", "out of the mapped region"))?;
                // SAFETY: in bounds and aligned (checked by `at`); no kernel runs yet, so nothing else accesses it.
                unsafe { dst.write_volatile(entry) };
            }
            let desc = QpDesc {
                sq: sq_reg.device_ptr(),
                cq: cq_reg.device_ptr(),
                sq_doorbell: bar0.device_ptr() + raw.sq_doorbell() as u64,
                cq_doorbell: bar0.device_ptr() + raw.cq_doorbell() as u64,
                slot_data: slot_dev,
                slot_prp: mapped.device(table_at),
                slot_stride: stride,
                entries: opts.entries,
                slots,
                qid: u32::from(raw.qid()),
                ..QpDesc::default()
            };
            let dst = mapped
                .at::<QpDesc>(qp * std::mem::size_of::<QpDesc>())
                .ok_or_else(|| NvmeError::invalid("queue descriptors", "out of the mapped region"))?;
            // SAFETY: in bounds and aligned; no kernel runs yet.
            unsafe { dst.write_volatile(desc) };
            let bad = || NvmeError::invalid("queue size", opts.entries.to_string());
            queues.push(GpuQueue {
                _sq_reg: sq_reg,
                _cq_reg: cq_reg,
                _data_reg: data_reg,
                raw,
                _data: data,
                _lists: lists,
                sq: SqRing::new(opts.entries).ok_or_else(bad)?,
                cq: CqRing::new(opts.entries).ok_or_else(bad)?,
            });
        }
        Ok(GpuLoader {
            func,
            _module: module,
            stream,
            queues,
            _device_window: device_window,
            _device_slots: device_slots,
            mapped,
            _bar0: bar0,
            gpu: gpu.clone(),
            ctrl: ctrl.clone(),
            opts: opts.clone(),
            slot_bytes,
            outcome_at,
            abort_at,
            poisoned: None,
        })
    }

    /// The tier the loader was built for.
    pub fn tier(&self) -> Tier {
        self.opts.tier
    }

    /// I/O queue pairs the kernels drive (one thread block each).
    pub fn queue_pairs(&self) -> usize {
        self.queues.len()
    }

    /// Bytes per command.
    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    fn abort_flag(&self) -> Option<&AtomicU32> {
        // SAFETY: the flag's slot is in bounds and aligned in the mapped region, which lives as long as `self`; the
        // GPU reads it with volatile loads.
        self.mapped.at::<u32>(self.abort_at).map(|p| unsafe { AtomicU32::from_ptr(p) })
    }

    /// Reads `ranges` of the namespace into `dest` (device memory on this loader's GPU). Every command's status
    /// is checked on the GPU; the first failure stops the load and comes back as a typed error naming its LBAs.
    pub fn load(&mut self, ranges: &[ByteRange], dest: &mut DeviceBuffer) -> Result<LoadReport, NvmeError> {
        if dest.gpu().ordinal() != self.gpu.ordinal() {
            return Err(NvmeError::invalid(
                "destination",
                format!("on cuda:{}, the loader is on cuda:{}", dest.gpu().ordinal(), self.gpu.ordinal()),
            ));
        }
        // SAFETY: `dest` is device memory of this loader's GPU, borrowed mutably for the call.
        unsafe { self.load_raw(ranges, dest.device_ptr(), dest.len() as u64) }
    }

    /// [`GpuLoader::load`] into `dest_len` bytes of device memory at `dest`.
    ///
    /// # Safety
    /// `dest..dest + dest_len` must be device memory of this loader's GPU that stays allocated, and is not used by
    /// anything else, until this returns.
    pub unsafe fn load_raw(&mut self, ranges: &[ByteRange], dest: u64, dest_len: u64) -> Result<LoadReport, NvmeError> {
        if let Some(why) = &self.poisoned {
            return Err(NvmeError::ControllerFailed(format!("GPU queues unusable after an earlier failure: {why}")));
        }
        if let Some(why) = self.ctrl.failure() {
            return Err(NvmeError::ControllerFailed(why));
        }
        let ns = self.ctrl.namespace();
        let chunks = plan(ranges, ns.lba_size, ns.lbas, self.slot_bytes, dest_len)?;
        let path = match self.opts.tier {
            Tier::HostStaging => "gpu-initiated NVMe, tier 1 (pinned host staging)",
            Tier::DeviceStaging => "gpu-initiated NVMe, tier 2 (device staging)",
        };
        let mut report = LoadReport {
            path,
            commands: 0,
            bytes: chunks.iter().map(|c| u64::from(c.len)).sum(),
            transferred: chunks.iter().map(|c| c.bytes(ns.lba_size)).sum(),
            queue_pairs: self.queues.len(),
            entries: self.opts.entries,
            elapsed: Duration::ZERO,
        };
        if chunks.is_empty() {
            return Ok(report);
        }
        let ncmds = u32::try_from(chunks.len())
            .map_err(|_| NvmeError::invalid("load", format!("{} commands in one load", chunks.len())))?;
        let cmds: Vec<GpuCmd> = chunks
            .iter()
            .map(|c| GpuCmd {
                slba: c.slba,
                dest: c.dest_offset,
                nlb: c.nlb,
                skip: c.skip,
                len: c.len,
                bytes: (c.bytes(ns.lba_size)) as u32,
            })
            .collect();

        let gpu_err =
            |step: &'static str| move |e: weightlift_cuda::CudaError| NvmeError::Gpu { step, detail: e.to_string() };
        let cmd_bytes = std::mem::size_of_val(cmds.as_slice());
        let cmd_buf = DeviceBuffer::alloc(&self.gpu, cmd_bytes, &self.stream).map_err(gpu_err("allocate commands"))?;
        let ctl_buf = DeviceBuffer::alloc(&self.gpu, std::mem::size_of::<Control>(), &self.stream)
            .map_err(gpu_err("allocate the control block"))?;
        let s = self.stream.cu_stream();
        // SAFETY: both buffers were just allocated on this stream with these sizes; the host source is `cmds`,
        // alive until the stream is synchronised below.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(cmd_buf.device_ptr(), cmds.as_ptr().cast(), cmd_bytes, s)
                .result()
                .map_err(driver("upload commands"))?;
            sys::cuMemsetD8Async(ctl_buf.device_ptr(), 0, std::mem::size_of::<Control>(), s)
                .result()
                .map_err(driver("clear the control block"))?;
        }
        self.stream.synchronize().map_err(driver("upload commands"))?;

        for (qp, q) in self.queues.iter().enumerate() {
            let p = self
                .mapped
                .at::<QpDesc>(qp * std::mem::size_of::<QpDesc>())
                .ok_or_else(|| NvmeError::invalid("queue descriptors", "out of the mapped region"))?;
            // SAFETY: in bounds and aligned; the kernel is not running, so only this thread accesses it.
            unsafe {
                let mut d = p.read_volatile();
                d.sq_tail = q.sq.tail();
                d.sq_head = q.sq.head();
                d.cq_head = q.cq.head();
                d.cq_phase = u32::from(q.cq.phase());
                d.submitted = 0;
                p.write_volatile(d);
            }
        }
        let out = self
            .mapped
            .at::<Outcome>(self.outcome_at)
            .ok_or_else(|| NvmeError::invalid("outcome", "out of the mapped region"))?;
        // SAFETY: in bounds and aligned; the kernel is not running.
        unsafe { out.write_volatile(Outcome::default()) };
        let abort = self.abort_flag().ok_or_else(|| NvmeError::invalid("abort flag", "out of the mapped region"))?;
        abort.store(0, Ordering::SeqCst);
        // The destination may have been allocated or written on other streams.
        self.gpu.synchronize().map_err(gpu_err("synchronize before the load"))?;

        let (qps, cmds_dev, dest_dev, ctl_dev) =
            (self.mapped.device(0), cmd_buf.device_ptr(), dest, ctl_buf.device_ptr());
        let (out_dev, abort_dev) = (self.mapped.device(self.outcome_at), self.mapped.device(self.abort_at));
        let nsid = ns.nsid;
        let timeout_ns = self.opts.timeout.as_nanos().min(u128::from(u64::MAX)) as u64;
        let batch = self.opts.entries - 1;
        let host_slots = u32::from(self.opts.tier == Tier::HostStaging);
        let cfg = LaunchConfig {
            grid_dim: (u32::from(self.opts.queue_pairs), 1, 1),
            block_dim: (self.opts.threads_per_block, 1, 1),
            shared_mem_bytes: 0,
        };
        let start = Instant::now();
        let mut launch = self.stream.launch_builder(&self.func);
        launch
            .arg(&qps)
            .arg(&cmds_dev)
            .arg(&ncmds)
            .arg(&dest_dev)
            .arg(&ctl_dev)
            .arg(&out_dev)
            .arg(&abort_dev)
            .arg(&nsid)
            .arg(&timeout_ns)
            .arg(&batch)
            .arg(&host_slots);
        // SAFETY: the arguments match the kernel's parameters in order and type (u64, u64, u32, u64, u64, u64, u64,
        // u32, u64, u32, u32). Every address is live until the kernel ends, which is waited for below: the queue
        // memory, PRP tables, descriptors and doorbells are owned by `self`, the commands and control block by this
        // function, the destination is the caller's (this function's contract); the plan keeps every write inside it.
        unsafe { launch.launch(cfg) }.map_err(driver("launch the kernel"))?;

        let mut aborted = false;
        loop {
            // SAFETY: a live stream of this context.
            let r = unsafe { sys::cuStreamQuery(s) };
            match r {
                sys::CUresult::CUDA_SUCCESS => break,
                sys::CUresult::CUDA_ERROR_NOT_READY => {
                    if !aborted && let Some(why) = self.ctrl.failure() {
                        tracing::warn!("aborting the GPU load: {why}");
                        abort.store(1, Ordering::SeqCst);
                        aborted = true;
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
                other => {
                    let why = format!("the kernel failed: {other:?}");
                    self.poisoned = Some(why.clone());
                    return Err(NvmeError::Gpu { step: "run the kernel", detail: why });
                }
            }
        }
        report.elapsed = start.elapsed();

        let mut ctl = [0u8; std::mem::size_of::<Control>()];
        ctl_buf.read_back(0, &mut ctl).map_err(gpu_err("read the control block"))?;
        let completed = u64::from_le_bytes(ctl[8..16].try_into().unwrap_or([0; 8]));
        report.commands = completed;
        // SAFETY: in bounds and aligned; the kernel has finished, so nothing writes it now.
        let outcome = unsafe { out.read_volatile() };

        for (qp, q) in self.queues.iter_mut().enumerate() {
            let Some(p) = self.mapped.at::<QpDesc>(qp * std::mem::size_of::<QpDesc>()) else { continue };
            // SAFETY: in bounds and aligned; the kernel has finished.
            let d = unsafe { p.read_volatile() };
            match (
                SqRing::resume(self.opts.entries, d.sq_tail, d.sq_head),
                CqRing::resume(self.opts.entries, d.cq_head, d.cq_phase == 1),
            ) {
                (Some(sq), Some(cq)) => {
                    q.sq = sq;
                    q.cq = cq;
                }
                _ => self.poisoned = Some(format!("queue {} came back with ring state {d:?}", q.raw.qid())),
            }
        }
        let qid_of = |qp: u32| self.queues.get(qp as usize).map_or(0, |q| q.raw.qid());
        match outcome.failed {
            0 if completed == u64::from(ncmds) => Ok(report),
            0 => {
                let why = format!("the kernel completed {completed} of {ncmds} commands without reporting a failure");
                self.poisoned = Some(why.clone());
                Err(NvmeError::ControllerFailed(why))
            }
            FAIL_STATUS => {
                let c = chunks.get(outcome.cmd as usize).copied().ok_or_else(|| {
                    NvmeError::ControllerFailed(format!(
                        "the kernel reported failed command {} of {ncmds}",
                        outcome.cmd
                    ))
                })?;
                Err(NvmeError::Command {
                    qid: qid_of(outcome.qp),
                    cid: outcome.cid as u16,
                    opcode: IoOpcode::Read as u8,
                    slba: c.slba,
                    nlb: c.nlb,
                    status: Status::from_raw(outcome.status as u16),
                })
            }
            FAIL_TIMEOUT => {
                let why = format!("queue {} got no completion for {:?}", qid_of(outcome.qp), self.opts.timeout);
                self.poisoned = Some(why);
                Err(NvmeError::Timeout {
                    what: format!("completions on GPU-driven queue {}", qid_of(outcome.qp)),
                    waited_ms: self.opts.timeout.as_millis() as u64,
                })
            }
            FAIL_ABORTED => {
                let why = self.ctrl.failure().unwrap_or_else(|| "aborted by the host".into());
                self.poisoned = Some(why.clone());
                Err(NvmeError::ControllerFailed(why))
            }
            code => {
                let why = if code == FAIL_BAD_COMPLETION {
                    format!("queue {} got a completion for unknown command id {}", qid_of(outcome.qp), outcome.cid)
                } else {
                    format!("the kernel reported failure code {code}")
                };
                self.poisoned = Some(why.clone());
                Err(NvmeError::ControllerFailed(why))
            }
        }
    }
}
