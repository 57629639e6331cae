//! Real NVMe drives through VFIO: the drive is bound to `vfio-pci`, its BAR0 is mapped into this process, and DMA
//! memory is mapped into its IOMMU domain at IOVA = virtual address. Bring-up and the queues then run unchanged
//! over [`VfioBus`]. docs/nvme.md has the steps to prepare a machine.

mod sys;

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::bus::{Bus, DeviceDma, DmaBuffer, DmaMapping, Mmio, MmioKind};
use crate::error::NvmeError;

/// PCI class code of an NVM Express controller (mass storage, NVM, NVMe interface).
const NVME_CLASS: u32 = 0x010802;
const SYSFS_PCI: &str = "/sys/bus/pci/devices";

/// An NVMe controller on the PCI bus, as sysfs shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciNvme {
    /// PCI address, e.g. `0000:01:00.0`.
    pub address: String,
    /// The driver bound to it (`nvme`, `vfio-pci`), if any.
    pub driver: Option<String>,
    /// Its IOMMU group, if the IOMMU is on.
    pub iommu_group: Option<u32>,
}

/// The NVMe controllers on the PCI bus (empty when sysfs shows none or cannot be read).
pub fn nvme_controllers() -> Vec<PciNvme> {
    let Ok(entries) = std::fs::read_dir(SYSFS_PCI) else { return Vec::new() };
    let mut out: Vec<PciNvme> = entries
        .flatten()
        .filter_map(|e| {
            let dir = e.path();
            let class = std::fs::read_to_string(dir.join("class")).ok()?;
            let class = u32::from_str_radix(class.trim().trim_start_matches("0x"), 16).ok()?;
            if class != NVME_CLASS {
                return None;
            }
            let link_name = |l: &str| {
                std::fs::read_link(dir.join(l))
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            };
            Some(PciNvme {
                address: e.file_name().to_string_lossy().into_owned(),
                driver: link_name("driver"),
                iommu_group: link_name("iommu_group").and_then(|g| g.parse().ok()),
            })
        })
        .collect();
    out.sort_by(|a, b| a.address.cmp(&b.address));
    out
}

fn how_to_bind(address: &str) -> String {
    format!(
        "bind one with: modprobe vfio-pci; echo {address} > /sys/bus/pci/devices/{address}/driver/unbind; \
         echo vfio-pci > /sys/bus/pci/devices/{address}/driver_override; echo {address} > /sys/bus/pci/drivers_probe \
         (the IOMMU must be on: intel_iommu=on or amd_iommu=on; the drive's data is no longer reachable through \
         /dev/nvme*; see docs/nvme.md)"
    )
}

fn no_device(list: &[PciNvme]) -> NvmeError {
    let found = if list.is_empty() {
        " (no NVMe controller is present on the PCI bus)".to_string()
    } else {
        let each: Vec<String> = list
            .iter()
            .map(|c| format!("{} bound to {}", c.address, c.driver.as_deref().unwrap_or("no driver")))
            .collect();
        format!(" (NVMe controllers present: {})", each.join(", "))
    };
    let address = list.first().map_or("<pci address, e.g. 0000:01:00.0>", |c| c.address.as_str());
    NvmeError::NoVfioDevice { found, how: how_to_bind(address) }
}

fn step(step: &'static str) -> impl FnOnce(std::io::Error) -> NvmeError {
    move |e| NvmeError::Vfio { step, detail: e.to_string() }
}

fn open_rw(path: &Path, what: &'static str) -> Result<File, NvmeError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| NvmeError::Vfio { step: what, detail: format!("{}: {e}", path.display()) })
}

/// DMA memory mapped into the container's IOMMU domain; unmapped on drop.
#[derive(Debug)]
struct VfioDma {
    container: Arc<OwnedFd>,
    iova: u64,
    size: u64,
}

impl DmaMapping for VfioDma {}

