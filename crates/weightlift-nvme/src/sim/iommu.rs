//! The software controller's view of memory: like an IOMMU, it reaches only windows registered for DMA, so a bad
//! PRP or queue address from the host is a DMA error, never a wild pointer. Host windows are addressed by their
//! virtual address (the "bus address"); device windows by their device address, moved through a [`DeviceDma`] hook.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::bus::{DeviceDma, DmaMapping};
use crate::error::NvmeError;

#[derive(Debug)]
enum Window {
    Host { len: u64 },
    Device { len: u64, dma: Arc<dyn DeviceDma> },
}

impl Window {
    fn len(&self) -> u64 {
        match self {
            Window::Host { len } | Window::Device { len, .. } => *len,
        }
    }
}

/// One piece of a transfer, inside one window.
pub(crate) enum Region<'a> {
    /// Host memory at this address, valid for the piece's length while the callback runs.
    Host(*mut u8),
    /// Device memory at this device address.
    Device(&'a Arc<dyn DeviceDma>, u64),
}

#[derive(Debug, Default)]
pub(crate) struct Iommu {
    windows: RwLock<BTreeMap<u64, Window>>,
}

#[derive(Debug)]
struct Mapping {
    iommu: Arc<Iommu>,
    addr: u64,
}

impl DmaMapping for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Taking the write lock waits for any access in progress: after this the controller cannot reach the memory.
        self.iommu.windows.write().unwrap_or_else(|p| p.into_inner()).remove(&self.addr);
    }
}

impl Iommu {
    fn map(self: &Arc<Self>, addr: u64, window: Window) -> Result<Box<dyn DmaMapping>, NvmeError> {
        let len = window.len();
        let end = addr.checked_add(len).filter(|_| len > 0 && addr > 0);
        let Some(end) = end else {
            return Err(NvmeError::Dma { bytes: len, reason: format!("cannot map {len} bytes at {addr:#x}") });
        };
        let mut w = self.windows.write().unwrap_or_else(|p| p.into_inner());
        let before = w.range(..end).next_back().filter(|(a, win)| **a + win.len() > addr);
        if let Some((a, win)) = before {
            return Err(NvmeError::Dma {
                bytes: len,
                reason: format!("{addr:#x}..{end:#x} overlaps the mapped window {a:#x}+{}", win.len()),
            });
        }
        w.insert(addr, window);
        Ok(Box::new(Mapping { iommu: self.clone(), addr }))
    }

    /// Registers host memory at `addr` (its virtual address, also its bus address).
    pub fn map_host(self: &Arc<Self>, addr: u64, len: u64) -> Result<Box<dyn DmaMapping>, NvmeError> {
        self.map(addr, Window::Host { len })
    }

    pub fn map_device(
        self: &Arc<Self>,
        addr: u64,
        len: u64,
        dma: Arc<dyn DeviceDma>,
    ) -> Result<Box<dyn DmaMapping>, NvmeError> {
        self.map(addr, Window::Device { len, dma })
    }

    /// Whether `addr..addr + len` lies in one host window.
    pub fn host_contains(&self, addr: u64, len: u64) -> bool {
        let w = self.windows.read().unwrap_or_else(|p| p.into_inner());
        let hit = w.range(..=addr).next_back();
        matches!(hit, Some((&a, Window::Host { len: wl })) if addr.checked_add(len).is_some_and(|e| e <= a + wl))
    }

