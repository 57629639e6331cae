//! The shape of NVIDIA's cuFile API on every machine: a session (`cuFileDriverOpen`), registered file handles and
//! buffers, `read`/`write` with a buffer offset, `pread`/`pwrite`, asynchronous variants ordered on a CUDA stream,
//! batches with a status per entry, and vectored I/O. Served by weightlift's engine (io_uring pipeline, pinned ring);
//! through cuFile itself when the session asks for it and cuFile is present.
//!
//! Semantics follow cuFile: reads return the bytes read (fewer at the end of the file), a buffer must be
//! registered before `read`/`write` name it, `buf_offset + size` must stay inside the registration, and a handle
//! opened for O_DIRECT refuses requests that are not block-aligned.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use weightlift_cuda::cufile::{Cufile, CufileHandle};

use crate::device::Device;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::settings::Settings;
use crate::tensor::{RawDest, RawSrc};

/// How a file is registered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileMode {
    /// Reads are allowed.
    pub read: bool,
    /// Writes are allowed.
    pub write: bool,
    /// The file is created if missing.
    pub create: bool,
    /// The file is emptied on opening.
    pub truncate: bool,
    /// Requests must be aligned to the filesystem's block size (cuFile's O_DIRECT requirement).
    pub direct: bool,
}

impl FileMode {
    /// `"r"`, `"w"`, `"r+"`, `"w+"`, `"a"`-less fopen-style modes; a trailing `d` asks for O_DIRECT semantics.
    pub fn parse(s: &str) -> Result<FileMode> {
        let direct = s.ends_with('d');
        let base = s.trim_end_matches('d').replace('b', "");
        let m = match base.as_str() {
            "r" => FileMode { read: true, ..FileMode::default() },
            "w" => FileMode { write: true, create: true, truncate: true, ..FileMode::default() },
            "r+" => FileMode { read: true, write: true, ..FileMode::default() },
            "w+" => FileMode { read: true, write: true, create: true, truncate: true, ..FileMode::default() },
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "mode {s:?}: expected r, w, r+ or w+ (add d for O_DIRECT)"
                )));
            }
        };
        Ok(FileMode { direct, ..m })
    }
}

struct FileEntry {
    path: PathBuf,
    mode: FileMode,
    block: u64,
    // Declared before `file` so cuFile forgets the descriptor before it is closed.
    cufile: Option<CufileHandle>,
    _file: File,
}

#[derive(Clone, Copy, Debug)]
struct BufEntry {
    len: u64,
    device: Device,
}

/// Read or write, for batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// From the file into GPU memory.
    Read,
    /// From GPU memory into the file.
    Write,
}

/// One entry of a batch: cuFile's `CUfileIOParams_t`.
#[derive(Clone, Copy, Debug)]
pub struct BatchEntry {
    /// Read or write.
    pub op: Op,
    /// The registered file, as `handle_register` returned it.
    pub fh: u64,
    /// Device address of the buffer.
    pub base: u64,
    /// Bytes to transfer.
    pub size: u64,
    /// Offset in the file.
    pub file_offset: u64,
    /// Offset from `base` in the buffer.
    pub buf_offset: u64,
}

