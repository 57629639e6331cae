"""weightlift.keep: a keeper started from Python serves another process's load_file, every tensor equal to what
safetensors gives; the report says when it did and why it did not; the CLI's keeper answers --status. On the CPU
(host memory kept in sealed memfds); on cuda:0 as well where a GPU is usable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
weightlift = pytest.importorskip("weightlift")
st = pytest.importorskip("safetensors.torch")

GPU = torch.cuda.is_available() and weightlift.cuda_available()
DEVICES = ["cpu"] + (["cuda:0"] if GPU else [])


def _checkpoint(path, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "embed.weight": torch.randn(512, 256, generator=g).to(torch.bfloat16),
        "layer.0.q": torch.randn(256, 256, generator=g),
        "layer.0.norm": torch.randn(256, generator=g).to(torch.float16),
        "layer.0.ids": torch.randint(-(2**31), 2**31 - 1, (1000,), generator=g, dtype=torch.int32),
    }
    st.save_file(tensors, str(path))


@pytest.fixture
def private(tmp_path):
    d = tmp_path / "sock"
    d.mkdir(mode=0o700)
    return d


_CHILD = """
import json, sys, weightlift, safetensors.torch as st, torch
path, device, how, ref = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
if how == "safe_open":
    with weightlift.safe_open(path, framework="pt", device=device) as f:
        sd = {k: f.get_tensor(k) for k in sorted(f.keys(), reverse=True)}
else:
    sd = weightlift.load_file(path, device=device)
