"""The C library as docs/c-api.md installs it: scripts/install-capi under a prefix, examples/c/load.c built with the
flags of the installed weightlift.pc, run without LD_LIBRARY_PATH."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _built_library() -> Path:
    """The folder of a libweightlift_capi.so cargo built (`cargo test` leaves it in deps/)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    for profile in ("debug", "release"):
        for folder in (target / profile, target / profile / "deps"):
            if (folder / "libweightlift_capi.so").exists():
                return folder
    pytest.skip(f"no libweightlift_capi.so under {target} (cargo build -p weightlift-capi)")


def _pc_flags(pc: Path) -> list[str]:
    """Cflags and Libs of a .pc file: pkg-config's answer where it is installed, else the file's own lines."""
    if shutil.which("pkg-config"):
        env = dict(os.environ, PKG_CONFIG_PATH=str(pc.parent))
        out = subprocess.run(["pkg-config", "--cflags", "--libs", "weightlift"], capture_output=True, text=True, env=env, check=True)
        return out.stdout.split()
    text = pc.read_text()
    variables = dict(re.findall(r"^(\w+)=(.*)$", text, re.M))
    expand = lambda s: re.sub(r"\$\{(\w+)\}", lambda m: expand(variables[m.group(1)]), s)  # noqa: E731
    fields = dict(re.findall(r"^(\w+): (.*)$", text, re.M))
    return expand(fields["Cflags"]).split() + expand(fields["Libs"]).split()


def test_installed_library_runs_without_ld_library_path(tmp_path, wl):
    if not shutil.which("cc"):
        pytest.skip("no C compiler (cc)")
    prefix = tmp_path / "prefix"
    env = dict(os.environ, WEIGHTLIFT_CAPI_LIBDIR=str(_built_library()))
    subprocess.run([str(ROOT / "scripts" / "install-capi"), str(prefix)], check=True, env=env, capture_output=True)
    pc = prefix / "lib" / "pkgconfig" / "weightlift.pc"
    assert (prefix / "include" / "weightlift.h").exists() and pc.exists()
    prog = tmp_path / "load"
    subprocess.run(["cc", "-O1", str(ROOT / "examples" / "c" / "load.c"), *_pc_flags(pc), "-o", str(prog)], check=True)
    ckpt = tmp_path / "m.safetensors"
    wl.run("generate", ckpt, "--size", "2000000", "--seed", "3")
    run_env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run([str(prog), str(ckpt)], capture_output=True, text=True, env=run_env)
    assert out.returncode == 0, out.stderr
    assert " 0 mismatches" in out.stdout, out.stdout
