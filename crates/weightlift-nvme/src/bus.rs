//! What host code needs from whatever the controller sits behind: its register page (BAR0) and memory the
//! controller can reach by DMA. The software controller and VFIO each implement [`Bus`]; bring-up, the CPU
//! submitter and the GPU path are written once against it.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use memmap2::MmapMut;

use crate::error::NvmeError;
use crate::spec::PAGE_SIZE;

/// How a register window is backed, which decides how it is accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmioKind {
    /// A device's BAR mapped uncached: volatile loads and stores, never merged or split.
    Device,
    /// Ordinary memory that a software controller polls from another thread: atomic loads and stores.
    Memory,
}

/// A register window: 32-bit registers at 4-byte aligned offsets, bounds-checked.
pub struct Mmio {
    base: NonNull<u8>,
    len: usize,
    kind: MmioKind,
}

// SAFETY: the window is plain addresses; every access is a volatile or atomic 32-bit operation, which any thread
// may issue.
unsafe impl Send for Mmio {}
// SAFETY: as above; no access hands out references into the window.
unsafe impl Sync for Mmio {}

impl fmt::Debug for Mmio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mmio({:?}, {:p}, {} bytes)", self.kind, self.base, self.len)
    }
}

impl Mmio {
    /// # Safety
    /// `base` must be 4-byte aligned and valid for reads and writes of `len` bytes for as long as the `Mmio` lives.
    /// For [`MmioKind::Memory`], every other access to the window (by other threads) must be atomic.
    pub unsafe fn new(base: NonNull<u8>, len: usize, kind: MmioKind) -> Mmio {
        Mmio { base, len, kind }
    }

    /// Whether the window is a device's registers or plain memory standing in for them.
    pub fn kind(&self) -> MmioKind {
        self.kind
    }

    /// The window's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The window's address in this process (for mapping it into a GPU's address space).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    fn at(&self, offset: usize) -> Result<*mut u32, NvmeError> {
        if !offset.is_multiple_of(4) || offset.checked_add(4).is_none_or(|end| end > self.len) {
            return Err(NvmeError::Register { offset, len: self.len });
        }
        // SAFETY: `offset + 4 <= len`, so the pointer stays inside the window.
        Ok(unsafe { self.base.as_ptr().add(offset) }.cast())
    }

    /// Reads the 32-bit register at byte `offset` (volatile for a device, an acquiring load for memory);
    /// [`NvmeError::Register`] if it is misaligned or outside the window.
    pub fn read32(&self, offset: usize) -> Result<u32, NvmeError> {
        let p = self.at(offset)?;
        Ok(match self.kind {
            // SAFETY: `p` is in bounds and 4-byte aligned (base and offset are); the window is valid per `new`.
            MmioKind::Device => unsafe { p.read_volatile() },
            // SAFETY: as above, and all concurrent accesses to the window are atomic per `new`.
            MmioKind::Memory => unsafe { AtomicU32::from_ptr(p) }.load(Ordering::Acquire),
        })
    }

    /// Writes a register after every earlier store of this thread (queue entries, PRP lists) is ordered before it,
    /// so a doorbell never overtakes the entries it announces.
    pub fn write32(&self, offset: usize, value: u32) -> Result<(), NvmeError> {
        let p = self.at(offset)?;
        fence(Ordering::SeqCst);
        match self.kind {
            // SAFETY: in bounds and aligned; valid per `new`.
            MmioKind::Device => unsafe { p.write_volatile(value) },
            // SAFETY: in bounds and aligned; other accesses are atomic per `new`.
            MmioKind::Memory => unsafe { AtomicU32::from_ptr(p) }.store(value, Ordering::Release),
        }
        Ok(())
    }

    /// A 64-bit register as two 32-bit accesses, low dword first (the order the spec asks hosts to use).
    pub fn read64(&self, offset: usize) -> Result<u64, NvmeError> {
        let lo = self.read32(offset)?;
        let hi = self.read32(offset + 4)?;
        Ok(u64::from(lo) | (u64::from(hi) << 32))
    }

    /// A 64-bit register as two 32-bit writes, low dword first.
    pub fn write64(&self, offset: usize, value: u64) -> Result<(), NvmeError> {
        self.write32(offset, value as u32)?;
        self.write32(offset + 4, (value >> 32) as u32)
    }
}

