//! The memory a keeper holds a file in, and that memory as a client maps it: on a GPU, driver memory shared as a
//! file descriptor (`weightlift_cuda::vmm`); for host loads, a sealed memfd (the same descriptor-passing shape, so
//! the protocol, leases and faults run the same way on machines without a GPU).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use weightlift_cuda::Gpu;
use weightlift_cuda::vmm::{ImportedMemory, SharedMemory};

use crate::error::{Error, Result};
use crate::tensor::RawDest;

/// A whole file's bytes, held by the keeper.
#[derive(Debug)]
pub enum Kept {
    /// On a GPU.
    Cuda(SharedMemory),
    /// In a memfd sealed against writes once filled.
    Host {
        /// The memfd.
        fd: OwnedFd,
        /// Its length.
        len: u64,
    },
}

/// Memory the keeper is filling: the destination of its read, then sealed into [`Kept`].
pub enum Filling {
    /// On a GPU.
    Cuda(SharedMemory),
    /// A memfd mapped writable while it is filled.
    Host {
        /// The memfd.
        fd: OwnedFd,
        /// The mapping.
        map: HostMap,
    },
}

impl Filling {
    /// `len` bytes on `gpu` (rounded up to `granularity`), or in a memfd when `gpu` is `None`.
    pub fn create(gpu: Option<(&Gpu, u64)>, len: u64) -> Result<Filling> {
        match gpu {
            Some((g, granularity)) => Ok(Filling::Cuda(SharedMemory::create(g, len, granularity)?)),
            None => {
                let fd = rustix::fs::memfd_create(
                    "weightlift-keep",
                    rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
                )
                .map_err(|e| Error::InvalidArgument(format!("memfd_create: {e}")))?;
                rustix::fs::ftruncate(&fd, len).map_err(|e| Error::InvalidArgument(format!("ftruncate: {e}")))?;
                let map = HostMap::new(&fd, len, true)?;
                Ok(Filling::Host { fd, map })
            }
        }
    }

    /// Where the read writes, and its capacity.
    pub fn dest(&self, ordinal: u32) -> (RawDest, u64) {
        match self {
            Filling::Cuda(m) => (RawDest::Device { ordinal, ptr: m.device_ptr() }, m.len()),
            Filling::Host { map, .. } => (RawDest::Host(map.ptr), map.len as u64),
        }
    }

    /// Filled: a memfd is unmapped and sealed (no one can write or resize it again).
    pub fn seal(self) -> Result<Kept> {
        match self {
            Filling::Cuda(m) => Ok(Kept::Cuda(m)),
            Filling::Host { fd, map } => {
                let len = map.len as u64;
                drop(map);
                seal_memfd(&fd).map_err(|e| Error::InvalidArgument(format!("sealing the memfd: {e}")))?;
                Ok(Kept::Host { fd, len })
            }
        }
    }
}

/// Seals a filled memfd against writes and resizing. The kernel refuses the write seal (EBUSY) while any of its
/// pages holds a reference beyond its mappings': a page just faulted in holds one in its CPU's batch of pages
/// waiting for the LRU lists until that batch drains, and the kernel drains only the sealing thread's own CPU's
/// before it gives up (about 75 ms), so pages the read's threads faulted on other CPUs can fail it on a loaded
/// machine (seen in CI's tests: "Device or resource busy"). Then the future-write seal is set instead: it waits for
/// no page, and refuses every later write and writable mapping; the one writable mapping there was (the keeper's
/// own, for the read) is gone, and the memfd has not been handed to anyone yet, so nothing can write it either way.
fn seal_memfd(fd: &OwnedFd) -> rustix::io::Result<()> {
    use rustix::fs::SealFlags;
    let rest = SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL;
    match rustix::fs::fcntl_add_seals(fd, SealFlags::WRITE | rest) {
        Err(rustix::io::Errno::BUSY) => rustix::fs::fcntl_add_seals(fd, SealFlags::FUTURE_WRITE | rest),
        other => other,
    }
}

impl Kept {
    /// Memory it takes.
    pub fn bytes(&self) -> u64 {
        match self {
            Kept::Cuda(m) => m.len(),
            Kept::Host { len, .. } => *len,
        }
    }

    /// A descriptor to hand to a client (a new one each time; the caller closes it once sent).
    pub fn handout(&self) -> Result<OwnedFd> {
        match self {
            Kept::Cuda(m) => Ok(m.export()?),
            Kept::Host { fd, .. } => rustix::io::fcntl_dupfd_cloexec(fd, 3)
                .map_err(|e| Error::InvalidArgument(format!("duplicating the memfd: {e}"))),
        }
    }
}

/// A mapping of host memory shared through a descriptor; unmapped when dropped.
#[derive(Debug)]
pub struct HostMap {
    /// First byte.
    pub ptr: *mut u8,
    /// Length.
    pub len: usize,
}

