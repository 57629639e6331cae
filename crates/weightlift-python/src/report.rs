//! The report of the last load, kept for `weightlift.last_report()`, and reports handed to Python.

use std::sync::Mutex;

use pyo3::prelude::*;
use serde_json::Value;

/// The last load's report, for `weightlift.last_report()`.
pub(crate) static LAST_REPORT: Mutex<Option<Value>> = Mutex::new(None);

pub(crate) fn remember(report: Value) {
    *LAST_REPORT.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
}

/// A JSON value as Python data (through Python's own `json`).
pub(crate) fn json_to_py(py: Python<'_>, v: &Value) -> PyResult<Py<PyAny>> {
    let json = py.import("json")?;
    Ok(json.call_method1("loads", (v.to_string(),))?.unbind())
}
