"""Shared fixtures: the `weightlift` binary under test and a scratch directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _find_binary() -> Path:
    env = os.environ.get("WEIGHTLIFT_BIN")
    if env:
        return Path(env)
    for profile in ("release", "debug"):
        candidate = ROOT / "target" / profile / "weightlift"
        if candidate.exists():
            return candidate
    found = shutil.which("weightlift")
    if found:
        return Path(found)
    raise RuntimeError("no weightlift binary: build it (cargo build) or set WEIGHTLIFT_BIN")


@pytest.fixture(scope="session")
def wl_bin() -> Path:
    return _find_binary()


class Cli:
    def __init__(self, binary: Path):
        self.binary = binary

    def run(self, *args: str | os.PathLike, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(self.binary), *map(str, args)], capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise AssertionError(f"weightlift {' '.join(map(str, args))} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def json(self, *args: str | os.PathLike) -> dict:
        return json.loads(self.run(*args).stdout)


@pytest.fixture(scope="session")
def wl(wl_bin: Path) -> Cli:
    return Cli(wl_bin)