// SAFETY: a plain shared mapping; whoever writes through it (only the keeper, before sealing) does so from one
// thread while nothing reads it.
unsafe impl Send for HostMap {}
// SAFETY: as above; clients map read-only.
unsafe impl Sync for HostMap {}

impl HostMap {
    /// Maps `len` bytes of `fd` shared, writable or read-only.
    pub fn new(fd: impl AsFd, len: u64, writable: bool) -> Result<HostMap> {
        if len == 0 {
            return Ok(HostMap { ptr: std::ptr::NonNull::dangling().as_ptr(), len: 0 });
        }
        use rustix::mm::{MapFlags, ProtFlags};
        let prot = if writable { ProtFlags::READ | ProtFlags::WRITE } else { ProtFlags::READ };
        // SAFETY: a new shared mapping of a descriptor we hold; nothing else lives at the address the kernel picks.
        let ptr = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len as usize, prot, MapFlags::SHARED, fd, 0) }
            .map_err(|e| Error::InvalidArgument(format!("mapping {len} bytes of kept memory: {e}")))?;
        Ok(HostMap { ptr: ptr.cast(), len: len as usize })
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: mapped for `len` bytes while self lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for HostMap {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: mapped by `new`, unmapped once.
            let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
        }
    }
}

/// A kept file as the client maps it.
#[derive(Debug)]
pub enum Imported {
    /// GPU memory of the keeper, mapped into this process's context.
    Cuda(ImportedMemory),
    /// The keeper's memfd, mapped read-only.
    Host(HostMap),
}

impl Imported {
    /// Maps the descriptor `fd` of `size` bytes (read-only where `read_only`: view handouts).
    pub fn map(gpu: Option<&Gpu>, fd: &OwnedFd, size: u64, read_only: bool) -> Result<Imported> {
        match gpu {
            Some(g) => Ok(Imported::Cuda(ImportedMemory::import(g, fd.as_fd(), size, read_only)?)),
            None => Ok(Imported::Host(HostMap::new(fd, size, false)?)),
        }
    }

    /// The device address of the first byte (GPU memory only; 0 for host memory).
    pub fn device_ptr(&self) -> u64 {
        match self {
            Imported::Cuda(m) => m.device_ptr(),
            Imported::Host(_) => 0,
        }
    }
}

/// What keeps a view handout alive, held by its tensors' buffers: the mappings and the connection whose end gives
/// the leases back (dropped in that order: unmapped first).
#[derive(Debug)]
pub struct ViewLease {
    _imported: Vec<Arc<Imported>>,
    _conn: OwnedFd,
}

impl ViewLease {
    /// Holds `imported` and `conn` until dropped.
    pub fn new(imported: Vec<Arc<Imported>>, conn: OwnedFd) -> ViewLease {
        ViewLease { _imported: imported, _conn: conn }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages referenced from elsewhere (here: spliced into a pipe, as pages in a CPU's LRU batch are held) make the
    /// kernel refuse the write seal; the memfd is still sealed, by the future-write seal, and no one can write it.
    #[test]
    fn a_memfd_whose_pages_are_referenced_is_still_sealed_against_writes() {
        let len = 64 << 10;
        let filling = Filling::create(None, len).unwrap();
        let (RawDest::Host(ptr), _) = filling.dest(0) else { panic!("host memory expected") };
        // SAFETY: the mapping is `len` bytes of this memfd, ours until sealed.
        unsafe { std::ptr::write_bytes(ptr, 7, len as usize) };
        let (mut fds, len_i) = ([0i32; 2], len as usize);
        // SAFETY: a plain pipe; its ends are closed below.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the pipe's size grows to hold the whole region, so vmsplice takes every page at once.
        unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, len_i as libc::c_int) };
        let iov = libc::iovec { iov_base: ptr.cast(), iov_len: len_i };
        // SAFETY: `iov` names the mapped region; the pipe holds references to its pages until it is closed.
        let spliced = unsafe { libc::vmsplice(fds[1], &iov, 1, 0) };
        assert!(spliced > 0, "vmsplice: {}", std::io::Error::last_os_error());
        let kept = filling.seal().unwrap();
        let Kept::Host { fd, .. } = &kept else { panic!("host memory expected") };
        let seals = rustix::fs::fcntl_get_seals(fd).unwrap();
        use rustix::fs::SealFlags;
        // The write seal was refused (the pipe holds the pages), the future-write seal set.
        assert!(seals.contains(SealFlags::FUTURE_WRITE) && !seals.contains(SealFlags::WRITE), "{seals:?}");
        assert!(seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL), "{seals:?}");
        assert!(rustix::io::write(fd, b"x").is_err(), "written after sealing");
        assert!(HostMap::new(fd, len, true).is_err(), "mapped writable after sealing");
        // SAFETY: the pipe's own descriptors.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
