"""weightlift.distributed on torch.distributed with gloo: 2 and 3 processes on this machine, device cpu. Every
rank's tensors are compared byte for byte with the `safetensors` package's load (and weightlift's single-process
load), shards with slices of the full tensor; storage bytes are counted; a failing rank and a departed rank make
every other rank raise instead of hanging (each process has a deadline)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
weightlift = pytest.importorskip("weightlift")
st = pytest.importorskip("safetensors.torch")
wd = pytest.importorskip("weightlift.distributed")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no torch.distributed with gloo", allow_module_level=True)

WORKER = Path(__file__).with_name("distributed_worker.py")
sys.path.insert(0, str(WORKER.parent))
from distributed_worker import digest  # noqa: E402  (the workers' digest: one definition for both sides)
DEADLINE_S = 90




@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("dist")
    g = torch.Generator().manual_seed(13)
    mixed = {
        "rows": torch.randn(37, 53, generator=g),
        "cols": torch.randn(37, 53, generator=g),
        "w3d": torch.randn(5, 7, 9, generator=g).to(torch.bfloat16),
        "w3d_mid": torch.randn(5, 7, 9, generator=g).to(torch.float16),
        "big": torch.randn(300, 101, generator=g),
        "i64": torch.randint(-(2**40), 2**40, (17,), generator=g),
        "u8": torch.randint(0, 255, (333,), generator=g, dtype=torch.uint8),
        "bool": torch.rand(7, generator=g) > 0.5,
        "f64": torch.randn(3, 3, generator=g).to(torch.float64),
        "f8": torch.randn(64, generator=g).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    st.save_file(mixed, str(d / "mixed.safetensors"), metadata={"format": "pt"})
    shards = {
        "model-00001-of-00002.safetensors": {"a": torch.randn(64, 33, generator=g), "b": torch.arange(999)},
        "model-00002-of-00002.safetensors": {"c": torch.randn(129, generator=g).to(torch.bfloat16), "d": torch.randn(2, 2, generator=g)},
    }
    weight_map = {}
    for fname, ts in shards.items():
        st.save_file(ts, str(d / fname))
        weight_map.update({k: fname for k in ts})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    weightlift.save_file({k: v for k, v in mixed.items() if k != "f8"}, d / "aligned.safetensors", align=4096)
    with open(d / "mixed.safetensors", "rb") as f:
        size = os.path.getsize(d / "mixed.safetensors")
    return {
        "dir": d,
        "mixed": str(d / "mixed.safetensors"),
        "index": str(d / "model.safetensors.index.json"),
        "aligned": str(d / "aligned.safetensors"),
        "eio_offset": size - 100,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(ckpt: dict, world: int, tmp: Path) -> list[dict]:
    """Starts ``world`` worker processes on ``ckpt`` (the checkpoints the worker's scenarios load, by name) and
    returns each rank's results once every rank has exited."""
    cfg = tmp / "cfg.json"
    cfg.write_text(json.dumps({k: v for k, v in ckpt.items() if k != "dir"}))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEIGHTLIFT_INJECT")}
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(r), str(world), str(port), str(cfg), str(tmp)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)
    ]
    logs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=DEADLINE_S)
            logs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{world} ranks did not finish within {DEADLINE_S} s (a hang)")
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{log}"
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def ranks(request, ckpt, tmp_path_factory) -> tuple[int, list[dict]]:
    world = request.param
    return world, run_ranks(ckpt, world, tmp_path_factory.mktemp(f"world{world}"))


def ok(result: dict) -> dict:
    assert "error" not in result, result.get("trace")
    return result["tensors"]


def test_replicated_equals_safetensors_and_single_process(ranks, ckpt):
    world, results = ranks
    cases = [("all_gather", ckpt["mixed"]), ("broadcast", ckpt["mixed"]), ("index", ckpt["index"]), ("aligned", ckpt["aligned"])]
    for key, path in cases + [("lockstep", ckpt["mixed"]), ("contiguous", ckpt["mixed"]), ("one_reader", ckpt["mixed"])]:
        if key == "index":
            ref = {}
            for f in sorted(Path(ckpt["dir"]).glob("model-*.safetensors")):
                ref.update(st.load_file(str(f)))
        else:
            # upstream also sees weightlift's alignment padding, which weightlift hides
            ref = {k: v for k, v in st.load_file(path).items() if not k.startswith("__weightlift_pad_")}
        expected = digest(ref)
        assert digest(weightlift.load_file(path)) == expected, key
        for r, res in enumerate(results):
            assert ok(res[key]) == expected, f"{key}, rank {r}"


