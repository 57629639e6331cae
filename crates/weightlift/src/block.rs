//! Logical-block addressing: a block device (or a regular file standing for one, e.g. a disk image) read by LBA
//! and block count into host or device memory, and a region table naming LBA ranges by "kind" (the layout a
//! storage-level model store keeps: weights here, a KV cache there) with reads by kind, index and length.
//!
//! Reads go through the engine like any other (io_uring lanes and the pinned ring, O_DIRECT where the device
//! allows it); nothing here needs a raw NVMe queue.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use weightlift_io::OpenFile;

use crate::engine::Engine;
use crate::engine::read::{ByteRange, Dests, ReadRequest, Sources};
use crate::error::{Error, Result};
use crate::path::LoadOpts;
use crate::report::Report;
use crate::tensor::RawDest;

/// Logical block size assumed for a regular file when the caller names none: the 512-byte sector LBAs count in.
pub const FILE_BLOCK_SIZE: u32 = 512;

/// A device (or file) addressed in logical blocks.
#[derive(Debug, Clone)]
pub struct BlockDevice {
    engine: Arc<Engine>,
    file: Arc<OpenFile>,
    block_size: u32,
    blocks: u64,
    is_block_device: bool,
}

impl BlockDevice {
    /// Opens `path`: a block device, whose logical block size the kernel reports (`block_size`, if given, must be
    /// a multiple of it), or a regular file, addressed in `block_size`-byte blocks (512 by default). A trailing
    /// partial block of a file is not addressable. FIFOs, sockets and character devices are refused.
    pub fn open(engine: Arc<Engine>, path: &Path, block_size: Option<u32>) -> Result<BlockDevice> {
        let file = engine.open_device(path)?;
        // `open_device` opens local paths only.
        let Some(local) = file.local() else {
            return Err(Error::InvalidArgument(format!(
                "{}: reads by LBA need a local file or device",
                path.display()
            )));
        };
        let meta = local
            .metadata()
            .map_err(|cause| Error::Io(weightlift_io::IoError::Open { path: path.to_path_buf(), cause }))?;
        let is_block_device = std::os::unix::fs::FileTypeExt::is_block_device(&meta.file_type());
        let native = if is_block_device {
            weightlift_io::file::logical_block_size(local).map_err(|e| {
                Error::InvalidArgument(format!("{}: cannot read the logical block size: {e}", path.display()))
            })?
        } else {
            FILE_BLOCK_SIZE
        };
        let block_size = block_size.unwrap_or(native);
        if block_size == 0 || !block_size.is_power_of_two() || block_size > 1 << 20 {
            return Err(Error::InvalidArgument(format!(
                "{}: block size {block_size} is not a power of two between 1 and 1 MiB",
                path.display()
            )));
        }
        if is_block_device && !block_size.is_multiple_of(native) {
            return Err(Error::InvalidArgument(format!(
                "{}: block size {block_size} is not a multiple of the device's logical block size {native}",
                path.display()
            )));
        }
        let blocks = file.len / u64::from(block_size);
        Ok(BlockDevice { engine, file, block_size, blocks, is_block_device })
    }

    /// The device or file read by block.
    pub fn path(&self) -> &Path {
        &self.file.path
    }

