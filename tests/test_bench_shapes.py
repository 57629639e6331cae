"""bench/shapes.py and its parts (bench/wlbench): its checks catch a changed byte, and a small run on the host gives
well-formed, verified results (the GPU cases run on the GPU machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("safetensors")

import shapes  # noqa: E402
import wlbench.run  # noqa: E402
from wlbench.ceilings import parallel_read_rate  # noqa: E402
from wlbench.checkpoint import (CHUNK, RawBytes, _sums, flat_bytes, open_checkpoint, positional,  # noqa: E402
                                reference, verify)
from wlbench.families import FIRST_LOAD, HOST  # noqa: E402
from wlbench.files import Files, make_upstream  # noqa: E402
from wlbench.goals import best_peers, goals  # noqa: E402
from wlbench.methods import Options, Target  # noqa: E402
from wlbench.timing import Run  # noqa: E402


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shapes") / "upstream.safetensors"
    make_upstream(str(path), 3 << 20, seed=1)
    return path


def test_upstream_layout_is_llama_and_unaligned(upstream: Path) -> None:
    ckpt = open_checkpoint(str(upstream))
    names = ckpt.names()
    assert "model.embed_tokens.weight" in names and "lm_head.weight" in names
    assert all(e.dtype == "BF16" for e in ckpt.entries)
    assert ckpt.tensor_bytes >= 3 << 20
    assert any(e.offset % 4096 for e in ckpt.entries), "save_file's layout leaves offsets unaligned"


def test_checks_catch_one_changed_byte(upstream: Path) -> None:
    from safetensors.torch import load_file

    ckpt = open_checkpoint(str(upstream))
    ref = reference(ckpt, "cpu")
    loaded = load_file(str(upstream))
    verify(loaded, ref, ckpt, "cpu")
    name = ckpt.entries[len(ckpt.entries) // 2].name
    loaded[name] = loaded[name].clone()
    flat_bytes(loaded[name])[1234] ^= 1
    with pytest.raises(ValueError, match="differ"):
        verify(loaded, ref, ckpt, "cpu")

    raw = RawBytes(torch.from_numpy(np.fromfile(str(upstream), dtype=np.uint8)), 0)
    verify(raw, ref, ckpt, "cpu")
    raw.data[ckpt.entries[-1].offset + 7] ^= 0x80
    with pytest.raises(ValueError, match="differ"):
        verify(raw, ref, ckpt, "cpu")


def test_gpu_checksum_matches_itself_across_chunks() -> None:
    """The positional sums (used on GPUs) computed in one block and in several agree, and see a swap of words."""
    data = torch.randint(0, 256, (3 * CHUNK + 6,), dtype=torch.uint8)
    words = data.view(torch.int16).to(torch.int64) & 0xFFFF
    a, b = _sums(words, 0)
    half = words.numel() // 2
    a1, b1 = _sums(words[:half], 0)
    a2, b2 = _sums(words[half:], half)
    assert (a, b) == (a1 + a2, b1 + b2)
    assert a == int(words.sum())
    words[10], words[11] = 1, 2
    a, b = _sums(words, 0)
    swapped = words.clone()
    swapped[[10, 11]] = swapped[[11, 10]]
    assert _sums(swapped, 0) == (a, b - 1)


def test_host_run_is_well_formed_and_verified(upstream: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [sys.executable, str(ROOT / "bench" / "shapes.py"), "--file", str(upstream), "--device", "cpu",
           "--runs", "1", "--cases", "warm,tmpfs,host",
           "--methods", "weightlift.load_file,weightlift.safe_open,safetensors.load_file,np.fromfile",
           "--shm-dir", str(tmp_path / "shm")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    absent = [s["reason"] for s in out["skipped"] if s["reason"].startswith("import weightlift failed")]
    if absent:
        pytest.skip(absent[0])
    assert not [s for s in out["skipped"] if s["reason"] != "loads onto CUDA devices only"], out["skipped"]
    got = {(r["method"], r["case"]) for r in out["results"]}
    assert ("weightlift.load_file", "warm") in got and ("safetensors.load_file", "tmpfs") in got
    assert ("np.fromfile", "host, fresh memory, warm file (interleaved pairs)") in got
    for r in out["results"]:
        assert r["verified"] is True
        assert r["best"] >= r["median"] > 0 and len(r["runs_gbps"]) >= 1
    assert not (tmp_path / "shm" / upstream.name).exists(), "tmpfs copies are removed at exit"
    # safe_open's results carry each run's stream statistics: every tensor byte read in file order or on demand.
    tensor_bytes = open_checkpoint(str(upstream)).tensor_bytes
    for r in out["results"]:
        if r["method"].startswith("weightlift.safe_open"):
            (stats,) = r["stream_stats"]
            assert stats["streamed_bytes"] + stats["on_demand_bytes"] >= tensor_bytes, stats
            assert stats["prefetch_bytes"] > 0 and stats["wasted_bytes"] == 0, stats
        else:
            assert "stream_stats" not in r
    # The run measured the page cache's ceiling itself (no GPU: no pinned copy), named each case's best peer, and
    # judged the host goal by its own pairs; the goals it had no cases for say so.
    dd1 = out["ceilings"]["page_cache_dd1"]
    assert dd1["bytes"] == upstream.stat().st_size and dd1["best"] >= dd1["median"] > 0
    read16 = out["ceilings"]["page_cache_read16"]
    assert read16["threads"] == 16 and read16["bytes"] == dd1["bytes"] and read16["best"] >= read16["median"] > 0
    assert out["ceilings"]["tmpfs_read16"]["bytes"] == dd1["bytes"]
    assert "pinned_copy" not in out["ceilings"]
    warm = next(r for r in out["results"] if (r["method"], r["case"]) == ("weightlift.load_file", "warm"))
    assert warm["best_peer"]["method"] == "safetensors.load_file"
    assert warm["best_peer"]["ratio_best"] == pytest.approx(warm["best"] / warm["best_peer"]["best"], rel=1e-3)
    judged = {g["goal"]: g for g in out["goals"]}
    host = judged["host: load_file into fresh memory / np.fromfile"]
    pairs = next(r for r in out["results"] if r["method"] == "weightlift.load_file" and r["case"].startswith("host"))
    assert host["figure"] == pairs["median_ratio_to_np_fromfile"] and host["met"] == (host["figure"] >= 1.0)
    assert "not_measured" in judged["warm: load_file / pinned copy ceiling"]
    assert "not_measured" in judged["restart after a cold load / warm load_file"]


def test_a_reading_threads_error_is_raised(upstream: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: 0)  # every read comes back short
    with pytest.raises(OSError, match="short read at"):
        parallel_read_rate(str(upstream), 4, 1)


COLD = "cold: load_file / disk ceiling (the faster of 16 x dd iflag=direct and 16 buffered readers)"


def test_goals_are_judged_by_the_runs_own_figures() -> None:
    def result(method: str, case: str, best: float, median: float, **extra: object) -> dict:
        return {"method": method, "case": case, "peer": not method.startswith("weightlift"), "best": best,
                "median": median, **extra}

    wl = "weightlift.load_file"
    results = [
        result(wl, "warm", 50.0, 45.0), result(wl, "tmpfs", 40.0, 39.0), result(wl, "cold", 2.0, 1.9),
        result("weightlift.safe_open get_tensor file-order", "warm", 44.0, 41.0),
        result("weightlift.safe_open get_tensor random-order", "warm", 30.0, 35.0),
        result(wl, "restart", 43.0, 40.0),
        result(wl, FIRST_LOAD, 30.0, 29.0, median_first_to_second_time_ratio=1.35),
        result(wl, HOST, 9.0, 8.0, median_ratio_to_np_fromfile=0.97),
        result("kvikio pread", "warm", 52.0, 40.0),
    ]
    ceilings = {"pinned_copy": {"best": 54.0, "median": 53.0}, "disk_direct_dd16": {"best": 1.5, "median": 1.4},
                "disk_buffered_read16": {"best": 1.9, "median": 1.8},
                "page_cache_read16": {"best": 40.0, "median": 39.0}}
    got = {g["goal"]: g for g in goals(results, ceilings)}
    expect = {
        "warm: load_file / pinned copy ceiling": (50 / 54, True),
        "tmpfs: load_file / pinned copy ceiling": (40 / 54, False),
        COLD: (2.0 / 1.9, True),
        "warm: safe_open get_tensor per key, file order / load_file": (41 / 45, True),
        "warm: safe_open get_tensor per key, random order / load_file": (35 / 45, False),
        "restart after a cold load / warm load_file": (40 / 45, False),
        "first load of a fresh process / its second load": (1.35, False),
        "host: load_file into fresh memory / np.fromfile": (0.97, False),
    }
    for name, (figure, met) in expect.items():
        assert got[name]["figure"] == pytest.approx(figure, abs=1e-4), name
        assert got[name]["met"] is met, name
    assert "not_measured" in got["cold: safe_open get_tensor per key, file order / load_file"]
    # A load past its ceiling is flagged: that ceiling understates the machine.
    assert "above_ceiling" in got[COLD]
    assert "above_ceiling" not in got["warm: load_file / pinned copy ceiling"]
    # Beside the pinned copy, the share of the host's own read rate (measured for the page cache, not for tmpfs).
    assert got["warm: load_file / pinned copy ceiling"]["of_host_read_rate"] == {
        "ceiling": "page_cache_read16", "host_best": 40.0, "ratio": 1.25}
    assert "of_host_read_rate" not in got["tmpfs: load_file / pinned copy ceiling"]
    results.append(result("np.fromfile .to(device)", "warm", 44.0, 43.0))  # a steadier peer, slower at its best
    best_peers(results)
    assert results[0]["best_peer"] == {"method": "kvikio pread", "best": 52.0, "median": 40.0,
                                       "ratio_best": round(50 / 52, 4), "median_method": "np.fromfile .to(device)",
                                       "ratio_median": round(45 / 43, 4)}
    assert "best_peer" not in results[1]  # no peer measured tmpfs


def test_positional_checksum_of_an_odd_start_equals_that_of_a_copy() -> None:
    data = torch.randint(0, 256, (10_001,), dtype=torch.uint8)
    view = data[1:]
    assert view.storage_offset() == 1
    assert positional(view) == positional(view.clone())
    changed = view.clone()
    changed[5000] ^= 1
    assert positional(changed) != positional(view)


def test_a_stop_keeps_what_was_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM during a family ends that family and the rest; the families before it keep their results."""
    run = Run("cpu", "cpu", 1, Options(0, 1), "fadvise")
    monkeypatch.setattr(wlbench.run, "measure_ceilings", lambda *a: {"page_cache_dd1": {"best": 1.0, "median": 1.0}})
    monkeypatch.setattr(wlbench.run, "family_storage",
                        lambda run, case, t, why: run.results.append({"method": "m", "case": case}))

    def interrupted(*a: object) -> None:
        raise wlbench.run.OutOfTime("SIGTERM")

    monkeypatch.setattr(wlbench.run, "family_host", interrupted)
    args = shapes.parse_args(["--file", "x", "--cases", "warm,host,tmpfs"])
    files = Files(Target("disk", None))
    files.tmpfs = Target("tmpfs", None)
    seconds = wlbench.run.run_families(run, args, ["warm", "host", "tmpfs"], files, "ref.json")
    assert set(seconds) == {"ceilings", "warm"}
    assert run.results == [{"method": "m", "case": "warm"}]
    assert run.stopped == {"family": "host", "by": "SIGTERM", "families_not_finished": ["host", "tmpfs"]}
    assert [(s["case"], s["reason"]) for s in run.skipped] == [
        (f, "not finished: the run was stopped by SIGTERM during host") for f in ("host", "tmpfs")]