def test_each_byte_read_from_storage_once(ranks, ckpt):
    world, results = ranks
    for key in ("all_gather", "broadcast", "index", "aligned", "lockstep", "one_reader"):
        reports = [res[key]["report"] for res in results]
        tensor_bytes = reports[0]["checkpoint_bytes"]
        summary = reports[0]["summary"]
        assert [r["rank"] for r in reports] == list(range(world))
        assert summary["world"] == world
        assert summary["storage_requested_bytes"] == tensor_bytes, key
        assert sum(r["storage_requested_bytes"] for r in reports) == tensor_bytes, key
        # Alignment to the device block may widen reads; never by whole copies of the checkpoint.
        assert tensor_bytes <= summary["storage_bytes"] < tensor_bytes + world * 64 * 1024, (key, summary)
        assert all(r["bytes"] == tensor_bytes for r in reports), key
        if world > 1 and key not in ("index", "one_reader"):
            assert all(r["group_bytes_received"] > 0 and r["storage_requested_bytes"] > 0 for r in reports), key


def test_the_report_breaks_each_step_down(ranks):
    """Per step: when this rank's read started and ended, when the status exchange and the collective's launch
    were done; the seconds spent reading, exchanging and waiting for collectives and for the reader."""
    world, results = ranks
    for key, read_ahead, readers in (("all_gather", True, "all"), ("lockstep", False, "all"), ("contiguous", True, "all"), ("one_reader", True, "one")):
        for r, res in enumerate(results):
            rep = res[key]["report"]
            assert (rep["read_ahead"], rep["readers"]) == (read_ahead, readers), key
            assert rep["read_depth"] == (2 if read_ahead else 1), key  # read-ahead: two steps read at once
            assert rep["span"] == ("contiguous" if key == "contiguous" else "interleaved"), key
            steps = rep["timeline"]
            assert len(steps) == rep["steps"] > 1, key
            for read0, read1, exchanged, issued in steps:
                if readers == "one" and r != 0:
                    assert read0 == read1 == -1.0, (key, r)  # only the first rank reads
                else:
                    assert 0 <= read0 <= read1 <= exchanged <= issued <= rep["seconds"], (key, r, steps)
            if not read_ahead:
                # lockstep: step k + 1's read starts only after step k's collective was launched
                assert all(steps[k + 1][0] >= steps[k][3] for k in range(len(steps) - 1)), steps
            assert rep["read_seconds"] > 0 or (readers == "one" and r != 0)
            assert rep["exchange_seconds"] >= 0 and rep["collective_wait_seconds"] >= 0 and rep["read_wait_seconds"] >= 0
    # one reader: rank 0 read every byte, the others none
    reports = [res["one_reader"]["report"] for res in results]
    assert reports[0]["storage_requested_bytes"] == reports[0]["checkpoint_bytes"]
    assert all(rep["storage_requested_bytes"] == 0 for rep in reports[1:])


def test_shards_equal_slices_of_the_full_tensor(ranks, ckpt):
    world, results = ranks
    full = st.load_file(ckpt["mixed"])
    dims = {"rows": 0, "cols": 1, "w3d": 2, "w3d_mid": 1}
    for r, res in enumerate(results):
        got = ok(res["shard_dict"])
        want = {n: (torch.tensor_split(t, world, dims[n])[r] if n in dims else t) for n, t in full.items()}
        assert got == digest(want), f"rank {r}"
        got = ok(res["shard_callable"])
        want = {n: (torch.tensor_split(t, world, t.dim() - 1)[r] if t.dim() >= 2 else t) for n, t in full.items()}
        assert got == digest(want), f"rank {r}"
        got = ok(res["shard_segments"])
        want = {n: t for n, t in full.items()}
        want["cols"] = torch.tensor_split(full["cols"], world + 1, 1)[r]
        want["w3d"] = torch.tensor_split(full["w3d"], world + 1, 2)[world - r]
        assert got == digest(want), f"rank {r}"
    # Slices along dims > 0 with the group's size are exchanged: each byte asked of storage once in all, rows and
    # columns alike. (The bytes actually read can be more here: the engine merges a rank's reads less than 64 KiB
    # apart, and this file's tensors are smaller than that.)
    for key in ("shard_dict", "shard_callable"):
        reports = [res[key]["report"] for res in results]
        summary = reports[0]["summary"]
        assert summary["storage_requested_bytes"] == summary["checkpoint_bytes"], key
        assert all(r["group_bytes_received"] > 0 for r in reports), key
    assert results[0]["shard_dict"]["report"]["sharded_tensors"] == 4