impl Drop for VfioDma {
    fn drop(&mut self) {
        let mut unmap = sys::DmaUnmap {
            argsz: std::mem::size_of::<sys::DmaUnmap>() as u32,
            flags: 0,
            iova: self.iova,
            size: self.size,
        };
        // SAFETY: VFIO_IOMMU_UNMAP_DMA takes a `vfio_iommu_type1_dma_unmap` with argsz set, which lives across the
        // call.
        let r = unsafe {
            sys::ioctl(self.container.as_fd(), sys::VFIO_IOMMU_UNMAP_DMA, &mut unmap as *mut sys::DmaUnmap as usize)
        };
        if let Err(e) = r {
            tracing::warn!("vfio: unmapping {} bytes at iova {:#x}: {e}", self.size, self.iova);
        }
    }
}

/// An NVMe controller bound to vfio-pci: BAR0 mapped, bus mastering on, DMA through its IOMMU group's container.
#[derive(Debug)]
pub struct VfioBus {
    address: String,
    bar0: Mmio,
    bar0_len: usize,
    // Dropped after BAR0 is unmapped (in `Drop`): device, then group, then container.
    _device: OwnedFd,
    _group: OwnedFd,
    container: Arc<OwnedFd>,
}

impl VfioBus {
    /// Opens the NVMe controller at PCI `address`, or the first one bound to vfio-pci when `None`.
    pub fn open(address: Option<&str>) -> Result<VfioBus, NvmeError> {
        let list = nvme_controllers();
        let dev = match address {
            Some(a) => {
                let Some(d) = list.iter().find(|c| c.address == a) else {
                    return Err(NvmeError::Vfio {
                        step: "find the controller",
                        detail: format!(
                            "no NVMe controller at PCI address {a} ({SYSFS_PCI}/{a} missing or not class 010802)"
                        ),
                    });
                };
                if d.driver.as_deref() != Some("vfio-pci") {
                    return Err(no_device(&list));
                }
                d.clone()
            }
            None => list
                .iter()
                .find(|c| c.driver.as_deref() == Some("vfio-pci"))
                .cloned()
                .ok_or_else(|| no_device(&list))?,
        };
        let group = dev.iommu_group.ok_or_else(|| NvmeError::Vfio {
            step: "find the IOMMU group",
            detail: format!(
                "{} has no IOMMU group: turn the IOMMU on (intel_iommu=on or amd_iommu=on on the kernel command line)",
                dev.address
            ),
        })?;

        let container: OwnedFd = open_rw(Path::new("/dev/vfio/vfio"), "open the container")?.into();
        // SAFETY: VFIO_GET_API_VERSION takes no argument.
        let version =
            unsafe { sys::ioctl(container.as_fd(), sys::VFIO_GET_API_VERSION, 0) }.map_err(step("get API version"))?;
        if version != sys::VFIO_API_VERSION {
            return Err(NvmeError::Vfio {
                step: "get API version",
                detail: format!("unknown VFIO API version {version}"),
            });
        }
        let iommu = [sys::VFIO_TYPE1V2_IOMMU, sys::VFIO_TYPE1_IOMMU]
            .into_iter()
            .find(|&t| {
                // SAFETY: VFIO_CHECK_EXTENSION takes the extension number as a plain integer.
                unsafe { sys::ioctl(container.as_fd(), sys::VFIO_CHECK_EXTENSION, t as usize) }.is_ok_and(|r| r > 0)
            })
            .ok_or_else(|| NvmeError::Vfio {
                step: "check the IOMMU type",
                detail: "the kernel offers no type1 IOMMU for VFIO".into(),
            })?;

        let group_path = format!("/dev/vfio/{group}");
        let group_fd: OwnedFd = open_rw(Path::new(&group_path), "open the IOMMU group")?.into();
        let mut status = sys::GroupStatus { argsz: std::mem::size_of::<sys::GroupStatus>() as u32, flags: 0 };
        // SAFETY: VFIO_GROUP_GET_STATUS fills a `vfio_group_status` with argsz set, alive across the call.
        unsafe { sys::ioctl(group_fd.as_fd(), sys::VFIO_GROUP_GET_STATUS, &mut status as *mut _ as usize) }
            .map_err(step("get group status"))?;
        if status.flags & sys::VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(NvmeError::Vfio {
                step: "get group status",
                detail: format!(
                    "IOMMU group {group} is not viable: every device in /sys/kernel/iommu_groups/{group}/devices must be \
                     bound to vfio-pci (or have no driver)"
                ),
            });
        }
        let container_raw: i32 = std::os::fd::AsRawFd::as_raw_fd(&container);
        // SAFETY: VFIO_GROUP_SET_CONTAINER takes a pointer to the container's fd, alive across the call.
        unsafe { sys::ioctl(group_fd.as_fd(), sys::VFIO_GROUP_SET_CONTAINER, &container_raw as *const i32 as usize) }
            .map_err(step("set the group's container"))?;
        // SAFETY: VFIO_SET_IOMMU takes the IOMMU type as a plain integer.
        unsafe { sys::ioctl(container.as_fd(), sys::VFIO_SET_IOMMU, iommu as usize) }
            .map_err(step("set the IOMMU type"))?;

