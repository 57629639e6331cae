//! The keeper's wire: `SOCK_SEQPACKET` Unix sockets (message boundaries kept, so each frame's descriptors arrive
//! with it; connection-oriented, so a peer's death is an end of file), one JSON object per frame, descriptors passed
//! with `SCM_RIGHTS`. Written over rustix's `sendmsg`/`recvmsg` because the standard library's Unix sockets are
//! streams only and pass no descriptors; a descriptor received and not claimed is closed when dropped.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use serde::{Deserialize, Serialize};

/// The protocol's version: a keeper answers a request of another version with an error naming both. (2: a load's
/// inputs may be objects.)
pub const PROTO: u32 = 2;

/// Largest frame, in bytes (frames are a few hundred bytes; a larger one is refused).
pub const MAX_FRAME: usize = 64 << 10;

/// Most descriptors one frame carries (the kernel's `SCM_MAX_FD` is 253).
pub const MAX_FDS: usize = 250;

/// A client's request.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// The inputs of a load, in its order: local files (one descriptor each, opened by the client, in the same
    /// order) and objects: served if every one is kept, else (with `keep`) loaded by the keeper for the next process.
    Get {
        /// The client's protocol version.
        proto: u32,
        /// The device the client loads onto (`cuda:0`, `cpu`).
        device: String,
        /// That device's UUID, where it has one (GPUs).
        uuid: Option<String>,
        /// The load's inputs; as many are files as the frame carries descriptors. (Defaulted so that an older
        /// client's request, which has none, is answered with the protocol versions rather than a parse error.)
        #[serde(default)]
        inputs: Vec<Input>,
        /// Whether the keeper should load what it does not keep yet.
        keep: bool,
    },
    /// What the keeper holds (for `weightlift keep --status` and tests).
    Status {
        /// The client's protocol version.
        proto: u32,
    },
}

/// One input of a load.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Input {
    /// A local file: the frame's next descriptor.
    File,
    /// An object, as the client opened it (the keeper fetches it at that ETag with its own credentials).
    Object(super::stamp::ObjectStamp),
}

/// One kept file, as the status lists it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct EntryStatus {
    /// The path the file had when it was first asked for, or the object's URL (without credentials or query).
    pub path: String,
    /// Its length in bytes.
    pub len: u64,
    /// Memory it takes in the keeper (rounded up to the allocation granularity).
    pub bytes: u64,
    /// `loading`, `ready` or `stale` (the file changed; freed when its last lease ends).
    pub state: String,
    /// Handouts not yet given back.
    pub leases: u32,
}

/// The keeper's answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Reply {
    /// Every input is kept: one descriptor per input follows in this frame, each the memory holding all its bytes.
    Hit {
        /// The keeper's protocol version.
        proto: u32,
        /// Each input's memory size in bytes (the descriptor's mapping length).
        sizes: Vec<u64>,
        /// Each input's identity as the keeper keeps it (the client checks it against its own).
        stamps: Vec<super::stamp::Key>,
    },
    /// Not served; the client loads as usual.
    Miss {
        /// The keeper's protocol version.
        proto: u32,
        /// `not_kept`, `loading`, `changed`, `other_device`, `over_budget` or `failed`.
        code: String,
        /// Why, in a sentence.
        reason: String,
    },
    /// What the keeper holds.
    Status {
        /// The keeper's protocol version.
        proto: u32,
        /// The device it keeps on.
        device: String,
        /// Its memory budget in bytes.
        budget: u64,
        /// Memory its entries take (loading, ready or stale), in bytes.
        used: u64,
        /// The entries, most recently used first.
        entries: Vec<EntryStatus>,
        /// Loads it served, and failed ones (counters since it started).
        served: u64,
        /// Loads it could not keep (a failed read, a changed file, no memory).
        failed: u64,
    },
    /// The request was refused (bad frame, other protocol, other user).
    Error {
        /// The keeper's protocol version.
        proto: u32,
        /// Why.
        reason: String,
    },
}

/// What a keeper holds, as its status gives it (a [`Reply::Status`]).
pub type Status = Reply;

/// A wire failure: the peer is gone, or sent something that is not a frame of this protocol.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The peer closed the connection.
    #[error("the peer closed the connection")]
    Closed,
    /// A system call failed.
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    /// A malformed frame.
    #[error("malformed frame: {0}")]
    Frame(String),
}