def test_split_by_host_reads_once_per_host(ranks, ckpt):
    world, results = ranks
    expected = digest(st.load_file(ckpt["mixed"]))
    for r, res in enumerate(results):
        assert ok(res["split_host"]) == expected, f"rank {r}"
    summary = results[0]["split_host"]["report"]["summary"]
    assert summary["hosts"] == 2
    assert summary["storage_requested_bytes"] == 2 * summary["checkpoint_bytes"]
    alone = results[-1]["split_host"]["report"]
    assert alone["storage_requested_bytes"] == alone["checkpoint_bytes"] and alone["group_bytes_received"] == 0


def test_a_failing_rank_makes_every_rank_raise(ranks, ckpt):
    world, results = ranks
    errors = [res["eio"] for res in results]
    assert all(e.get("distributed_error") and e.get("weightlift_error") for e in errors), errors
    failed = {int(k) for k in errors[0]["failures"]}
    assert len(failed) == 1, errors[0]
    (bad,) = failed
    for r, e in enumerate(errors):
        assert {int(k) for k in e["failures"]} == failed
        assert f"rank {bad}" in e["message"] and ("EIO" in e["message"] or "nput/output error" in e["message"]), e["message"]
        assert (e["cause"] is not None) == (r == bad), (r, e["cause"])
    # With one reader, its failure reaches every rank the same way.
    for e in (res["one_reader_eio"] for res in results):
        assert e.get("distributed_error") and {int(k) for k in e["failures"]} == {0}, e
    # The group is still usable: the next load succeeds everywhere.
    expected = digest(st.load_file(ckpt["mixed"]))
    assert all(ok(res["after_eio"]) == expected for res in results)
    # Another checkpoint on one rank: every rank refuses before any data moves.
    for e in (res["mismatch"] for res in results):
        assert e.get("distributed_error") and "ranks [1] see other tensors" in e["message"], e
    # A bad shard spec on one rank is reported by every rank, before any data moves.
    for e in (res["bad_spec"] for res in results):
        assert e.get("distributed_error") and set(e["failures"]) == {"1"} and "does not fit" in e["message"], e


PAD = "__weightlift_pad"