        let name = CString::new(dev.address.clone())
            .map_err(|_| NvmeError::Vfio { step: "get the device", detail: "PCI address holds a NUL".into() })?;
        // SAFETY: VFIO_GROUP_GET_DEVICE_FD takes a NUL-terminated device name, alive across the call; it returns a
        // new fd that nothing else owns.
        let raw = unsafe { sys::ioctl(group_fd.as_fd(), sys::VFIO_GROUP_GET_DEVICE_FD, name.as_ptr() as usize) }
            .map_err(step("get the device"))?;
        // SAFETY: `raw` is a fresh fd returned by the kernel for this process, owned by nothing else.
        let device = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };

        let mut info = sys::DeviceInfo { argsz: std::mem::size_of::<sys::DeviceInfo>() as u32, ..Default::default() };
        // SAFETY: VFIO_DEVICE_GET_INFO fills a `vfio_device_info` with argsz set, alive across the call.
        unsafe { sys::ioctl(device.as_fd(), sys::VFIO_DEVICE_GET_INFO, &mut info as *mut _ as usize) }
            .map_err(step("get device info"))?;
        if info.flags & sys::VFIO_DEVICE_FLAGS_PCI == 0 || info.num_regions <= sys::VFIO_PCI_CONFIG_REGION_INDEX {
            return Err(NvmeError::Vfio {
                step: "get device info",
                detail: format!("{} is not a VFIO PCI device", dev.address),
            });
        }
        let region = |index: u32| -> Result<sys::RegionInfo, NvmeError> {
            let mut r =
                sys::RegionInfo { argsz: std::mem::size_of::<sys::RegionInfo>() as u32, index, ..Default::default() };
            // SAFETY: VFIO_DEVICE_GET_REGION_INFO fills a `vfio_region_info` with argsz and index set, alive across
            // the call.
            unsafe { sys::ioctl(device.as_fd(), sys::VFIO_DEVICE_GET_REGION_INFO, &mut r as *mut _ as usize) }
                .map_err(step("get region info"))?;
            Ok(r)
        };
        let bar = region(sys::VFIO_PCI_BAR0_REGION_INDEX)?;
        if bar.flags & sys::VFIO_REGION_INFO_FLAG_MMAP == 0 || bar.size < 0x2000 {
            return Err(NvmeError::Vfio {
                step: "map BAR0",
                detail: format!("BAR0 of {} bytes with flags {:#x} cannot be mapped", bar.size, bar.flags),
            });
        }
        let bar0_len = usize::try_from(bar.size)
            .map_err(|_| NvmeError::Vfio { step: "map BAR0", detail: format!("BAR0 of {} bytes", bar.size) })?;

        // Memory space and bus mastering on in the PCI command register, or the drive can neither be addressed nor
        // DMA.
        let config = region(sys::VFIO_PCI_CONFIG_REGION_INDEX)?;
        let dev_file = File::from(device.try_clone().map_err(step("duplicate the device fd"))?);
        let mut cmd = [0u8; 2];
        dev_file.read_exact_at(&mut cmd, config.offset + 4).map_err(step("read the PCI command register"))?;
        let cmd = u16::from_le_bytes(cmd) | 0x2 | 0x4;
        dev_file.write_all_at(&cmd.to_le_bytes(), config.offset + 4).map_err(step("enable bus mastering"))?;

        let offset = libc::off_t::try_from(bar.offset)
            .map_err(|_| NvmeError::Vfio { step: "map BAR0", detail: format!("region offset {:#x}", bar.offset) })?;
        // SAFETY: a fresh shared mapping of the device fd's BAR0 region at the offset VFIO reported; no Rust
        // object aliases it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bar0_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&device),
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(NvmeError::Vfio { step: "map BAR0", detail: std::io::Error::last_os_error().to_string() });
        }
        let base = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| NvmeError::Vfio { step: "map BAR0", detail: "mapped at null".into() })?;
        // SAFETY: the mapping is page aligned, `bar0_len` bytes long, and unmapped only in `Drop`, after the last
        // use of `bar0`.
        let bar0 = unsafe { Mmio::new(base, bar0_len, MmioKind::Device) };
        Ok(VfioBus {
            address: dev.address,
            bar0,
            bar0_len,
            _device: device,
            _group: group_fd,
            container: Arc::new(container),
        })
    }

    /// The controller's PCI address (`0000:01:00.0`).
    pub fn address(&self) -> &str {
        &self.address
    }
}