ref = st.load_file(ref)
same = all(sd[k].dtype == ref[k].dtype and sd[k].shape == ref[k].shape and torch.equal(sd[k].cpu(), ref[k]) for k in ref)
rep = weightlift.last_report()
print(json.dumps({"same": same and sorted(sd) == sorted(ref), "backend": rep["backend"], "keeper": rep["keeper"]}))
"""


def _load_elsewhere(path, device: str, how: str = "load_file", ref=None, **env: str) -> dict:
    """Loads ``path`` (a file or an object's URL) in a new process; ``same``: every tensor equals what safetensors
    reads from the local file ``ref`` (default: ``path``)."""
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), device, how, str(ref if ref is not None else path)],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("device", DEVICES)
def test_a_keeper_started_from_python_serves_another_process_byte_exact(tmp_path, private, device):
    path = tmp_path / "m.safetensors"
    _checkpoint(path, 1)
    sock = private / "k.sock"
    with weightlift.keep([path], device=device, socket=sock, budget="1GiB") as k:
        assert k.socket == str(sock) and k.running
        s = k.status()
        assert [e["state"] for e in s["entries"]] == ["ready"], s
        assert s["device"] == device and s["budget"] == 1 << 30
        for mode in ["copy", "view"] if device != "cpu" else ["copy"]:
            got = _load_elsewhere(path, device, WEIGHTLIFT_KEEPER=str(sock), WEIGHTLIFT_KEEPER_MODE=mode)
            assert got["same"], got
            assert got["backend"] == "keeper" and got["keeper"].startswith("served by the keeper"), got
        assert weightlift.keeper_status(sock)["served"] >= 1
        # safe_open's get_tensor takes a kept checkpoint from the keeper too (in any key order).
        got = _load_elsewhere(path, device, "safe_open", WEIGHTLIFT_KEEPER=str(sock))
        assert got["same"] and got["backend"] == "keeper", got
        # A file it does not keep: read from the file, the reason said, and kept for the next process.
        other = tmp_path / "o.safetensors"
        _checkpoint(other, 2)
        got = _load_elsewhere(other, device, WEIGHTLIFT_KEEPER=str(sock))
        assert got["same"] and got["backend"] != "keeper", got
        assert "not kept" in got["keeper"] and "loading them now" in got["keeper"], got
        k.wait()
        got = _load_elsewhere(other, device, WEIGHTLIFT_KEEPER=str(sock))
        assert got["same"] and got["backend"] == "keeper", got
    assert not k.running and not sock.exists()
    # The keeper gone: a normal load that says so.
    got = _load_elsewhere(path, device, WEIGHTLIFT_KEEPER=str(sock))
    assert got["same"] and got["backend"] != "keeper" and "connect" in got["keeper"], got


@pytest.mark.parametrize("device", DEVICES)
def test_a_kept_pack_is_decoded_from_the_keepers_memory_in_another_process(tmp_path, private, wl, device):
    src = tmp_path / "m.safetensors"
    _checkpoint(src, 3)
    pack = tmp_path / "m.wlpack"
    wl.run("pack", src, pack)
    sock = private / "k.sock"
    with weightlift.keep([tmp_path], device=device, socket=sock, budget="1GiB") as k:
        # A folder: its checkpoints, the pack among them.
        held = sorted(os.path.basename(e["path"]) for e in k.status()["entries"])
        assert held == ["m.safetensors", "m.wlpack"], held
        got = _load_elsewhere(pack, device, ref=src, WEIGHTLIFT_KEEPER=str(sock))
        assert got["same"], got
        assert got["backend"] == "keeper" and "decoded" in got["keeper"], got


def test_the_cli_keeper_answers_status_and_stops_on_sigterm(tmp_path, private, wl_bin):
    path = tmp_path / "m.safetensors"
    _checkpoint(path, 3)
    sock = private / "k.sock"
    p = subprocess.Popen(
        [str(wl_bin), "keep", "--device", "cpu", "--socket", str(sock), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 60
        status = None
        while time.time() < deadline:
            q = subprocess.run([str(wl_bin), "keep", "--socket", str(sock), "--status", "--json"], capture_output=True, text=True)
            if q.returncode == 0:
                status = json.loads(q.stdout)
                if status["entries"] and status["entries"][0]["state"] == "ready":
                    break
            time.sleep(0.1)
        assert status and status["entries"][0]["path"] == str(path), status
        got = _load_elsewhere(path, "cpu", WEIGHTLIFT_KEEPER=str(sock))
        assert got["same"] and got["backend"] == "keeper", got
    finally:
        p.terminate()
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "kept 1 of 1 file(s)" in out and "keeper stopped" in err
    assert not sock.exists()


def test_bad_arguments_are_refused_with_their_names(private):
    with pytest.raises(weightlift.InvalidArgumentError, match="budget"):
        weightlift.keep(device="cpu", socket=private / "a.sock", budget="lots")
    with pytest.raises(weightlift.InvalidArgumentError, match="cpu:pinned"):
        weightlift.keep(device="cpu:pinned", socket=private / "b.sock")
    with pytest.raises(weightlift.WeightliftError, match="no keeper|connect|No such file"):
        weightlift.keeper_status(private / "none.sock")
    k = weightlift.keep(device="cpu", socket=private / "c.sock", budget=1 << 20)
    k.stop()
    with pytest.raises(weightlift.InvalidArgumentError, match="stopped"):
        k.status()


_HOLDER = """
import json, os, socket, sys, time
path, sock = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sock)
fd = os.open(path, os.O_RDONLY)
req = {"op": "get", "proto": 2, "device": "cpu", "uuid": None, "inputs": ["file"], "keep": False}
socket.send_fds(s, [json.dumps(req).encode()], [fd])
msg, fds, _, _ = socket.recv_fds(s, 65536, 4)
print(json.loads(msg)["op"], len(fds), flush=True)
time.sleep(600)  # holds its handout until killed
"""


def test_a_client_killed_while_holding_a_handout_gives_its_lease_back(tmp_path, private):
    path = tmp_path / "m.safetensors"
    _checkpoint(path, 4)
    sock = private / "k.sock"
    with weightlift.keep([path], device="cpu", socket=sock) as k:
        p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), str(sock)], stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().split() == ["hit", "1"]
            assert k.status()["entries"][0]["leases"] == 1
        finally:
            p.kill()
            p.wait()
        deadline = time.time() + 10
        while k.status()["entries"][0]["leases"] and time.time() < deadline:
            time.sleep(0.02)
        assert k.status()["entries"][0]["leases"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_an_object_is_kept_by_its_etag_and_served_to_another_process(tmp_path, private, s3, device):
    """An object (S3, through s3s-fs) kept by URL from Python: another process's load_file and safe_open of that URL
    are served by the keeper; once the object is replaced, it is read from the bucket (never the old version) and the
    new one is kept for the next load."""
    local = tmp_path / "m.safetensors"
    _checkpoint(local, 3)
    (s3 / "m.safetensors").write_bytes(local.read_bytes())
    url = "s3://bucket/m.safetensors"
    sock = private / "k.sock"
    with weightlift.keep([url], device=device, socket=sock, budget="1GiB") as k:
        assert [(e["path"], e["state"]) for e in k.status()["entries"]] == [(url, "ready")]
        got = _load_elsewhere(url, device, ref=local, WEIGHTLIFT_KEEPER=str(sock))
        assert got["same"] and got["backend"] == "keeper", got
        got = _load_elsewhere(url, device, "safe_open", ref=local, WEIGHTLIFT_KEEPER=str(sock))
        assert got["same"] and got["backend"] == "keeper", got
        _checkpoint(local, 4)
        (s3 / "m.safetensors").write_bytes(local.read_bytes())
        got = _load_elsewhere(url, device, ref=local, WEIGHTLIFT_KEEPER=str(sock))
        assert got["same"] and got["backend"] != "keeper", got
        assert "changed since it was kept" in got["keeper"], got
        k.wait()
        got = _load_elsewhere(url, device, ref=local, WEIGHTLIFT_KEEPER=str(sock))
        assert got["same"] and got["backend"] == "keeper", got
        assert [e["state"] for e in k.status()["entries"]] == ["ready"], k.status()