    /// Runs `f` on the piece of `addr..addr + len` that lies in the window containing `addr` (at most `len` bytes),
    /// holding the window for the call; returns `f`'s result and the piece's length, or `None` when `addr` is not
    /// mapped.
    pub fn access<R>(&self, addr: u64, len: u64, f: impl FnOnce(Region<'_>, u64) -> R) -> Option<(R, u64)> {
        let w = self.windows.read().unwrap_or_else(|p| p.into_inner());
        let (&start, win) = w.range(..=addr).next_back()?;
        let left = (start + win.len()).checked_sub(addr).filter(|&l| l > 0)?;
        let piece = left.min(len);
        let r = match win {
            Window::Host { .. } => f(Region::Host(addr as *mut u8), piece),
            Window::Device { dma, .. } => f(Region::Device(dma, addr), piece),
        };
        Some((r, piece))
    }

    /// An aligned dword of host memory, loaded atomically (queue entries the host or a GPU wrote).
    pub fn load_u32(&self, addr: u64) -> Option<u32> {
        if !addr.is_multiple_of(4) {
            return None;
        }
        let (v, _) = self.access(addr, 4, |r, n| match r {
            // SAFETY: the piece is the whole aligned dword (n == 4) inside a window that stays mapped during the
            // call.
            Region::Host(p) if n == 4 => Some(unsafe { AtomicU32::from_ptr(p.cast()) }.load(Ordering::Acquire)),
            _ => None,
        })?;
        v
    }

    /// An aligned qword of host memory (a PRP list entry).
    pub fn load_u64(&self, addr: u64) -> Option<u64> {
        if !addr.is_multiple_of(8) {
            return None;
        }
        let (v, _) = self.access(addr, 8, |r, n| match r {
            // SAFETY: the piece is the whole aligned qword (n == 8), inside a window that stays mapped during the
            // call.
            Region::Host(p) if n == 8 => Some(unsafe { AtomicU64::from_ptr(p.cast()) }.load(Ordering::Acquire)),
            _ => None,
        })?;
        v
    }

    /// Stores an aligned dword of host memory (completion entries) with the given ordering.
    pub fn store_u32(&self, addr: u64, value: u32, order: Ordering) -> bool {
        if !addr.is_multiple_of(4) {
            return false;
        }
        let r = self.access(addr, 4, |r, n| match r {
            Region::Host(p) if n == 4 => {
                // SAFETY: the piece is the whole aligned dword inside a window that stays mapped during the call.
                unsafe { AtomicU32::from_ptr(p.cast()) }.store(value, order);
                true
            }
            _ => false,
        });
        matches!(r, Some((true, _)))
    }

    /// Copies `data` into memory at `addr` (possibly across several windows).
    pub fn write(&self, mut addr: u64, mut data: &[u8]) -> Result<(), String> {
        while !data.is_empty() {
            let (r, n) = self
                .access(addr, data.len() as u64, |r, n| {
                    let (now, _) = data.split_at(n as usize);
                    match r {
                        Region::Host(p) => {
                            // SAFETY: `n` bytes at `p` lie in a mapped host window held for the call; the host gave
                            // this memory to the command being executed, so nothing else writes it.
                            unsafe { std::ptr::copy_nonoverlapping(now.as_ptr(), p, now.len()) };
                            Ok(())
                        }
                        Region::Device(dma, a) => dma.write(a, now),
                    }
                })
                .ok_or_else(|| format!("DMA to unmapped address {addr:#x}"))?;
            r?;
            addr += n;
            data = &data[n as usize..];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mapped_memory_is_reached() {
        let iommu = Arc::new(Iommu::default());
        let mut mem = vec![0u64; 1024];
        let addr = mem.as_mut_ptr() as u64;
        let g = iommu.map_host(addr, 8192).unwrap();
        assert!(iommu.map_host(addr + 4096, 16).is_err(), "overlap");
        assert!(iommu.store_u32(addr + 8, 5, Ordering::Release));
        assert_eq!(iommu.load_u32(addr + 8), Some(5));
        assert_eq!(iommu.load_u32(addr + 8190), None, "crosses the end");
        assert_eq!(iommu.load_u32(addr + 8192), None);
        assert!(iommu.host_contains(addr, 8192) && !iommu.host_contains(addr, 8193));
        iommu.write(addr + 16, &[1, 2, 3]).unwrap();
        assert!(iommu.write(addr + 8190, &[1, 2, 3]).is_err());
        drop(g);
        assert_eq!(iommu.load_u32(addr + 8), None, "unmapped");
        assert_eq!(mem[1], 5);
        assert_eq!(mem[2] & 0xFF_FFFF, 0x03_0201);
    }
}
