//! What crosses between the engine's threads and Python: `tracing` events become records of Python's `logging`
//! (logger `weightlift`), and long calls stay interruptible by Ctrl-C.
//!
//! Events are queued by a `tracing` layer and handed to `logging` by the thread that made the call, whenever it holds
//! the GIL (every 50 ms while the call runs, and at its end): an I/O thread taking the GIL itself could deadlock against a Python thread waiting on it. Each
//! record carries the time its event happened (`created`, `msecs`, `relativeCreated`), not the time it was handed
//! over, so that a log of a load's events is a true timeline.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// Taken first by every native entry point (each `#[pyfunction]` and each function of a `#[pymethods]` block) and
/// held for its whole duration: the caller's thread keeps its current CUDA context, and with it the device torch
/// calls current, whatever the call binds there (cudarc's safe calls bind their context on the calling thread, and
/// so does dropping its streams, events and contexts: a Python object freed there drops what it owns under the
/// engine's own guards). `tests/entry_points.rs` checks that every entry point takes it first.
#[must_use = "held for the whole call"]
pub fn keep_callers_context() -> weightlift::cuda::ContextRestore {
    weightlift::cuda::ContextRestore::save()
}

/// A queued record.
struct Queued {
    /// Python logging level.
    level: u8,
    message: String,
    /// Nanoseconds since the Unix epoch when the event happened.
    when_ns: u128,
    /// The Rust source of the event (file, line, module).
    file: &'static str,
    line: u32,
    module: &'static str,
}

static QUEUE: Mutex<Vec<Queued>> = Mutex::new(Vec::new());
/// Records kept at most between two flushes (a burst of warnings must not grow without bound).
const MAX_QUEUED: usize = 1000;

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        } else {
            self.0 += &format!(" {}={value:?}", field.name());
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0 = value.to_string();
        } else {
            self.0 += &format!(" {}={value}", field.name());
        }
    }
}

struct ToLogging;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ToLogging {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => 40,
            tracing::Level::WARN => 30,
            tracing::Level::INFO => 20,
            _ => 10,
        };
        let when_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let mut m = Message(String::new());
        event.record(&mut m);
        let meta = event.metadata();
        let mut q = QUEUE.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() < MAX_QUEUED {
            q.push(Queued {
                level,
                message: m.0,
                when_ns,
                file: meta.file().unwrap_or(""),
                line: meta.line().unwrap_or(0),
                module: meta.module_path().unwrap_or(""),
            });
        }
    }
}

/// Installs the layer as this process's `tracing` subscriber (if no other was installed first).
pub fn install() {
    let filter = tracing_subscriber::filter::LevelFilter::DEBUG;
    let subscriber = tracing_subscriber::registry().with(ToLogging.with_filter(filter));
    let _ = tracing::subscriber::set_global_default(subscriber);
}

use tracing_subscriber::Layer as _;

/// Hands queued records to `logging.getLogger("weightlift")`, each dated when its event happened. Returns the
/// `KeyboardInterrupt` (or other exception that is not an `Exception`) that a signal handler raised meanwhile, for
/// the caller to act on (handing over runs Python code, where signal handlers run). The record being handed over
/// when it came is not retried (some of its handlers may have seen it); the records after it stay queued. Other
/// errors of `logging` are not the load's, and are dropped as `Logger.log` would let them pass.
pub fn flush(py: Python<'_>) -> Option<PyErr> {
    let records = std::mem::take(&mut *QUEUE.lock().unwrap_or_else(|p| p.into_inner()));
    if records.is_empty() {
        return None;
    }
    let mut records = records.into_iter();
    let stopped = hand_over(py, &mut records);
    if stopped.is_some() {
        let mut q = QUEUE.lock().unwrap_or_else(|p| p.into_inner());
        let newer = std::mem::take(&mut *q);
        q.extend(records);
        q.extend(newer);
        q.truncate(MAX_QUEUED);
    }
    stopped
}