/// A cuFile-style session. Share it between threads (operations on one session take turns in the engine).
pub struct Session {
    engine: Engine,
    cufile: Option<Cufile>,
    files: Mutex<HashMap<u64, Arc<FileEntry>>>,
    buffers: Mutex<BTreeMap<u64, BufEntry>>,
    next: AtomicU64,
    closed: AtomicBool,
    /// Faults injected into the engine's reads and writes (tests).
    faults: Mutex<Option<Arc<weightlift_io::fault::FaultPlan>>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("cufile", &self.cufile.as_ref().map(|c| &c.library)).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Session {
    /// Opens a session. `use_cufile` routes device I/O of registered handles through NVIDIA's cuFile, and fails
    /// if it is missing.
    pub fn open(settings: Settings, use_cufile: bool) -> Result<Session> {
        let cufile = if use_cufile {
            let lib = settings.cufile_lib.value.as_deref();
            Some(
                weightlift_cuda::cufile::driver(lib)
                    .map_err(|e| crate::error::cufile_requested_but(e, "cuFile requested but unavailable"))?,
            )
        } else {
            None
        };
        Ok(Session {
            engine: Engine::new(settings)?,
            cufile,
            files: Mutex::new(HashMap::new()),
            buffers: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            faults: Mutex::new(None),
        })
    }

    /// Which data path serves this session.
    pub fn backend(&self) -> String {
        match &self.cufile {
            Some(c) => format!("cufile ({:?})", c.mode),
            None => "weightlift engine".into(),
        }
    }

    fn live(&self) -> Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::InvalidArgument("the session is closed".into()));
        }
        Ok(())
    }

    /// Deregisters every handle and buffer; later calls fail.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        lock(&self.files).clear();
        let bufs = std::mem::take(&mut *lock(&self.buffers));
        if let Some(c) = &self.cufile {
            for (base, b) in bufs {
                if matches!(b.device, Device::Cuda(_)) {
                    // SAFETY: registered by `buf_register` below on this driver.
                    let _ = unsafe { c.deregister_buffer(base) };
                }
            }
        }
    }

    /// `cuFileHandleRegister`: opens `path` and returns a handle id.
    pub fn handle_register(&self, path: &Path, mode: FileMode) -> Result<u64> {
        self.live()?;
        let mut opts = OpenOptions::new();
        opts.read(mode.read).write(mode.write).create(mode.create).truncate(mode.truncate);
        if !mode.read && !mode.write {
            return Err(Error::InvalidArgument("a file handle must be readable or writable".into()));
        }
        // Refuse FIFOs, sockets and devices before an open that could block on them (a regular file at this point
        // stays one for the open below unless it is swapped in between).
        let access =
            weightlift_format::regular::Access { write: mode.write, create: mode.create, ..Default::default() };
        drop(weightlift_io::file::open_checked(path, access)?);
        let file = opts
            .open(path)
            .map_err(|cause| Error::Io(weightlift_io::IoError::Open { path: path.to_path_buf(), cause }))?;
        let probe = weightlift_io::OpenFile::open(path, true).ok();
        if mode.direct && !probe.as_ref().is_some_and(|f| f.supports_direct()) {
            return Err(Error::InvalidArgument(format!(
                "{}: O_DIRECT was asked for but the filesystem refuses it",
                path.display()
            )));
        }
        let block = probe.map_or(4096, |f| f.block);
        let cufile = match &self.cufile {
            Some(c) => {
                // cuFile wants an O_DIRECT descriptor for peer-to-peer; compat mode takes any.
                let mut d = OpenOptions::new();
                d.read(mode.read).write(mode.write).custom_flags(libc::O_DIRECT);
                let fd =
                    d.open(path).unwrap_or(file.try_clone().map_err(|cause| {
                        Error::Io(weightlift_io::IoError::Open { path: path.to_path_buf(), cause })
                    })?);
                // SAFETY: the descriptor is kept open in the entry for as long as the handle exists (field order).
                let h = unsafe { c.register(fd.as_raw_fd()) }.map_err(|e| Error::Cuda(e.into()))?;
                Some((h, fd))
            }
            None => None,
        };
        let (cufile, file) = match cufile {
            Some((h, fd)) => (Some(h), fd),
            None => (None, file),
        };
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.files)
            .insert(id, Arc::new(FileEntry { path: path.to_path_buf(), mode, block, cufile, _file: file }));
        Ok(id)
    }

    /// `cuFileHandleDeregister`.
    pub fn handle_deregister(&self, fh: u64) -> Result<()> {
        lock(&self.files)
            .remove(&fh)
            .map(|_| ())
            .ok_or_else(|| Error::InvalidArgument(format!("file handle {fh} is not registered")))
    }

    /// `cuFileBufRegister`: `len` bytes at `base` (host memory, or memory of `device`).
    ///
    /// # Safety
    /// The memory must stay valid until it is deregistered (or the session closed).
    pub unsafe fn buf_register(&self, base: u64, len: u64, device: Device) -> Result<()> {
        self.live()?;
        let mut bufs = lock(&self.buffers);
        if overlapping(&bufs, base, len).is_some() {
            return Err(Error::InvalidArgument(format!("buffer {base:#x} overlaps one already registered")));
        }
        if let (Some(c), Device::Cuda(_)) = (&self.cufile, device) {
            // SAFETY: per this function's contract.
            unsafe { c.register_buffer(base, len as usize) }.map_err(|e| Error::Cuda(e.into()))?;
        }
        bufs.insert(base, BufEntry { len, device });
        Ok(())
    }

    /// `cuFileBufDeregister`.
    pub fn buf_deregister(&self, base: u64) -> Result<()> {
        let b = lock(&self.buffers)
            .remove(&base)
            .ok_or_else(|| Error::InvalidArgument(format!("buffer {base:#x} is not registered")))?;
        if let (Some(c), Device::Cuda(_)) = (&self.cufile, b.device) {
            // SAFETY: registered by `buf_register`.
            unsafe { c.deregister_buffer(base) }.map_err(|e| Error::Cuda(e.into()))?;
        }
        Ok(())
    }

    fn file(&self, fh: u64) -> Result<Arc<FileEntry>> {
        self.live()?;
        lock(&self.files)
            .get(&fh)
            .cloned()
            .ok_or_else(|| Error::InvalidArgument(format!("file handle {fh} is not registered")))
    }

    fn registered(&self, base: u64, buf_offset: u64, size: u64) -> Result<Device> {
        let b = *lock(&self.buffers).get(&base).ok_or_else(|| {
            Error::InvalidArgument(format!("buffer {base:#x} is not registered (register it with buf_register first)"))
        })?;
        if buf_offset.checked_add(size).is_none_or(|end| end > b.len) {
            return Err(Error::InvalidArgument(format!(
                "buf_offset {buf_offset} + size {size} is past the end of the {}-byte buffer {base:#x}",
                b.len
            )));
        }
        Ok(b.device)
    }

    /// An O_DIRECT handle takes block-aligned file offsets and sizes only (the memory side is staged, so any
    /// address works).
    fn check_alignment(f: &FileEntry, file_offset: u64, size: u64) -> Result<()> {
        if f.mode.direct && (!file_offset.is_multiple_of(f.block) || !size.is_multiple_of(f.block)) {
            return Err(Error::InvalidArgument(format!(
                "{}: misaligned O_DIRECT request (file offset {file_offset}, size {size}; the block is {} bytes)",
                f.path.display(),
                f.block
            )));
        }
        Ok(())
    }

    /// The I/O itself, on memory at `addr` of `device`.
    fn transfer(&self, f: &FileEntry, op: Op, addr: u64, size: u64, file_offset: u64, device: Device) -> Result<u64> {
        Self::check_alignment(f, file_offset, size)?;
        match op {
            Op::Read if !f.mode.read => {
                return Err(Error::InvalidArgument(format!("{}: the handle is write-only", f.path.display())));
            }
            Op::Write if !f.mode.write => {
                return Err(Error::Io(weightlift_io::IoError::Write {
                    path: f.path.clone(),
                    offset: file_offset,
                    len: size,
                    cause: std::io::Error::new(std::io::ErrorKind::PermissionDenied, "the handle is read-only"),
                }));
            }
            _ => {}
        }
        if let (Some(h), Device::Cuda(n)) = (&f.cufile, device) {
            let gpu = self.engine.gpu(n)?;
            let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
            gpu.bind()?;
            // SAFETY: the caller of the public API vouched for the memory (registration or `pread`'s contract).
            let r = unsafe {
                match op {
                    Op::Read => h.read(addr, size as usize, file_offset, 0),
                    Op::Write => h.write(addr, size as usize, file_offset, 0),
                }
            };
            return r.map(|n| n as u64).map_err(|e| {
                let (offset, len, cause) = (file_offset, size, std::io::Error::other(e));
                match op {
                    Op::Read => weightlift_io::IoError::Read { path: f.path.clone(), offset, len, cause }.into(),
                    Op::Write => weightlift_io::IoError::Write { path: f.path.clone(), offset, len, cause }.into(),
                }
            });
        }
        let engine = &self.engine;
        let faults = lock(&self.faults).clone();
        match op {
            Op::Read => {
                let dest = match device {
                    Device::Cuda(ordinal) => RawDest::Device { ordinal, ptr: addr },
                    _ => RawDest::Host(addr as *mut u8),
                };
                let opts = crate::LoadOpts { faults: faults.as_deref(), ..crate::LoadOpts::default() };
                // SAFETY: as above.
                unsafe { engine.read_at(&f.path, file_offset, size, dest, &opts) }.map(|(n, _)| n)
            }
            Op::Write => {
                let src = match device {
                    Device::Cuda(ordinal) => RawSrc::Device { ordinal, ptr: addr },
                    _ => RawSrc::Host(addr as *const u8),
                };
                // SAFETY: as above.
                unsafe { engine.write_from_with(&f.path, file_offset, size, src, false, faults.as_deref()) }
            }
        }
    }

    /// `cuFileRead`: up to `size` bytes at `file_offset` into registered buffer `base` at `buf_offset`; returns the
    /// bytes read (fewer at the end of the file, as `pread`).
    pub fn read(&self, fh: u64, base: u64, size: u64, file_offset: u64, buf_offset: u64) -> Result<u64> {
        let f = self.file(fh)?;
        let device = self.registered(base, buf_offset, size)?;
        self.transfer(&f, Op::Read, base + buf_offset, size, file_offset, device)
    }

    /// `cuFileWrite`: `size` bytes of registered buffer `base` from `buf_offset` to `file_offset`.
    pub fn write(&self, fh: u64, base: u64, size: u64, file_offset: u64, buf_offset: u64) -> Result<u64> {
        let f = self.file(fh)?;
        let device = self.registered(base, buf_offset, size)?;
        self.transfer(&f, Op::Write, base + buf_offset, size, file_offset, device)
    }

    /// `pread` into memory that need not be registered.
    ///
    /// # Safety
    /// `addr..addr + size` must be writable memory of `device`, untouched by others during the call.
    pub unsafe fn pread(&self, fh: u64, addr: u64, size: u64, file_offset: u64, device: Device) -> Result<u64> {
        let f = self.file(fh)?;
        self.transfer(&f, Op::Read, addr, size, file_offset, device)
    }

    /// `pwrite` from memory that need not be registered.
    ///
    /// # Safety
    /// `addr..addr + size` must be readable memory of `device` during the call.
    pub unsafe fn pwrite(&self, fh: u64, addr: u64, size: u64, file_offset: u64, device: Device) -> Result<u64> {
        let f = self.file(fh)?;
        self.transfer(&f, Op::Write, addr, size, file_offset, device)
    }

    /// A batch (`cuFileBatchIOSubmit`): every entry runs, each with its own status.
    pub fn batch(&self, entries: &[BatchEntry]) -> Vec<Result<u64>> {
        entries
            .iter()
            .map(|e| match e.op {
                Op::Read => self.read(e.fh, e.base, e.size, e.file_offset, e.buf_offset),
                Op::Write => self.write(e.fh, e.base, e.size, e.file_offset, e.buf_offset),
            })
            .collect()
    }

    /// Vectored read: consecutive bytes of the file from `file_offset` into registered buffers `(base, len)` in
    /// order; returns the bytes read (stopping early at the end of the file).
    pub fn readv(&self, fh: u64, file_offset: u64, bufs: &[(u64, u64)]) -> Result<u64> {
        self.vectored(fh, Op::Read, file_offset, bufs)
    }

    /// Vectored write: registered buffers `(base, len)` written one after another from `file_offset`.
    pub fn writev(&self, fh: u64, file_offset: u64, bufs: &[(u64, u64)]) -> Result<u64> {
        self.vectored(fh, Op::Write, file_offset, bufs)
    }

    fn vectored(&self, fh: u64, op: Op, file_offset: u64, bufs: &[(u64, u64)]) -> Result<u64> {
        let f = self.file(fh)?;
        let devices: Vec<Device> = bufs.iter().map(|&(b, n)| self.registered(b, 0, n)).collect::<Result<_>>()?;
        let mut done = 0;
        for (&(base, len), &device) in bufs.iter().zip(&devices) {
            let n = self.transfer(&f, op, base, len, file_offset + done, device)?;
            done += n;
            if n < len {
                break;
            }
        }
        Ok(done)
    }

    /// Injects faults into the engine's reads and writes from now on (tests; `None` stops injecting). cuFile's own
    /// I/O (with `use_cufile`) is not affected.
    pub fn set_faults(&self, faults: Option<Arc<weightlift_io::fault::FaultPlan>>) {
        *lock(&self.faults) = faults;
    }

    /// The path of a registered handle.
    pub fn path(&self, fh: u64) -> Result<PathBuf> {
        Ok(self.file(fh)?.path.clone())
    }

    /// The mode a registered handle was opened with.
    pub fn mode(&self, fh: u64) -> Result<FileMode> {
        Ok(self.file(fh)?.mode)
    }

    /// The handle registered for `path`, if any.
    pub fn handle_of(&self, path: &Path) -> Option<u64> {
        lock(&self.files).iter().find(|(_, f)| f.path == path).map(|(&fh, _)| fh)
    }

    /// The registered buffer that starts at `base`: its length and device.
    pub fn buffer(&self, base: u64) -> Option<(u64, Device)> {
        lock(&self.buffers).get(&base).map(|b| (b.len, b.device))
    }

    /// The base of a registered buffer that overlaps `len` bytes at `base`, if any.
    pub fn buffer_overlapping(&self, base: u64, len: u64) -> Option<u64> {
        overlapping(&lock(&self.buffers), base, len)
    }
}

