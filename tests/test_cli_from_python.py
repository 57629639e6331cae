"""The weightlift command that the Python package brings: ``python -m weightlift`` and the ``weightlift`` script of
an installed package run the same command line as the cargo-built binary (the native module runs it)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "weightlift", *map(str, args)], capture_output=True, text=True, timeout=300)


def test_python_m_weightlift_is_the_cli(tmp_path, wl):
    path = tmp_path / "m.safetensors"
    made = _module("generate", path, "--size", "1000000", "--seed", "5")
    assert made.returncode == 0, made.stderr
    ours = _module("inspect", path, "--json")
    assert ours.returncode == 0, ours.stderr
    assert json.loads(ours.stdout) == wl.json("inspect", path, "--json")
    loaded = _module("load", path)
    assert loaded.returncode == 0, loaded.stderr


def test_python_m_weightlift_version_help_and_errors(wl):
    version = _module("--version")
    assert version.returncode == 0 and version.stdout == wl.run("--version").stdout
    assert _module("--help").returncode == 0
    bad = _module("no-such-command")
    assert bad.returncode == 2 and "no-such-command" in bad.stderr
    missing = _module("inspect", "/nonexistent/m.safetensors")
    assert missing.returncode == 2 and "weightlift: error:" in missing.stderr and "Traceback" not in missing.stderr


def _console_script() -> "Path | None":
    """The weightlift script the installed distribution of the imported package wrote, None if it declares none."""
    import weightlift

    here = Path(weightlift.__file__).resolve().parent
    for dist in importlib.metadata.distributions(name="weightlift"):
        if Path(dist.locate_file("weightlift")).resolve() != here:
            continue  # another install of weightlift on the path
        if not any(ep.name == "weightlift" and ep.value == "weightlift.__main__:main" for ep in dist.entry_points):
            return None
        recorded = [Path(dist.locate_file(f)).resolve() for f in dist.files or [] if f.name == "weightlift" and f.parent.name == "bin"]
        # pip install --target records the script's path as for a venv; it lies beside the package there.
        candidates = [*recorded, here.parent / "bin" / "weightlift", Path(sys.executable).parent / "weightlift"]
        return next((c for c in candidates if c.exists()), candidates[0])
    return None


def test_installed_package_brings_the_weightlift_command(tmp_path, wl):
    script = _console_script()
    if script is None:
        pytest.skip("weightlift is not installed as a package here (pip install . installs its command)")
    assert script.exists(), f"the package declares the weightlift command but {script} is missing"
    path = tmp_path / "m.safetensors"
    wl.run("generate", path, "--size", "1000000", "--seed", "6")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))  # a --target install is found as here
    out = subprocess.run([str(script), "inspect", str(path), "--json"], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == wl.json("inspect", path, "--json")


def test_log_levels_follow_the_flags():
    import logging

    from weightlift.__main__ import _log_level

    assert _log_level(["inspect", "f"]) == logging.WARNING
    assert _log_level(["-v", "load", "f"]) == logging.INFO
    assert _log_level(["-vv", "load", "f"]) == logging.DEBUG
    assert _log_level(["load", "--verbose", "--verbose", "f"]) == logging.DEBUG