/// An error that is not an `Exception` (`KeyboardInterrupt`, `SystemExit`): a signal handler's, not logging's.
fn interrupt(py: Python<'_>, r: PyResult<()>) -> Option<PyErr> {
    r.err().filter(|e| !e.is_instance_of::<pyo3::exceptions::PyException>(py))
}

fn hand_over(py: Python<'_>, records: &mut std::vec::IntoIter<Queued>) -> Option<PyErr> {
    let logging = match py.import("logging") {
        Ok(l) => l,
        Err(e) => return interrupt(py, Err(e)),
    };
    let logger = match logging.call_method1("getLogger", ("weightlift",)) {
        Ok(l) => l,
        Err(e) => return interrupt(py, Err(e)),
    };
    // Looked up once per hand-over, not per record: whether each level is enabled, the logger's name and logging's
    // start time (None where they cannot be had: the records then go undated).
    let mut enabled: [Option<bool>; 6] = [None; 6];
    let dating = Dating::of(&logging, &logger).ok();
    for q in records.by_ref() {
        let slot = &mut enabled[usize::from(q.level / 10).min(5)];
        let on = match *slot {
            Some(on) => on,
            None => match logger.call_method1("isEnabledFor", (q.level,)).and_then(|b| b.is_truthy()) {
                Ok(on) => *slot.insert(on),
                Err(e) => {
                    if let Some(stop) = interrupt(py, Err(e)) {
                        return Some(stop);
                    }
                    *slot.insert(false)
                }
            },
        };
        if !on {
            continue;
        }
        let handed = match dating.as_ref().map(|d| d.record(&logger, &q)) {
            // As `Logger.log` does after making its record; what a handler or filter raises is not the load's.
            Some(Ok(record)) => logger.call_method1("handle", (record,)).map(drop),
            Some(Err(e)) if interrupt(py, Err(e.clone_ref(py))).is_some() => Err(e),
            // The record could not be made with its time: handed over undated rather than lost.
            _ => logger.call_method1("log", (q.level, q.message)).map(drop),
        };
        if let Some(stop) = interrupt(py, handed) {
            return Some(stop);
        }
    }
    None
}

/// What dating a record needs from `logging`: the logger's name and the time `logging` was imported.
struct Dating<'py> {
    name: Bound<'py, PyAny>,
    start_ns: u128,
}

impl<'py> Dating<'py> {
    fn of(logging: &Bound<'py, PyModule>, logger: &Bound<'py, PyAny>) -> PyResult<Dating<'py>> {
        // Float seconds before Python 3.13, integer nanoseconds from 3.13 on.
        let start = logging.getattr("_startTime")?;
        let start_ns: u128 = match start.extract::<u128>() {
            Ok(n) => n,
            Err(_) => (start.extract::<f64>()? * 1e9) as u128,
        };
        Ok(Dating { name: logger.getattr("name")?, start_ns })
    }

    /// The record `Logger.log` would make for `q` (the Rust source file, line and module as its path, line and
    /// function), dated when its event happened: `created`, `msecs` and `relativeCreated` computed as `LogRecord`
    /// computes them from the time it is made. (A record factory set with `logging.setLogRecordFactory` is used,
    /// but sees the time of the hand-over, as it would have before the dating.)
    fn record(&self, logger: &Bound<'py, PyAny>, q: &Queued) -> PyResult<Bound<'py, PyAny>> {
        let py = logger.py();
        let args = pyo3::types::PyTuple::empty(py);
        let record = logger
            .call_method1("makeRecord", (&self.name, q.level, q.file, q.line, &q.message, args, py.None(), q.module))?;
        let ns = q.when_ns;
        record.setattr("created", ns as f64 / 1e9)?;
        record.setattr("msecs", ((ns % 1_000_000_000) / 1_000_000) as f64)?;
        record.setattr("relativeCreated", (ns as f64 - self.start_ns as f64) / 1e6)?;
        Ok(record)
    }
}

/// Runs `work` without the GIL on a thread of its own, while the calling thread checks for signals (and hands queued
/// log records over) every 50 ms:
/// on Ctrl-C (or any signal handler raising), `cancel` is set, `work` is left to stop and drain (it must watch
/// `cancel`), and the exception is raised once it has returned, with every resource it held released.
pub fn interruptible<T: Send>(py: Python<'_>, work: impl FnOnce(&AtomicBool) -> T + Send) -> PyResult<T> {
    interruptible_with(py, |_| Ok(()), work)
}