/// A device's access to a range of memory; dropping it revokes the access (an IOMMU unmap). Dropped before the
/// memory is freed.
pub trait DmaMapping: Send + Sync + fmt::Debug {}

/// Device memory (a GPU's) that a controller can be pointed at, standing in for peer-to-peer DMA: the software
/// controller calls these to move data where a real drive would write over PCIe.
pub trait DeviceDma: Send + Sync + fmt::Debug {
    /// Copies `data` to device address `addr`, complete when this returns.
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), String>;
    /// Copies from device address `addr` into `out`.
    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), String>;
}

/// Zeroed, page-aligned host memory that the controller reaches at `bus_addr`. The device may read or write it at
/// any time it holds a command or queue pointing there, so it is never handed out as a Rust reference except
/// through the `unsafe` accessors, whose callers know no transfer is in flight.
pub struct DmaBuffer {
    // Declared first so the device loses access before the memory goes away (and `Drop` says so explicitly).
    mapping: Option<Box<dyn DmaMapping>>,
    mem: MmapMut,
    len: usize,
    bus: u64,
}

impl fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DmaBuffer({} bytes at bus {:#x})", self.len, self.bus)
    }
}

impl DmaBuffer {
    /// Allocates `len` bytes (rounded up to whole pages) and lets `map` make them reachable by the device: it gets
    /// the memory's address and length and returns the bus address and the mapping whose drop revokes access.
    pub fn alloc(
        len: usize,
        map: impl FnOnce(*mut u8, usize) -> Result<(u64, Box<dyn DmaMapping>), NvmeError>,
    ) -> Result<DmaBuffer, NvmeError> {
        let rounded = len
            .max(1)
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or_else(|| NvmeError::Dma { bytes: len as u64, reason: "size overflows".into() })?;
        let mut mem = MmapMut::map_anon(rounded)
            .map_err(|e| NvmeError::Dma { bytes: rounded as u64, reason: format!("mmap: {e}") })?;
        let (bus, mapping) = map(mem.as_mut_ptr(), rounded)?;
        if bus % PAGE_SIZE as u64 != 0 {
            return Err(NvmeError::Dma {
                bytes: rounded as u64,
                reason: format!("bus address {bus:#x} not page aligned"),
            });
        }
        Ok(DmaBuffer { mapping: Some(mapping), mem, len: rounded, bus })
    }

    /// The buffer's length in bytes (the size asked for, rounded up to whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address the device uses for the buffer's first byte (page aligned): a bus (IOVA) address, not this
    /// process's.
    pub fn bus_addr(&self) -> u64 {
        self.bus
    }

