"""The object stores beside s3s-fs and nginx, each in a module of its own (their fixtures point the process's S3 or
GCS variables at them while the module runs): SeaweedFS, a second S3 implementation, and fake-gcs-server for gs://.
Checkpoints written by safetensors.torch.save_file, compared tensor by tensor with safetensors' own read of the local
file. A missing server skips, unless WEIGHTLIFT_REQUIRE_SERVERS=1 (CI), where it fails."""

from __future__ import annotations

import pytest
import torch

import weightlift
import weightlift.safetensors as wst
from test_remote import _checkpoint, _same


def test_a_second_s3_server_seaweedfs(seaweedfs, wl, tmp_path):
    """SeaweedFS beside s3s-fs: the checkpoint uploaded through weightlift, loaded and read by key, opened by one GET
    with no HEAD, and read again after it was replaced (the new version, never a mix)."""
    want = _checkpoint(tmp_path / "m.safetensors")
    wl.run("upload", tmp_path / "m.safetensors", "s3://models/llama/m.safetensors")
    url = "s3://models/llama/m.safetensors"
    _same(wst.load_file(url), want)
    net = weightlift.last_report()["network"]
    assert net["objects"] == [url] and net["heads"] == 0, net
    with wst.safe_open(url, framework="pt") as f:
        _same({k: f.get_tensor(k) for k in f.keys()}, want)
    ckpt = weightlift._native.Checkpoint([url])
    info = ckpt.tensor("positions")
    buf = torch.empty(info.nbytes, dtype=torch.uint8)
    engine = weightlift._core.shared_engine()
    data = bytearray((tmp_path / "m.safetensors").read_bytes())
    data[-1] ^= 1
    (tmp_path / "changed.safetensors").write_bytes(data)
    wl.run("upload", tmp_path / "changed.safetensors", url)
    with pytest.raises(weightlift.WeightliftError, match=f"{url}: the object changed while it was being read"):
        ckpt.read_ranges_into(engine, [(0, info.offset, info.nbytes, 0)], buf.data_ptr(), buf.numel(), "cpu")


def test_gcs_objects_load_and_a_replaced_one_is_caught(gcs, tmp_path):
    """gs:// against fake-gcs-server: loaded byte-exact; the server ignores If-Match, so an object replaced after it
    was parsed is caught by the ETag of the answers."""
    from conftest import gcs_put

    want = _checkpoint(tmp_path / "g.safetensors")
    data = (tmp_path / "g.safetensors").read_bytes()
    gcs_put(gcs, "llama/g.safetensors", data)
    url = "gs://models/llama/g.safetensors"
    _same(wst.load_file(url), want)
    assert weightlift.last_report()["network"]["objects"] == [url]
    ckpt = weightlift._native.Checkpoint([url])
    info = ckpt.tensor("positions")
    buf = torch.empty(info.nbytes, dtype=torch.uint8)
    engine = weightlift._core.shared_engine()
    changed = bytearray(data)
    changed[-1] ^= 1
    gcs_put(gcs, "llama/g.safetensors", bytes(changed))
    with pytest.raises(weightlift.WeightliftError, match=f"{url}: the object changed while it was being read"):
        ckpt.read_ranges_into(engine, [(0, info.offset, info.nbytes, 0)], buf.data_ptr(), buf.numel(), "cpu")