def test_a_time_limit_still_writes_the_json(upstream: Path, tmp_path: Path) -> None:
    """--time-limit (as SIGTERM from `timeout`) ends the run where it is, and the JSON still comes out, judged on
    what was measured, with the tmpfs copy removed."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out_file = tmp_path / "out.json"
    cmd = [sys.executable, str(ROOT / "bench" / "shapes.py"), "--file", str(upstream), "--device", "cpu",
           "--runs", "1", "--cases", "warm,tmpfs,host", "--shm-dir", str(tmp_path / "shm"), "--time-limit", "0",
           "--out", str(out_file)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert json.loads(out_file.read_text()) == out
    assert out["stopped"]["by"] == "--time-limit 0 s"
    assert out["stopped"]["family"] == "ceilings"  # the alarm is set just before the ceilings, 1 ms ahead
    assert out["stopped"]["families_not_finished"] == ["warm", "tmpfs", "host"]
    assert out["results"] == []
    assert all("not_measured" in g for g in out["goals"])
    assert not (tmp_path / "shm" / upstream.name).exists(), "tmpfs copies are removed at exit"


def test_tuned_peer_rows_run_where_their_authors_advise_and_record_what_they_chose(
        upstream: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer's page-cache row runs in warm and tmpfs and is skipped for cold with the reason; what a load chose is
    kept with its result; the switches it sets are gone after the load."""
    import wlbench.methods as methods
    from wlbench.timing import measure

    names = [m.name for m in methods.methods()]
    for default, tuned in [("fastsafetensors (nogds)", "fastsafetensors (nogds, buffered)"),
                           ("runai-model-streamer", "runai-model-streamer (buffered)"),
                           ("instanttensor", "instanttensor (buffered)")]:
        assert default in names and tuned in names
        assert methods.method_named(tuned).cases == ("warm", "tmpfs")
        assert methods.method_named(default).cases is None

    seen_env = []

    def load(t: Target, dev: str, o: Options) -> dict:
        with methods._env(RUNAI_STREAMER_FS_STRATEGY="sync_buffered"):
            seen_env.append(os.environ["RUNAI_STREAMER_FS_STRATEGY"])
            methods.last_choice.update({"strategy": "sync_buffered"})
        return methods.method_named("safetensors.load_file").load(t, dev, o)

    monkeypatch.delenv("RUNAI_STREAMER_FS_STRATEGY", raising=False)
    fake = methods.Method("peer (buffered)", True, load, cases=methods.BUFFERED_CASES, cases_why=methods.BUFFERED_WHY)
    run = Run("cpu", "cpu", 2, Options(0, 1), "fadvise")
    ckpt = open_checkpoint(str(upstream))
    run.refs[ckpt.path] = reference(ckpt, "cpu")
    t = Target("disk", ckpt)
    measure(run, fake, t, lambda files: None, "cold")
    assert run.results == [] and run.skipped[-1]["reason"] == methods.BUFFERED_WHY
    measure(run, fake, t, lambda files: None, "warm")
    assert [r["case"] for r in run.results] == ["warm"], run.skipped
    assert run.results[0]["chose"] == {"strategy": "sync_buffered"}
    assert seen_env == ["sync_buffered"] * 2
    assert "RUNAI_STREAMER_FS_STRATEGY" not in os.environ


