//! The keeper: a process that holds checkpoint files in GPU memory (or, for host loads, in shared host memory) and
//! hands them to later loads of other processes, so that a restart loads at the rate of device memory instead of
//! storage or PCIe.
//!
//! ```text
//!  weightlift keep --device cuda:0          load_file(path, device="cuda:0") in another process
//!  ┌──────────────────────────────┐  Get + the client's file descriptors  ┌────────────────────────────┐
//!  │ registry: stamp → memory     │◀──────────────────────────────────────│ Engine::load_some          │
//!  │  (budget, LRU, leases)       │  Hit + one memory descriptor per file │  maps each, copies device  │
//!  │ loader: reads a missed file  │──────────────────────────────────────▶│  to device into its own    │
//!  │  into cuMemCreate'd memory   │  (or Miss: not kept → it loads it)    │  memory (or keeps views)   │
//!  └──────────────────────────────┘  SOCK_SEQPACKET, SCM_RIGHTS           └────────────────────────────┘
//! ```
//!
//! - **Identity.** A file is kept under its [`stamp::Stamp`] (device, inode, length, modification and change
//!   times), read with `fstat` from the descriptor the client opened, never from a path. A file that changed is
//!   loaded afresh and its old memory is never served again; a file that changes while the keeper reads it is not
//!   kept.
//! - **Memory.** Device memory from the driver's virtual memory management, exported as file descriptors
//!   ([`weightlift_cuda::vmm`]): a client's mapping keeps the memory valid even if the keeper dies meanwhile.
//! - **Leases.** A handout is leased until the client's connection ends (a copy: right after it; views: when the
//!   last tensor is freed). A killed client's connection ends with it. Only unleased entries are evicted, least
//!   recently used first, to keep within the budget.
//! - **Users.** The socket lives in a directory only its user can enter, and each side checks the other's user
//!   (`SO_PEERCRED`); a client of another user is refused.
//! - **Falls back, never fails.** A load the keeper does not serve (none running, not kept yet, another GPU, a
//!   changed file, the keeper gone mid-way) reads the files as usual; its report says why (`Report::keeper`).

mod client;
mod memory;
mod registry;
mod server;
pub mod stamp;
pub mod wire;

use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub(crate) use client::ask;
pub use server::{Keeper, KeeperConfig, Status};
pub use wire::{EntryStatus, Reply};

use crate::device::Device;
use crate::error::{Error, Result};

/// The folder of the user's keeper sockets: `$XDG_RUNTIME_DIR/weightlift` where that is set, else
/// `/tmp/weightlift-<uid>`.
pub fn socket_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty() && Path::new(d).is_dir()) {
        Some(d) => PathBuf::from(d).join("weightlift"),
        None => PathBuf::from(format!("/tmp/weightlift-{}", rustix::process::getuid().as_raw())),
    }
}

/// The default socket of the keeper of `device`: `keep-cuda0.sock`, `keep-cpu.sock` in [`socket_dir`].
pub fn default_socket(device: Device) -> Result<PathBuf> {
    let name = match device {
        Device::Cuda(n) => format!("keep-cuda{n}.sock"),
        Device::Cpu => "keep-cpu.sock".into(),
        Device::PinnedCpu => return Err(Error::InvalidArgument("no keeper keeps cpu:pinned memory".into())),
    };
    Ok(socket_dir().join(name))
}

/// Checks that `dir` is a real directory of this user that no one else may enter or write.
fn check_private_dir(dir: &Path) -> std::result::Result<(), String> {
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !m.file_type().is_dir() {
        return Err(format!("{} is not a directory (a symbolic link is refused)", dir.display()));
    }
    let uid = rustix::process::getuid().as_raw();
    if m.uid() != uid {
        return Err(format!("{} belongs to uid {}, not to this user (uid {uid})", dir.display(), m.uid()));
    }
    if m.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{} is open to other users (mode {:o}); a keeper's folder must be 0700",
            dir.display(),
            m.permissions().mode() & 0o777
        ));
    }
    Ok(())
}

/// Binds and listens on `socket`, making its folder (0700) if missing. A socket another keeper answers on is
/// refused; a stale one (nothing listening) is replaced.
fn bind(socket: &Path) -> Result<OwnedFd> {
    let refuse = |why: String| Error::InvalidArgument(format!("keeper socket {}: {why}", socket.display()));
    let dir = socket.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| refuse(format!("making {}: {e}", dir.display())))?;
    }
    check_private_dir(dir).map_err(refuse)?;
    if let Ok(m) = std::fs::symlink_metadata(socket) {
        use std::os::unix::fs::FileTypeExt;
        if !m.file_type().is_socket() {
            return Err(refuse("exists and is not a socket".into()));
        }
        match wire::connect(socket) {
            Ok(_) => return Err(refuse("another keeper listens there".into())),
            Err(_) => std::fs::remove_file(socket).map_err(|e| refuse(format!("removing the stale socket: {e}")))?,
        }
    }
    let fd = wire::seqpacket().map_err(|e| refuse(e.to_string()))?;
    let addr = rustix::net::SocketAddrUnix::new(socket).map_err(|e| refuse(format!("address: {e}")))?;
    rustix::net::bind(&fd, &addr).map_err(|e| refuse(format!("bind: {e}")))?;
    rustix::net::listen(&fd, 128).map_err(|e| refuse(format!("listen: {e}")))?;
    Ok(fd)
}

/// Asks the keeper at `socket` what it holds.
pub fn status(socket: &Path) -> Result<Status> {
    let fail = |why: String| Error::InvalidArgument(format!("keeper at {}: {why}", socket.display()));
    let conn = wire::connect(socket).map_err(|e| fail(e.to_string()))?;
    client::check_keeper_user(&conn).map_err(fail)?;
    wire::send(std::os::fd::AsFd::as_fd(&conn), &wire::Request::Status { proto: wire::PROTO }, &[])
        .map_err(|e| fail(e.to_string()))?;
    let (reply, _) = wire::recv::<Reply>(std::os::fd::AsFd::as_fd(&conn)).map_err(|e| fail(e.to_string()))?;
    match reply {
        Reply::Error { reason, .. } => Err(fail(reason)),
        r => Ok(r),
    }
}

use std::os::unix::fs::DirBuilderExt;