def tensor_ranges(path: str) -> list[tuple[int, int]]:
    """The absolute byte ranges of a safetensors file's tensors, from its header."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return [
        (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
        for k, v in header.items()
        if k != "__metadata__" and not k.startswith(PAD)
    ]


def test_randomized_faults_on_distributed_loads(ranks, ckpt):
    """Rounds of replicated loads with an EIO at a random offset (the workers' `soak`): in each round every rank
    succeeds with every byte right, or every rank raises DistributedError naming the same failed rank; a fault inside
    a tensor's bytes always fails the round (each byte is read by one rank); the group stays usable throughout."""
    world, results = ranks
    soaks = [res["soak"] for res in results]
    assert all(len(s) == len(soaks[0]) > 0 for s in soaks)
    # weightlift's padding tensors (of aligned files) are not handed out.
    references = {
        name: digest({k: v for k, v in st.load_file(ckpt[name]).items() if not k.startswith(PAD)})
        for name in ("mixed", "aligned")
    }
    index = json.loads(Path(ckpt["index"]).read_text())
    merged = {}
    for shard in sorted(set(index["weight_map"].values())):
        merged.update(st.load_file(str(ckpt["dir"] / shard)))
    references["index"] = digest(merged)
    failed_rounds = 0
    for i, rounds in enumerate(zip(*soaks)):
        r0 = rounds[0]
        what = f"round {i}: {r0['name']}, EIO at {r0['offset']} of {Path(r0['target']).name}, {r0['collective']}, blocks of {r0['block']}"
        inside = r0["offset"] is not None and any(a <= r0["offset"] < b for a, b in tensor_ranges(r0["target"]))
        if all("tensors" in r for r in rounds):
            assert not inside, f"{what}: a fault inside a tensor's bytes ended in success"
            for r in rounds:
                assert r["tensors"] == references[r0["name"]], f"{what}: wrong bytes delivered as success"
            continue
        failed_rounds += 1
        assert r0["offset"] is not None, f"{what}: failed without a fault: {rounds}"
        for r in rounds:
            assert r.get("distributed_error") and r.get("weightlift_error"), f"{what}: {r}"
            assert r["failures"] == r0["failures"] and len(r["failures"]) == 1, f"{what}: {r}"
            assert "EIO" in r["message"] or "nput/output error" in r["message"], f"{what}: {r['message']}"
    print(f"distributed soak, {world} ranks: {len(soaks[0])} rounds, {failed_rounds} failed as they should")
    assert failed_rounds > 0


def test_a_silent_rank_makes_the_others_raise_not_hang(ranks):
    world, results = ranks
    for r in range(world - 1):
        e = results[r]["rank_hangs"]
        assert e.get("distributed_error") and "did not complete within 2 s" in e["message"], e
        assert e["elapsed_s"] < 6, e["elapsed_s"]
    assert "rank_hangs" not in results[world - 1]


def test_without_process_group_falls_back_to_single_process(ckpt):
    assert not torch.distributed.is_initialized()
    expected = digest(st.load_file(ckpt["mixed"]))
    assert digest(wd.load_file(ckpt["mixed"], device="cpu")) == expected
    report = wd.last_report()
    assert report["world"] == 1 and report["split"] == "single process"
    assert report["storage_requested_bytes"] == report["checkpoint_bytes"]
    got = wd.load_file(ckpt["mixed"], device="cpu", shard={"cols": (1, 4, 3), "w3d": (-1, 2, 0)})
    full = st.load_file(ckpt["mixed"])
    assert digest({"cols": got["cols"], "w3d": got["w3d"]}) == digest({"cols": torch.tensor_split(full["cols"], 4, 1)[3], "w3d": torch.tensor_split(full["w3d"], 2, 2)[0]})
    with pytest.raises(weightlift.TensorNotFoundError):
        wd.load_file(ckpt["mixed"], device="cpu", shard={"nope": (0, 2, 0)})
    with pytest.raises(weightlift.InvalidArgumentError):
        wd.load_file(ckpt["mixed"], device="cpu", shard={"scalar": (0, 2, 0)})
    with pytest.raises(weightlift.InvalidArgumentError):
        wd.load_file(ckpt["mixed"], device="cpu", split="nowhere")


def test_slices_of_every_dim_match_tensor_split(ckpt):
    """Uneven sizes, every dim, world larger than the dim (empty slices)."""
    full = st.load_file(ckpt["mixed"])
    for name in ("rows", "cols", "w3d", "w3d_mid", "big"):
        t = full[name]
        for dim in range(t.dim()):
            for world in (1, 2, 3, 7, t.shape[dim] + 2):
                for rank in {0, world // 2, world - 1}:
                    got = wd.load_file(ckpt["mixed"], device="cpu", shard={name: (dim, world, rank)})[name]
                    assert digest({name: got}) == digest({name: torch.tensor_split(t, world, dim)[rank]}), (name, dim, world, rank)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_loads_from_a_bucket_equal_safetensors(ckpt, s3, tmp_path, device):
    """2 ranks on checkpoints in an S3 bucket (s3s-fs), into host memory over gloo and onto two GPUs over NCCL
    (where there are two): replicated in several steps with both collectives, a shard index whose shards are found
    beside it, slices along dims 0 and 1; every tensor of every rank ``torch.equal`` to safetensors' own load of the
    local file, each byte asked of the server once in all."""
    if device == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip(f"needs two GPUs ({torch.cuda.device_count()} visible)")
    shutil.copy(ckpt["mixed"], s3 / "mixed.safetensors")
    (s3 / "sharded").mkdir(exist_ok=True)
    index = json.loads(Path(ckpt["index"]).read_text())
    for name in ["model.safetensors.index.json", *sorted(set(index["weight_map"].values()))]:
        shutil.copy(Path(ckpt["dir"]) / name, s3 / "sharded" / name)
    urls = {"mixed": "s3://bucket/mixed.safetensors", "index": "s3://bucket/sharded/model.safetensors.index.json"}
    world = 2
    results = run_ranks({"remote": urls, "device": device}, world, tmp_path)
    full = st.load_file(ckpt["mixed"])
    merged = {}
    for shard in sorted(set(index["weight_map"].values())):
        merged.update(st.load_file(str(Path(ckpt["dir"]) / shard)))
    for r, res in enumerate(results):
        slices = {"rows": torch.tensor_split(full["rows"], world, 0)[r], "cols": torch.tensor_split(full["cols"], world, 1)[r]}
        for key, want in [("all_gather", full), ("broadcast", full), ("index", merged), ("shard", {**full, **slices})]:
            assert "error" not in res[key], res[key].get("trace")
            got = torch.load(tmp_path / f"rank{r}-{key}.pt")
            assert sorted(got) == sorted(want), (key, r)
            for name, t in want.items():
                assert got[name].dtype == t.dtype and got[name].shape == t.shape, (key, r, name)
                assert torch.equal(got[name], t), (key, r, name)
            summary = res[key]["report"]["summary"]
            assert summary["world"] == world and summary["storage_requested_bytes"] == summary["checkpoint_bytes"], (key, summary)