def test_a_sharded_checkpoint_runs_with_every_shard_copied_and_measured(tmp_path: Path) -> None:
    """A multi-file checkpoint (save_pretrained's shards and index, written by --make-sharded): the tmpfs copy holds
    every shard, the ceilings read every shard (not the index), and each load is checked against the shards."""
    pytest.importorskip("transformers")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    folder = tmp_path / "llama"
    cmd = [sys.executable, str(ROOT / "bench" / "shapes.py"), "--make-sharded", str(folder), "--size", "6MB",
           "--shard-size", "1MB", "--device", "cpu", "--runs", "1", "--cases", "warm,tmpfs",
           "--methods", "weightlift.load_file,safetensors.load_file,safetensors.safe_open,prefetch", "--shm-dir",
           str(tmp_path / "shm")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    if [s for s in out["skipped"] if s["reason"].startswith("import weightlift failed")]:
        pytest.skip("weightlift is not importable here")
    shards = sorted(folder.glob("*.safetensors"))
    assert len(shards) >= 3, shards
    assert out["files"]["upstream"]["files"] == len(shards)
    total = sum(s.stat().st_size for s in shards)
    assert out["files"]["upstream"]["file_bytes"] == total
    assert out["files"]["tmpfs"]["files"] == len(shards)
    for k in ("page_cache_dd1", "page_cache_read16", "tmpfs_read16"):
        assert out["ceilings"][k]["bytes"] == total, (k, out["ceilings"][k])
    got = {(r["method"], r["case"]) for r in out["results"]}
    assert {("weightlift.load_file", "warm"), ("safetensors.load_file", "tmpfs"),
            ("safetensors.safe_open get_tensor random-order", "warm")} <= got, got  # one handle per shard
    # The prefetch style loads onto CUDA devices only: on the CPU each row says so rather than failing.
    why = {(k["method"], k["case"]): k["reason"] for k in out["skipped"]}
    for m in ("weightlift.safe_open prefetch", "safetensors.safe_open prefetch"):
        assert "CUDA" in why[(m, "warm")], why
    assert all(r["verified"] is True for r in out["results"])
    assert not (tmp_path / "shm").exists() or not list((tmp_path / "shm").iterdir()), "tmpfs copies are removed"
    # Made once: a second --make-sharded --make-only reuses it.
    again = subprocess.run(cmd[:2] + ["--make-sharded", str(folder), "--size", "6MB", "--shard-size", "1MB",
                                      "--device", "cpu", "--make-only"], capture_output=True, text=True, env=env,
                           timeout=600)
    assert again.returncode == 0 and "reusing" in again.stderr, again.stderr