    /// The memory's address in this process (for registering it with CUDA).
    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr().cast_mut()
    }

    fn range(&self, offset: usize, len: usize, align: usize) -> Result<*mut u8, NvmeError> {
        if !offset.is_multiple_of(align) || offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(NvmeError::invalid(
                "DMA buffer access",
                format!("{len} bytes at offset {offset} of a {}-byte buffer (alignment {align})", self.len),
            ));
        }
        // SAFETY: `offset + len <= self.len`, inside the mapping.
        Ok(unsafe { self.as_ptr().add(offset) })
    }

    /// Stores a dword the device will read (a queue entry's), atomically so that a device polling it (the
    /// software controller's thread) never races with a plain store.
    pub fn store_u32(&self, offset: usize, value: u32) -> Result<(), NvmeError> {
        let p = self.range(offset, 4, 4)?;
        // SAFETY: in bounds and 4-byte aligned (the mapping is page aligned); the memory lives as long as `self`.
        unsafe { AtomicU32::from_ptr(p.cast()) }.store(value, Ordering::Relaxed);
        Ok(())
    }

    /// Loads a dword the device writes (a completion's), with acquire ordering: what the device wrote before it is
    /// visible after.
    pub fn load_u32(&self, offset: usize) -> Result<u32, NvmeError> {
        let p = self.range(offset, 4, 4)?;
        // SAFETY: as for `store_u32`.
        Ok(unsafe { AtomicU32::from_ptr(p.cast()) }.load(Ordering::Acquire))
    }

    /// Stores a qword the device will read (a PRP list entry).
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<(), NvmeError> {
        let p = self.range(offset, 8, 8)?;
        // SAFETY: in bounds and 8-byte aligned; the memory lives as long as `self`.
        unsafe { AtomicU64::from_ptr(p.cast()) }.store(value, Ordering::Relaxed);
        Ok(())
    }

    /// Copies `data` into the buffer at `offset`.
    ///
    /// # Safety
    /// No device transfer may be reading or writing the range while this runs.
    pub unsafe fn write(&self, offset: usize, data: &[u8]) -> Result<(), NvmeError> {
        let p = self.range(offset, data.len(), 1)?;
        // SAFETY: the range is in bounds; per the contract nothing else accesses it now.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    /// The bytes at `offset..offset + len`.
    ///
    /// # Safety
    /// No device transfer may write the range while the slice lives.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> Result<&[u8], NvmeError> {
        let p = self.range(offset, len, 1)?;
        // SAFETY: in bounds, initialised (zeroed at allocation, then written); per the contract not written while
        // the slice lives.
        Ok(unsafe { std::slice::from_raw_parts(p, len) })
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        // Revoke the device's access first; `mem` is unmapped after.
        self.mapping.take();
    }
}

/// The register window and DMA memory of one controller.
pub trait Bus: Send + Sync + fmt::Debug {
    /// BAR0.
    fn registers(&self) -> &Mmio;
    /// Host memory the controller can reach (queues, PRP lists, data).
    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer, NvmeError>;
    /// Makes `len` bytes of device memory at `addr` reachable by the controller at bus address `addr`, moved by
    /// `dma`. Backends without peer-to-peer DMA say so.
    fn map_device_memory(&self, addr: u64, len: u64, dma: Arc<dyn DeviceDma>)
    -> Result<Box<dyn DmaMapping>, NvmeError>;
    /// One line saying what this is ("software NVMe over /tmp/x", "vfio 0000:01:00.0").
    fn describe(&self) -> String;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct NoMapping;
    impl DmaMapping for NoMapping {}

    #[test]
    fn accesses_are_bounds_checked() {
        let b = DmaBuffer::alloc(10, |p, _| Ok((p as u64, Box::new(NoMapping)))).unwrap();
        assert_eq!(b.len(), 4096);
        b.store_u32(4092, 7).unwrap();
        assert_eq!(b.load_u32(4092).unwrap(), 7);
        assert!(b.store_u32(4094, 1).is_err());
        assert!(b.store_u32(4096, 1).is_err());
        assert!(b.store_u64(4, 1).is_err());
        // SAFETY: no device has this buffer.
        assert!(unsafe { b.write(4090, &[0; 7]) }.is_err());
        let mut regs = vec![0u32; 4];
        // SAFETY: the vector outlives the window and only this thread touches it.
        let m = unsafe { Mmio::new(NonNull::new(regs.as_mut_ptr().cast()).unwrap(), 16, MmioKind::Memory) };
        m.write64(8, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(m.read32(8).unwrap(), 0x5566_7788);
        assert_eq!(m.read64(8).unwrap(), 0x1122_3344_5566_7788);
        assert!(m.read32(16).is_err() && m.read32(2).is_err());
        assert_eq!(m.read32(12).unwrap(), 0x1122_3344);
    }
}
