//! Raw VFIO: the ioctl numbers and structures of `<linux/vfio.h>` that weightlift uses, and one checked ioctl call.

use std::os::fd::{AsRawFd, BorrowedFd};

/// `_IO(';', 100 + n)`: VFIO ioctls encode neither direction nor size.
const fn vfio_io(n: u64) -> u64 {
    ((b';' as u64) << 8) | (100 + n)
}

pub const VFIO_API_VERSION: i32 = 0;
pub const VFIO_TYPE1_IOMMU: u64 = 1;
pub const VFIO_TYPE1V2_IOMMU: u64 = 3;

pub const VFIO_GET_API_VERSION: u64 = vfio_io(0);
pub const VFIO_CHECK_EXTENSION: u64 = vfio_io(1);
pub const VFIO_SET_IOMMU: u64 = vfio_io(2);
pub const VFIO_GROUP_GET_STATUS: u64 = vfio_io(3);
pub const VFIO_GROUP_SET_CONTAINER: u64 = vfio_io(4);
pub const VFIO_GROUP_GET_DEVICE_FD: u64 = vfio_io(6);
pub const VFIO_DEVICE_GET_INFO: u64 = vfio_io(7);
pub const VFIO_DEVICE_GET_REGION_INFO: u64 = vfio_io(8);
pub const VFIO_IOMMU_MAP_DMA: u64 = vfio_io(13);
pub const VFIO_IOMMU_UNMAP_DMA: u64 = vfio_io(14);

pub const VFIO_GROUP_FLAGS_VIABLE: u32 = 1;
pub const VFIO_DEVICE_FLAGS_PCI: u32 = 1 << 1;
pub const VFIO_REGION_INFO_FLAG_MMAP: u32 = 1 << 2;
pub const VFIO_DMA_MAP_FLAG_READ: u32 = 1;
pub const VFIO_DMA_MAP_FLAG_WRITE: u32 = 1 << 1;

pub const VFIO_PCI_BAR0_REGION_INDEX: u32 = 0;
pub const VFIO_PCI_CONFIG_REGION_INDEX: u32 = 7;

#[repr(C)]
#[derive(Debug, Default)]
pub struct GroupStatus {
    pub argsz: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Debug, Default)]
pub struct DeviceInfo {
    pub argsz: u32,
    pub flags: u32,
    pub num_regions: u32,
    pub num_irqs: u32,
    pub cap_offset: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Debug, Default)]
pub struct RegionInfo {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub cap_offset: u32,
    pub size: u64,
    pub offset: u64,
}

#[repr(C)]
#[derive(Debug, Default)]
pub struct DmaMap {
    pub argsz: u32,
    pub flags: u32,
    pub vaddr: u64,
    pub iova: u64,
    pub size: u64,
}

#[repr(C)]
#[derive(Debug, Default)]
pub struct DmaUnmap {
    pub argsz: u32,
    pub flags: u32,
    pub iova: u64,
    pub size: u64,
}

/// `ioctl(fd, request, arg)`, with the result checked: the return value, or the OS error.
///
/// # Safety
/// `arg` must be what `request` expects: a pointer to a live structure of its type (with `argsz` set), a pointer
/// to a NUL-terminated string, a pointer to an fd, or a plain integer.
pub unsafe fn ioctl(fd: BorrowedFd<'_>, request: u64, arg: usize) -> std::io::Result<i32> {
    // SAFETY: per this function's contract; the fd is open for the borrow's lifetime.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg) };
    if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(r) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_linux() {
        // Values of <linux/vfio.h> on Linux.
        assert_eq!(VFIO_GET_API_VERSION, 0x3B64);
        assert_eq!(VFIO_SET_IOMMU, 0x3B66);
        assert_eq!(VFIO_GROUP_SET_CONTAINER, 0x3B68);
        assert_eq!(VFIO_GROUP_GET_DEVICE_FD, 0x3B6A);
        assert_eq!(VFIO_DEVICE_GET_REGION_INFO, 0x3B6C);
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3B71);
        assert_eq!(VFIO_IOMMU_UNMAP_DMA, 0x3B72);
        assert_eq!(std::mem::size_of::<RegionInfo>(), 32);
        assert_eq!(std::mem::size_of::<DmaMap>(), 32);
        assert_eq!(std::mem::size_of::<DmaUnmap>(), 24);
    }
}