/// Runs `work` without the GIL on a thread of its own, handing the records it logs to `logging` every 50 ms as
/// it runs (the command line's own signal handling stays in charge: no Python signal is checked).
pub fn with_logs<T: Send>(py: Python<'_>, work: impl FnOnce() -> T + Send) -> PyResult<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let rx = Mutex::new(rx);
    let result = std::thread::scope(|s| {
        let spawned = std::thread::Builder::new().name("weightlift-cli".into()).spawn_scoped(s, move || {
            let _ = tx.send(work());
        });
        if let Err(e) = spawned {
            return Err(crate::errors::to_py(weightlift::Error::Io(weightlift::io::IoError::Thread(e))));
        }
        loop {
            let wait = || rx.lock().unwrap_or_else(|p| p.into_inner()).recv_timeout(Duration::from_millis(50));
            match py.detach(wait) {
                Ok(v) => break Ok(v),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    break Err(crate::errors::invalid_argument("the command's thread ended without a result"));
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(e) = flush(py) {
                        break Err(e);
                    }
                }
            }
        }
    });
    match flush(py) {
        Some(e) => Err(e),
        None => result,
    }
}

/// [`interruptible`], calling `tick` (with the GIL) every 50 ms while `work` runs, and once after it returned: a
/// progress report's hook. An exception `tick` raises cancels `work` as a Ctrl-C does.
pub fn interruptible_with<T: Send>(
    py: Python<'_>,
    tick: impl Fn(Python<'_>) -> PyResult<()>,
    work: impl FnOnce(&AtomicBool) -> T + Send,
) -> PyResult<T> {
    let cancel = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    // `detach` needs what it borrows to be shareable; the receiver is used by this thread alone.
    let rx = Mutex::new(rx);
    let result = std::thread::scope(|s| {
        let cancel = &cancel;
        let spawned = std::thread::Builder::new().name("weightlift-call".into()).spawn_scoped(s, move || {
            let _ = tx.send(work(cancel));
        });
        if let Err(e) = spawned {
            return Err(crate::errors::to_py(weightlift::Error::Io(weightlift::io::IoError::Thread(e))));
        }
        let mut interrupted = None;
        loop {
            let wait = || rx.lock().unwrap_or_else(|p| p.into_inner()).recv_timeout(Duration::from_millis(50));
            match py.detach(wait) {
                Ok(v) => break Ok((v, interrupted)),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    break Err(crate::errors::invalid_argument("the worker thread ended without a result"));
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    // Records of a long call (a slow load's) reach `logging` while it runs, not
                    // only at its end (the queue keeps at most 1,000). A Ctrl-C may surface there, as Python code
                    // runs handing them over.
                    let stop = flush(py);
                    if interrupted.is_none()
                        && let Some(e) = stop.or_else(|| py.check_signals().err()).or_else(|| tick(py).err())
                    {
                        cancel.store(true, Ordering::Relaxed);
                        interrupted = Some(e);
                    }
                }
            }
        }
    });
    let late = flush(py);
    let (value, interrupted) = result?;
    let late = late.or_else(|| if interrupted.is_none() { tick(py).err() } else { None });
    // A Ctrl-C that came while the last records were handed over still interrupts (the work has ended).
    let interrupted = interrupted.or(late);
    match interrupted {
        Some(e) => Err(e),
        None => Ok(value),
    }
}

/// A raw address crossing into a GIL-free section; the Python caller keeps the memory alive meanwhile.
pub(crate) struct SendPtr<T>(pub T);
// SAFETY: the wrapped value is an address, used only by the call it is passed to while its owner stays alive.
unsafe impl<T> Send for SendPtr<T> {}

// SAFETY: see `SendPtr`; a `(*const u8, usize)` view of a Python buffer held alive by the caller.
unsafe impl Sync for SendPtr<(*const u8, usize)> {}