impl Drop for VfioBus {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once; `bar0` is not used after this.
        unsafe { libc::munmap(self.bar0.as_ptr().cast(), self.bar0_len) };
    }
}

impl Bus for VfioBus {
    fn registers(&self) -> &Mmio {
        &self.bar0
    }

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer, NvmeError> {
        DmaBuffer::alloc(len, |ptr, size| {
            let iova = ptr as u64;
            let mut map = sys::DmaMap {
                argsz: std::mem::size_of::<sys::DmaMap>() as u32,
                flags: sys::VFIO_DMA_MAP_FLAG_READ | sys::VFIO_DMA_MAP_FLAG_WRITE,
                vaddr: iova,
                iova,
                size: size as u64,
            };
            // SAFETY: VFIO_IOMMU_MAP_DMA takes a `vfio_iommu_type1_dma_map` with argsz set, alive across the call;
            // the memory it names is a live mapping that `DmaBuffer` unmaps from the IOMMU (dropping the guard)
            // before freeing.
            unsafe { sys::ioctl(self.container.as_fd(), sys::VFIO_IOMMU_MAP_DMA, &mut map as *mut _ as usize) }
                .map_err(|e| NvmeError::Dma {
                    bytes: size as u64,
                    reason: format!(
                        "VFIO_IOMMU_MAP_DMA: {e} (pinned pages count against RLIMIT_MEMLOCK: raise it with ulimit -l)"
                    ),
                })?;
            Ok((
                iova,
                Box::new(VfioDma { container: self.container.clone(), iova, size: size as u64 }) as Box<dyn DmaMapping>,
            ))
        })
    }

    fn map_device_memory(
        &self,
        _addr: u64,
        _len: u64,
        _dma: Arc<dyn DeviceDma>,
    ) -> Result<Box<dyn DmaMapping>, NvmeError> {
        Err(NvmeError::Unsupported(
            "peer-to-peer DMA into GPU memory needs the GPU's BAR exported to the drive's IOMMU domain (dma-buf or \
             nvidia-peermem), which the VFIO backend does not set up; use tier 1 (pinned host staging)"
                .into(),
        ))
    }

    fn describe(&self) -> String {
        format!("vfio {}", self.address)
    }
}