fn overlapping(bufs: &BTreeMap<u64, BufEntry>, base: u64, len: u64) -> Option<u64> {
    let (&b, e) = bufs.range(..base.saturating_add(len.max(1))).next_back()?;
    (b.saturating_add(e.len.max(1)) > base).then_some(b)
}

impl Drop for Session {
    fn drop(&mut self) {
        let _restore = weightlift_cuda::ContextRestore::save(); // the caller's thread keeps its device
        self.close();
    }
}

/// An asynchronous read or write (`cuFileReadAsync`/`cuFileWriteAsync`): its byte count is available once the
/// stream it was ordered on has passed it (or, without a stream, once it finished).
#[derive(Debug)]
pub struct AsyncIo {
    result: Arc<Mutex<Option<Result<u64>>>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl AsyncIo {
    /// Whether the operation has finished.
    pub fn is_done(&self) -> bool {
        lock(&self.result).is_some()
    }

    /// Waits for the operation and returns its byte count (an error is returned once; later calls say so).
    pub fn wait(&mut self) -> Result<u64> {
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        lock(&self.result).take().unwrap_or_else(|| Err(Error::InvalidArgument("the result was already taken".into())))
    }
}

impl Session {
    /// Starts `op` on registered buffer `base` in the background. With `stream` (a stream of the buffer's device,
    /// such as PyTorch's current stream), the I/O starts after the work already queued on that stream and the
    /// stream's later work waits for it, as `cuFileReadAsync` orders it; the byte count is then available after the
    /// stream is synchronised.
    ///
    /// # Safety
    /// `stream`, if given, must be a live stream of the buffer's device that outlives the operation.
    #[allow(clippy::too_many_arguments)] // cuFile's own argument list, plus the operation
    pub unsafe fn submit_async(
        self: &Arc<Self>,
        op: Op,
        fh: u64,
        base: u64,
        size: u64,
        file_offset: u64,
        buf_offset: u64,
        stream: Option<weightlift_cuda::CUstream>,
    ) -> Result<AsyncIo> {
        let device = self.registered(base, buf_offset, size)?;
        let f = self.file(fh)?;
        if let (Some(s), Device::Cuda(n), None) = (stream, device, &f.cufile) {
            // SAFETY: per this function's contract.
            return unsafe { self.submit_staged(op, f, base + buf_offset, size, file_offset, n, s) };
        }
        let gate = match (stream, device) {
            (Some(s), Device::Cuda(n)) => {
                let gpu = self.engine.gpu(n)?;
                // SAFETY: per this function's contract.
                Some(unsafe { weightlift_cuda::gate::StreamGate::close(&gpu, s) }?)
            }
            (Some(_), _) => return Err(Error::InvalidArgument("a stream orders device buffers only".into())),
            (None, _) => None,
        };
        let result = Arc::new(Mutex::new(None));
        let (me, slot) = (Arc::clone(self), Arc::clone(&result));
        let worker = std::thread::Builder::new()
            .name("weightlift-async-io".into())
            .spawn(move || {
                let mut gate = gate;
                let r = match gate.as_ref().map(|g| g.wait_for_prior_work()) {
                    Some(Err(e)) => Err(e.into()),
                    _ => match op {
                        Op::Read => me.read(fh, base, size, file_offset, buf_offset),
                        Op::Write => me.write(fh, base, size, file_offset, buf_offset),
                    },
                };
                *lock(&slot) = Some(r);
                if let Some(g) = gate.as_mut() {
                    g.open();
                }
            })
            .map_err(|e| Error::Io(weightlift_io::IoError::Thread(e)))?;
        Ok(AsyncIo { result, worker: Some(worker) })
    }

