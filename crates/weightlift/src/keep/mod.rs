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
mod socket;
pub mod stamp;
pub mod wire;

pub(crate) use client::{KeptBytes, NotServed, ask, ask_packed, keep_after};
pub use server::{Keeper, KeeperConfig};
pub use socket::{default_socket, socket_dir, status};
pub use wire::{EntryStatus, Reply, Status};
