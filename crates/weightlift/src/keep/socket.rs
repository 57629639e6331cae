//! The keeper's socket: where it is, who may reach it, binding it.

use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::wire::{self, Reply, Status};
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
pub(crate) fn check_private_dir(dir: &Path) -> std::result::Result<(), String> {
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
pub(crate) fn bind(socket: &Path) -> Result<OwnedFd> {
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
    wire::check_keeper_user(&conn).map_err(fail)?;
    wire::send(std::os::fd::AsFd::as_fd(&conn), &wire::Request::Status { proto: wire::PROTO }, &[])
        .map_err(|e| fail(e.to_string()))?;
    let (reply, _) = wire::recv::<Reply>(std::os::fd::AsFd::as_fd(&conn)).map_err(|e| fail(e.to_string()))?;
    match reply {
        Reply::Error { reason, .. } => Err(fail(reason)),
        r => Ok(r),
    }
}