    /// Stream-ordered I/O on device memory through the engine: the device copies are queued on `stream` now and
    /// the background thread only reads or writes pinned host staging (see `OrderedTransfer` for why).
    ///
    /// # Safety
    /// As for [`Session::submit_async`]; `addr..addr + size` is registered device memory of device `n`.
    #[allow(clippy::too_many_arguments)] // submit_async's arguments, resolved
    unsafe fn submit_staged(
        self: &Arc<Self>,
        op: Op,
        f: Arc<FileEntry>,
        addr: u64,
        size: u64,
        file_offset: u64,
        n: u32,
        stream: weightlift_cuda::CUstream,
    ) -> Result<AsyncIo> {
        use weightlift_cuda::gate::{Direction, OrderedTransfer};
        Self::check_alignment(&f, file_offset, size)?;
        let gpu = self.engine.gpu(n)?;
        // A read copies what the file holds from `file_offset` (as `pread`, fewer bytes at its end): the copy's
        // length is fixed now, when it is queued.
        let len = match op {
            Op::Read => {
                let file_len = std::fs::metadata(&f.path)
                    .map_err(|cause| Error::Io(weightlift_io::IoError::Open { path: f.path.clone(), cause }))?
                    .len();
                size.min(file_len.saturating_sub(file_offset))
            }
            Op::Write => size,
        };
        let direction = match op {
            Op::Read => Direction::ToDevice,
            Op::Write => Direction::FromDevice,
        };
        // SAFETY: per this function's contract.
        let mut t = unsafe { OrderedTransfer::queue(&gpu, stream, addr, len as usize, direction) }?;
        let result = Arc::new(Mutex::new(None));
        let (me, slot) = (Arc::clone(self), Arc::clone(&result));
        let worker = std::thread::Builder::new()
            .name("weightlift-async-io".into())
            .spawn(move || {
                let staging = t.staging().as_mut_ptr() as u64;
                let r = match op {
                    Op::Read => me.transfer(&f, Op::Read, staging, len, file_offset, Device::Cpu).inspect(|&got| {
                        // The file shrank since the copy was queued: the copy must not carry stale bytes.
                        t.staging()[got as usize..].fill(0);
                    }),
                    Op::Write => t
                        .wait_staged()
                        .map_err(Error::from)
                        .and_then(|()| me.transfer(&f, Op::Write, staging, len, file_offset, Device::Cpu)),
                };
                *lock(&slot) = Some(r);
                t.open();
                drop(t); // waits until the stream's copy no longer needs the staging buffer
            })
            .map_err(|e| Error::Io(weightlift_io::IoError::Thread(e)))?;
        Ok(AsyncIo { result, worker: Some(worker) })
    }
}