    /// Bytes per logical block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Addressable blocks.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Whether the path is a block device (rather than a file standing for one).
    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }

    /// The engine whose lanes read the blocks.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The byte range of `count` blocks from `lba`, or an error naming the device and the range.
    pub fn byte_range(&self, lba: u64, count: u64) -> Result<(u64, u64)> {
        match lba.checked_add(count) {
            Some(end) if end <= self.blocks => {
                Ok((lba * u64::from(self.block_size), count * u64::from(self.block_size)))
            }
            _ => Err(Error::LbaOutOfRange { path: self.file.path.clone(), lba, count, blocks: self.blocks }),
        }
    }

    /// Reads `count` blocks from `lba` into `dest`; returns the bytes read (`count` × block size).
    ///
    /// # Safety
    /// `dest` must be valid for writes of `count` × block size bytes (device memory of the named device for
    /// `Device`) and not be accessed by anything else until this returns.
    pub unsafe fn read(&self, lba: u64, count: u64, dest: RawDest) -> Result<(u64, Report)> {
        // SAFETY: the same contract.
        unsafe { self.read_with(lba, count, dest, &LoadOpts::default()) }
    }

    /// [`BlockDevice::read`] with load options (cancellation, progress, injected faults).
    ///
    /// # Safety
    /// As for [`BlockDevice::read`].
    pub unsafe fn read_with(&self, lba: u64, count: u64, dest: RawDest, opts: &LoadOpts<'_>) -> Result<(u64, Report)> {
        let (offset, len) = self.byte_range(lba, count)?;
        let files = [self.file.clone()];
        let (ranges, dests) = ([ByteRange::new(0, offset, len, 0)], [(dest, len)]);
        let req = ReadRequest::new(Sources::Open(&files), &ranges, Dests::Memory(&dests)).with_opts(*opts);
        // SAFETY: per this function's contract, `dest` holds `len` writable bytes.
        let report = unsafe { self.engine.read(&req) }?;
        Ok((len, report))
    }
}

/// An LBA range: `count` blocks from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbaRange {
    /// First block.
    pub start: u64,
    /// Blocks in the range.
    pub count: u64,
}

/// Named LBA ranges ("kinds") of one device, read by kind, block index within the range, and block count.
#[derive(Debug, Clone)]
pub struct RegionTable {
    device: BlockDevice,
    kinds: BTreeMap<String, LbaRange>,
}

impl RegionTable {
    /// An empty table over `device`.
    pub fn new(device: BlockDevice) -> RegionTable {
        RegionTable { device, kinds: BTreeMap::new() }
    }

    /// The device the ranges lie on.
    pub fn device(&self) -> &BlockDevice {
        &self.device
    }

    /// Names `count` blocks from `start` as `kind` (replacing an earlier range of that name). The range must lie
    /// on the device.
    pub fn insert(&mut self, kind: &str, start: u64, count: u64) -> Result<()> {
        self.device.byte_range(start, count)?;
        self.kinds.insert(kind.to_owned(), LbaRange { start, count });
        Ok(())
    }

    /// Forgets `kind`; returns its range.
    pub fn remove(&mut self, kind: &str) -> Option<LbaRange> {
        self.kinds.remove(kind)
    }

    /// The range named `kind`, if any.
    pub fn get(&self, kind: &str) -> Option<LbaRange> {
        self.kinds.get(kind).copied()
    }

    /// Every kind and its range, sorted by name.
    pub fn kinds(&self) -> impl Iterator<Item = (&str, LbaRange)> {
        self.kinds.iter().map(|(k, r)| (k.as_str(), *r))
    }

    /// The range of `kind`, or an error listing the kinds there are.
    pub fn range(&self, kind: &str) -> Result<LbaRange> {
        self.get(kind)
            .ok_or_else(|| Error::UnknownKind { kind: kind.to_owned(), known: self.kinds.keys().cloned().collect() })
    }

    /// The device LBA of block `index` of `kind`, checking that `count` blocks from there stay inside the kind.
    pub fn resolve(&self, kind: &str, index: u64, count: u64) -> Result<u64> {
        let r = self.range(kind)?;
        match index.checked_add(count) {
            Some(end) if end <= r.count => Ok(r.start + index),
            _ => Err(Error::InvalidArgument(format!(
                "blocks {index}..{} of kind {kind:?} lie outside its {} blocks (LBA {}..{}) on {}",
                index.saturating_add(count),
                r.count,
                r.start,
                r.start + r.count,
                self.device.path().display()
            ))),
        }
    }

    /// Reads `count` blocks from block `index` of `kind` into `dest`; returns the bytes read.
    ///
    /// # Safety
    /// As for [`BlockDevice::read`].
    pub unsafe fn read_kind(&self, kind: &str, index: u64, count: u64, dest: RawDest) -> Result<(u64, Report)> {
        let lba = self.resolve(kind, index, count)?;
        // SAFETY: the same contract.
        unsafe { self.device.read(lba, count, dest) }
    }
}
