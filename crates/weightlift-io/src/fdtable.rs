//! The process's file-descriptor table, grown once ahead of the loads.
//!
//! Linux grows a process's descriptor table when an open needs a slot past its end (64 slots, then 128, 256, …),
//! and where more than one thread shares the table, that open waits for an RCU grace period (`expand_fdtable`
//! calls `synchronize_rcu`). On the H100 machine the wait took 12–22 ms, and it fell inside a fresh process's
//! first load: the first open after CUDA's descriptors and the lanes' rings had filled the table, caught by
//! sampling every thread's kernel stack (`synchronize_rcu < expand_files < alloc_fd < do_sys_openat2`,
//! bench/results/2026-11-25-h100-zc at b3a4ec8). Growing the table early, once per process, takes the wait out of the loads:
//! at once where the process has one thread (the kernel then skips the wait), else on a thread of its own, whose
//! wait overlaps whatever the program does before its first load.

use std::io::Read;
use std::sync::Mutex;

/// Slots asked for: CUDA's descriptors, the lanes' rings and many open checkpoint files fit. The table then
/// holds 8 KiB of pointers.
pub const WANTED_SLOTS: u64 = 1024;

/// The process that last grew its table (a child made by `fork` gets a table only as large as its highest open
/// descriptor, and grows its own).
static GROWN_IN: Mutex<Option<rustix::process::Pid>> = Mutex::new(None);

/// Grows this process's descriptor table to [`WANTED_SLOTS`] slots (fewer where the descriptor limit is lower),
/// once per process; later calls return at once. Where the process has several threads, the growing happens on
/// a thread of its own and this returns before it ends. Best effort: where `/proc` cannot be read or the limit
/// leaves no room, nothing is done.
pub fn grow_early() {
    let me = rustix::process::getpid();
    let mut grown = GROWN_IN.lock().unwrap_or_else(|p| p.into_inner());
    if *grown == Some(me) {
        return;
    }
    *grown = Some(me);
    let Some(status) = Status::read() else { return };
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX);
    let want = WANTED_SLOTS.min(limit);
    if status.fd_slots >= want || want <= 64 {
        return;
    }
    if status.threads <= 1 {
        grow(want);
    } else {
        // If the thread cannot start, the first open past the table's end pays the wait, as before.
        let _ = std::thread::Builder::new().name("weightlift-fdtable".into()).spawn(move || grow(want));
    }
}

/// Makes the kernel grow the table to hold `want` slots: a descriptor duplicated into the lowest free slot from
/// `want - 1` on (never one in use), closed at once.
fn grow(want: u64) {
    let t = std::time::Instant::now();
    let Ok(file) = std::fs::File::open("/dev/null") else { return };
    let Ok(slot) = i32::try_from(want - 1) else { return };
    let grown = rustix::io::fcntl_dupfd_cloexec(&file, slot).is_ok(); // the duplicate is closed here
    tracing::debug!(slots = want, ok = grown, secs = t.elapsed().as_secs_f64(), "descriptor table grown");
}

/// What `/proc/self/status` says of the descriptor table and the threads.
#[derive(Debug, Clone, Copy)]
pub struct Status {
    /// Slots of the descriptor table (`FDSize`).
    pub fd_slots: u64,
    /// Threads of the process (`Threads`).
    pub threads: u64,
}

impl Status {
    /// Reads `/proc/self/status`; `None` where it cannot be read or lacks either field.
    pub fn read() -> Option<Status> {
        let mut text = String::new();
        std::fs::File::open("/proc/self/status").ok()?.read_to_string(&mut text).ok()?;
        let field = |name: &str| -> Option<u64> {
            text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
        };
        Some(Status { fd_slots: field("FDSize")?, threads: field("Threads")? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_grows_to_the_slots_asked_for_within_the_limit() {
        // The test harness runs tests on threads: the growing happens on a thread of its own.
        grow_early();
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX);
        let want = WANTED_SLOTS.min(limit);
        let t = std::time::Instant::now();
        if want <= 64 {
            return; // a limit this low leaves nothing to grow
        }
        let fd = std::path::Path::new("/proc/self/fd").join((want - 1).to_string());
        let (mut slots, mut open) = (0, true);
        while t.elapsed() < std::time::Duration::from_secs(5) {
            slots = Status::read().expect("/proc/self/status").fd_slots;
            // The duplicate made to grow it is closed right after (nothing else here opens a thousand files).
            open = fd.exists();
            if slots >= want && !open {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(slots >= want, "FDSize {slots}, wanted {want}");
        assert!(!open, "{} is still open", fd.display());
    }

    #[test]
    fn status_reads_the_table_and_the_threads() {
        let s = Status::read().expect("/proc/self/status");
        assert!(s.fd_slots >= 64, "{s:?}");
        assert!(s.threads >= 1, "{s:?}");
    }
}