fn io(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> WireError {
    move |e| WireError::Io(call, e.into())
}

/// A new `SOCK_SEQPACKET` Unix socket (close-on-exec).
pub fn seqpacket() -> Result<OwnedFd, WireError> {
    rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
        .map_err(io("socket"))
}

/// Connects to the keeper at `path`.
pub fn connect(path: &Path) -> Result<OwnedFd, WireError> {
    let fd = seqpacket()?;
    let addr = SocketAddrUnix::new(path).map_err(io("socket address"))?;
    rustix::net::connect(&fd, &addr).map_err(io("connect"))?;
    Ok(fd)
}

/// Connects to the keeper at `path`, waiting at most `timeout` for it to take the connection (a keeper stopped with
/// its backlog full would hold `connect` forever); answers are then awaited at most `timeout` too.
pub fn connect_within(path: &Path, timeout: std::time::Duration) -> Result<OwnedFd, WireError> {
    use rustix::net::sockopt::{Timeout, set_socket_timeout};
    let fd = seqpacket()?;
    // Linux applies the send timeout to a Unix socket's blocking connect.
    set_socket_timeout(&fd, Timeout::Send, Some(timeout)).map_err(io("SO_SNDTIMEO"))?;
    set_socket_timeout(&fd, Timeout::Recv, Some(timeout)).map_err(io("SO_RCVTIMEO"))?;
    let addr = SocketAddrUnix::new(path).map_err(io("socket address"))?;
    rustix::net::connect(&fd, &addr).map_err(io("connect"))?;
    Ok(fd)
}

/// Sends `msg` with `fds` attached.
pub fn send<T: Serialize>(sock: BorrowedFd<'_>, msg: &T, fds: &[BorrowedFd<'_>]) -> Result<(), WireError> {
    let body = serde_json::to_vec(msg).map_err(|e| WireError::Frame(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(WireError::Frame(format!("a {}-byte frame (at most {MAX_FRAME})", body.len())));
    }
    if fds.len() > MAX_FDS {
        return Err(WireError::Frame(format!("{} descriptors in one frame (at most {MAX_FDS})", fds.len())));
    }
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(WireError::Frame("descriptors do not fit the control buffer".into()));
    }
    let sent =
        rustix::net::sendmsg(sock, &[IoSlice::new(&body)], &mut control, SendFlags::NOSIGNAL).map_err(io("sendmsg"))?;
    if sent != body.len() {
        return Err(WireError::Frame(format!("sent {sent} of {} bytes", body.len())));
    }
    Ok(())
}

/// Receives one frame and the descriptors it carries. A frame too long, descriptors cut short by the kernel, or
/// bytes that are not a `T` are errors (the descriptors that did arrive are closed).
pub fn recv<T: for<'de> Deserialize<'de>>(sock: BorrowedFd<'_>) -> Result<(T, Vec<OwnedFd>), WireError> {
    let mut buf = vec![0u8; MAX_FRAME + 1];
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS + 3))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match rustix::net::recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC | RecvFlags::TRUNC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r.map_err(io("recvmsg"))?,
        }
    };
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    if got.bytes == 0 && fds.is_empty() {
        return Err(WireError::Closed);
    }
    if got.flags.contains(ReturnFlags::CTRUNC) {
        return Err(WireError::Frame("descriptors were cut short (more than the frame may carry)".into()));
    }
    if got.bytes > MAX_FRAME || got.flags.contains(ReturnFlags::TRUNC) {
        return Err(WireError::Frame(format!("a frame over {MAX_FRAME} bytes")));
    }
    let msg = serde_json::from_slice(&buf[..got.bytes]).map_err(|e| WireError::Frame(e.to_string()))?;
    Ok((msg, fds))
}

/// The user id of the process at the other end of `sock` (as it was when it connected or listened).
pub fn peer_uid(sock: impl AsFd) -> Result<u32, WireError> {
    let cred = rustix::net::sockopt::socket_peercred(sock).map_err(io("SO_PEERCRED"))?;
    Ok(cred.uid.as_raw())
}

/// Checks that the keeper at the other end runs as this user.
pub(crate) fn check_keeper_user(conn: &OwnedFd) -> Result<(), String> {
    let uid = peer_uid(conn).map_err(|e| e.to_string())?;
    let mine = rustix::process::getuid().as_raw();
    if uid != mine {
        return Err(format!("it runs as uid {uid}, not as this user (uid {mine}); not used"));
    }
    Ok(())
}
