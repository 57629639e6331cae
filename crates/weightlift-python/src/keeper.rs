//! `weightlift.keep`: a keeper running in this process (on threads of its own), for the loads of other processes.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use weightlift::keep::{Keeper, KeeperConfig};

use crate::device::parse_device;
use crate::errors::{invalid_argument, to_py};
use crate::report::json_to_py;

/// A keeper of this process (see `weightlift.keep`).
#[pyclass(module = "weightlift._native", frozen)]
pub(crate) struct NativeKeeper {
    /// Taken out by `stop`; each call clones it and lets the lock go before it releases the GIL (a call waiting in
    /// `wait` must not hold what another thread, holding the GIL, waits for).
    keeper: Mutex<Option<Arc<Keeper>>>,
    socket: PathBuf,
}

impl NativeKeeper {
    fn with<T>(&self, f: impl FnOnce(&Keeper) -> PyResult<T>) -> PyResult<T> {
        let k = self.keeper.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match k {
            Some(k) => f(&k),
            None => Err(invalid_argument("the keeper was stopped")),
        }
    }
}

#[pymethods]
impl NativeKeeper {
    #[new]
    #[pyo3(signature = (device, socket=None, budget=None))]
    fn new(py: Python<'_>, device: &str, socket: Option<PathBuf>, budget: Option<String>) -> PyResult<NativeKeeper> {
        let _cuda = crate::bridge::keep_callers_context();
        let device = parse_device(device)?;
        let budget = match budget {
            Some(b) => {
                Some(weightlift::io::parse_bytes(&b).map_err(|e| invalid_argument(&format!("budget {b:?}: {e}")))?)
            }
            None => None,
        };
        let settings = weightlift::Settings::from_env().map_err(to_py)?.keeper(weightlift::KeeperSocket::Off);
        let keeper = py.detach(|| Keeper::start(KeeperConfig { device, socket, budget, settings })).map_err(to_py)?;
        let socket = keeper.socket().to_path_buf();
        Ok(NativeKeeper { keeper: Mutex::new(Some(Arc::new(keeper))), socket })
    }

    /// Its socket.
    #[getter]
    fn socket(&self) -> PathBuf {
        let _cuda = crate::bridge::keep_callers_context();
        self.socket.clone()
    }

    /// Starts keeping `paths` (in the background).
    fn keep(&self, py: Python<'_>, paths: Vec<PathBuf>) -> PyResult<()> {
        let _cuda = crate::bridge::keep_callers_context();
        self.with(|k| py.detach(|| k.keep(&paths)).map_err(to_py))
    }

    /// Waits until no load is in progress.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        let _cuda = crate::bridge::keep_callers_context();
        self.with(|k| {
            py.detach(|| k.wait_idle());
            Ok(())
        })
    }

    /// What it holds, as a dict.
    fn status(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let _cuda = crate::bridge::keep_callers_context();
        let s = self.with(|k| Ok(k.status()))?;
        json_to_py(py, &serde_json::to_value(s).map_err(|e| invalid_argument(&e.to_string()))?)
    }

    /// Stops it (its loads in progress end first); what clients still map stays theirs until they free it.
    fn stop(&self, py: Python<'_>) {
        let _cuda = crate::bridge::keep_callers_context();
        let k = self.keeper.lock().unwrap_or_else(|p| p.into_inner()).take();
        // Another thread's call may hold a clone for a moment: the last one dropped stops it (Keeper's Drop).
        if let Some(k) = k {
            py.detach(|| match Arc::try_unwrap(k) {
                Ok(k) => k.stop(),
                Err(shared) => drop(shared),
            });
        }
    }

    /// Whether it is running.
    #[getter]
    fn running(&self) -> bool {
        let _cuda = crate::bridge::keep_callers_context();
        self.keeper.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }
}

/// What the keeper at `socket` holds, as a dict.
#[pyfunction]
pub(crate) fn keeper_status(py: Python<'_>, socket: PathBuf) -> PyResult<Py<PyAny>> {
    let _cuda = crate::bridge::keep_callers_context();
    let s = py.detach(|| weightlift::keep::status(&socket)).map_err(to_py)?;
    json_to_py(py, &serde_json::to_value(s).map_err(|e| invalid_argument(&e.to_string()))?)
}

/// The default socket of the keeper of `device`.
#[pyfunction]
pub(crate) fn keeper_socket(device: &str) -> PyResult<PathBuf> {
    let _cuda = crate::bridge::keep_callers_context();
    weightlift::keep::default_socket(parse_device(device)?).map_err(to_py)
}
