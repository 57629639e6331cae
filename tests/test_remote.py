"""Python loads from objects: checkpoints written by the upstream tools, served on 127.0.0.1 by real servers
(s3s-fs for S3, nginx for HTTP, started by the fixtures of conftest.py), loaded from s3:// and http:// URLs and
compared tensor by tensor with the upstream packages' own reads of the local files. A missing server skips, unless
WEIGHTLIFT_REQUIRE_SERVERS=1 (CI), where it fails."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file as upstream_load, save_file as upstream_save

import weightlift
import weightlift.safetensors as wst


def _checkpoint(path: Path) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    tensors = {
        "embed.weight": torch.randn(512, 384, generator=g).to(torch.bfloat16),
        "layers.0.attn.q.weight": torch.randn(384, 384, generator=g).to(torch.float16),
        "layers.0.mlp.up.weight": torch.randn(1024, 384, generator=g),
        "layers.0.norm.weight": torch.rand(384, generator=g),
        "positions": torch.arange(4097, dtype=torch.int64),
    }
    upstream_save(tensors, str(path), metadata={"format": "pt"})
    return upstream_load(str(path))


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8)) if got[k].dim() else True, k
        assert torch.equal(got[k].cpu(), want[k]), k


def test_load_file_and_safe_open_from_a_bucket(s3, tmp_path):
    want = _checkpoint(tmp_path / "m.safetensors")
    shutil.copy(tmp_path / "m.safetensors", s3 / "m.safetensors")
    _same(wst.load_file("s3://bucket/m.safetensors", device="cpu"), want)
    with wst.safe_open("s3://bucket/m.safetensors", framework="pt", device="cpu") as f:
        assert f.metadata() == {"format": "pt"}
        _same({k: f.get_tensor(k) for k in f.keys()}, want)
        assert torch.equal(f.get_slice("layers.0.mlp.up.weight")[10:20], want["layers.0.mlp.up.weight"][10:20])


def test_cache_dir_keyword_and_variable_keep_a_local_copy(s3, tmp_path, monkeypatch):
    want = _checkpoint(tmp_path / "c.safetensors")
    shutil.copy(tmp_path / "c.safetensors", s3 / "c.safetensors")
    url, cache = "s3://bucket/c.safetensors", tmp_path / "cache"
    copy = cache / "s3" / "bucket" / "c.safetensors"
    # The keyword: the first load writes the copy, byte for byte the file, and the next reads it.
    _same(wst.load_file(url, device="cpu", cache_dir=cache), want)
    net = weightlift.last_report()["network"]
    assert net["copies_written"] == [url] and net["cached"] == [], net
    assert copy.read_bytes() == (tmp_path / "c.safetensors").read_bytes()
    assert Path(f"{copy}.weightlift-etag").read_text().startswith("etag ")
    _same(wst.load_file(url, device="cpu", cache_dir=cache), want)
    net = weightlift.last_report()["network"]
    assert net["cached"] == [url] and net["bytes"] == 0 and net["requests"] == 0, net
    with wst.safe_open(url, framework="pt", device="cpu", cache_dir=cache) as f:
        _same({k: f.get_tensor(k) for k in f.keys()}, want)
    with pytest.raises(weightlift.WeightliftError, match="cache_dir"):
        wst.load_file(url, cache_dir=cache, engine=weightlift._core.new_engine())
    # The variable: the shared engine of the module-level functions takes it.
    other = tmp_path / "other"
    monkeypatch.setenv("WEIGHTLIFT_REMOTE_CACHE_DIR", str(other))
    _same(wst.load_file(url, device="cpu"), want)
    assert weightlift.last_report()["network"]["copies_written"] == [url]
    assert (other / "s3" / "bucket" / "c.safetensors").read_bytes() == copy.read_bytes()
    _same(wst.load_file(url, device="cpu"), want)
    assert weightlift.last_report()["network"]["cached"] == [url]


def test_a_process_that_changes_its_endpoint_reaches_the_new_one(tmp_path, monkeypatch):
    """A load after the process's environment named another S3 endpoint (and keys) reads from that endpoint, not from
    the one an earlier load saw (the stores are made again): two servers, both up, the same key holding different
    checkpoints."""
    from conftest import start_s3s

    servers = []
    try:
        wants = []
        for i in range(2):
            root = tmp_path / f"s3-{i}"
            (root / "bucket").mkdir(parents=True)
            g = torch.Generator().manual_seed(100 + i)
            wants.append({f"w{i}": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g).half()})
            upstream_save(wants[i], str(root / "bucket" / "m.safetensors"))
            proc, env = start_s3s(root)
            servers.append(proc)
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            _same(wst.load_file("s3://bucket/m.safetensors", device="cpu"), wants[i])
    finally:
        for p in servers:
            p.kill()
            p.wait()


def test_load_file_over_http_and_missing_objects(http, tmp_path):
    root, base = http
    want = _checkpoint(tmp_path / "m.safetensors")
    shutil.copy(tmp_path / "m.safetensors", root / "m.safetensors")
    _same(wst.load_file(f"{base}/m.safetensors"), want)
    with pytest.raises(weightlift.WeightliftFileNotFoundError, match="no such object") as e:
        wst.load_file(f"{base}/none.safetensors")
    assert "\n" not in str(e.value)


def test_missing_objects_and_refused_credentials_raise_as_local_files_do(s3, http, tmp_path, monkeypatch):
    """A missing object or bucket is a WeightliftFileNotFoundError (a FileNotFoundError), as a missing local file
    is; refused credentials a WeightliftPermissionError (a PermissionError); a URL naming no object an
    InvalidArgumentError (a ValueError). Each message is one line naming the URL."""
    root, base = http
    with pytest.raises(weightlift.WeightliftFileNotFoundError) as local:
        wst.load_file(tmp_path / "none.safetensors")
    missing = ["s3://bucket/none.safetensors", "s3://no-such-bucket/m.safetensors", f"{base}/none.safetensors"]
    for url in missing:
        for call in (lambda: wst.load_file(url), lambda: wst.safe_open(url, framework="pt"),
                     lambda: weightlift._native.Checkpoint([url], raw_dtype="U8")):
            with pytest.raises(FileNotFoundError) as e:
                call()
            assert type(e.value) is type(local.value), (url, type(e.value))
            assert str(e.value) == f"{url}: no such object (or no such bucket)"
    with pytest.raises(weightlift.InvalidArgumentError, match="s3://bucket/: not an object URL"):
        wst.load_file("s3://bucket/")
    # Refused credentials: a bucket no client of this process has read yet, whose client takes the wrong key.
    (s3.parent / "refused").mkdir()
    _checkpoint(s3.parent / "refused" / "m.safetensors")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(PermissionError) as e:
        wst.load_file("s3://refused/m.safetensors")
    assert isinstance(e.value, weightlift.WeightliftPermissionError), type(e.value)
    assert str(e.value).startswith("s3://refused/m.safetensors: access denied (HTTP 403"), str(e.value)
    assert "\n" not in str(e.value)


def test_ranges_of_a_checkpoint_come_from_the_version_parsed(s3, tmp_path):
    """Checkpoint.read_ranges_into (weightlift.distributed's reads) reads an object as parsed: its bytes while it
    keeps its ETag, an error naming the change once it was replaced."""
    want = _checkpoint(tmp_path / "v.safetensors")
    shutil.copy(tmp_path / "v.safetensors", s3 / "v.safetensors")
    url = "s3://bucket/v.safetensors"
    ckpt = weightlift._native.Checkpoint([url])
    assert ckpt.files[0]["etag"]
    info = ckpt.tensor("positions")
    buf = torch.empty(info.nbytes, dtype=torch.uint8)
    engine = weightlift._core.shared_engine()
    report = ckpt.read_ranges_into(engine, [(0, info.offset, info.nbytes, 0)], buf.data_ptr(), buf.numel(), "cpu")
    assert torch.equal(buf.view(torch.int64), want["positions"])
    assert report["network"]["objects"] == [url]
    data = bytearray((tmp_path / "v.safetensors").read_bytes())
    data[-1] ^= 1
    (s3 / "v.safetensors").write_bytes(data)
    with pytest.raises(weightlift.WeightliftError, match=f"{url}: the object changed while it was being read"):
        ckpt.read_ranges_into(engine, [(0, info.offset, info.nbytes, 0)], buf.data_ptr(), buf.numel(), "cpu")


def test_load_gguf_over_http(http, tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np
    root, base = http
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(3)
    arrays = {"tok_embd.weight": rng.standard_normal((64, 32), dtype=np.float32),
              "blk.0.ffn_up.weight": rng.standard_normal((32, 96)).astype(np.float16)}
    for name, a in arrays.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shutil.copy(path, root / "m.gguf")
    tensors = weightlift.load_gguf(f"{base}/m.gguf", device="cpu").tensors
    for name, a in arrays.items():
        assert tensors[name].contiguous().numpy().tobytes() == a.tobytes(), name


def _tiny_llama(folder: Path, shard_size: str = "10GB", dtype=torch.bfloat16) -> Path:
    """A tiny Llama saved by save_pretrained, every parameter drawn from a fixed seed (none left at one or zero)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    model.to(dtype).save_pretrained(folder, max_shard_size=shard_size)
    return folder


def _same_model(got, ref, url: str) -> None:
    a, b = got.state_dict(), ref.state_dict()
    assert sorted(a) == sorted(b)
    for k in b:
        assert a[k].dtype == b[k].dtype and a[k].device.type == "cpu", k
        assert torch.equal(a[k], b[k]), k
    assert any(b[k].abs().sum() > 0 for k in b)
    got_config, ref_config = got.config.to_dict(), ref.config.to_dict()
    assert got_config.pop("_name_or_path") == url
    ref_config.pop("_name_or_path")
    assert got_config == ref_config
    assert got.generation_config.to_dict() == ref.generation_config.to_dict()
    assert not got.training


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """tempfile's folder for one test, to check that a load from a bucket leaves no folder of its own there."""
    import tempfile
    folder = tmp_path / "tempdir"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
def test_transformers_from_pretrained_from_a_bucket(s3, tmp_path, temp_dir, sharded):
    transformers = pytest.importorskip("transformers")
    wtr = pytest.importorskip("weightlift.transformers")
    local = _tiny_llama(tmp_path / "llama", "40KB" if sharded else "10GB")
    weights = sorted(p.name for p in local.iterdir() if p.suffix == ".safetensors")
    assert (len(weights) >= 2) == sharded and (local / "model.safetensors.index.json").exists() == sharded
    name = f"llama-{'sharded' if sharded else 'single'}"
    shutil.copytree(local, s3 / "models" / name)
    ref = transformers.AutoModelForCausalLM.from_pretrained(local)
    url = f"s3://bucket/models/{name}/"
    got = wtr.from_pretrained(transformers.AutoModelForCausalLM, url, device="cpu")
    _same_model(got, ref, url)
    # The weights came from their objects, read once; config.json and generation_config.json through the engine too.
    assert weightlift.last_report()["network"]["objects"] == [f"{url}{w}" for w in weights]
    assert list(temp_dir.glob("weightlift-model-*")) == []
    # subfolder= joins the URL as it joins a folder.
    got = wtr.from_pretrained(transformers.AutoModelForCausalLM, "s3://bucket/models", subfolder=name, device="cpu")
    _same_model(got, ref, "s3://bucket/models")
    assert list(temp_dir.glob("weightlift-model-*")) == []


def test_transformers_from_pretrained_asks_for_each_small_object_once(shaped_bucket, tmp_path):
    """The small objects before the weights (config.json, generation_config.json, the shard index) each cost one GET:
    an object that fits the engine's opening GET is not read again (an open and then a read were two round trips
    each, 30 ms apiece on the bench's bucket)."""
    transformers = pytest.importorskip("transformers")
    wtr = pytest.importorskip("weightlift.transformers")
    b = shaped_bucket(ttfb_s=0.0)
    local = _tiny_llama(tmp_path / "llama", "40KB")
    shutil.copytree(local, b.root / "bucket" / "llama")
    ref = transformers.AutoModelForCausalLM.from_pretrained(local)
    url = b.url("bucket/llama")
    _same_model(wtr.from_pretrained(transformers.AutoModelForCausalLM, url, device="cpu"), ref, url)
    served = b.requests()
    for name in ("config.json", "generation_config.json", "model.safetensors.index.json"):
        asked = [(m, s) for m, path, s in served if path == f"/bucket/llama/{name}"]
        assert asked == [("GET", 206)], (name, served)
    # The single-file probe: one GET, answered 404.
    assert [(m, s) for m, path, s in served if path == "/bucket/llama/model.safetensors"] == [("GET", 404)], served


def test_transformers_from_pretrained_from_a_bucket_dtype_auto_without_config_dtype(s3, tmp_path):
    # transformers takes dtype="auto" from the first weight file when the config names none: from the object's header.
    transformers = pytest.importorskip("transformers")
    wtr = pytest.importorskip("weightlift.transformers")
    local = _tiny_llama(tmp_path / "llama", dtype=torch.float16)
    config = json.loads((local / "config.json").read_text())
    config.pop("dtype", None)
    config.pop("torch_dtype", None)
    (local / "config.json").write_text(json.dumps(config))
    shutil.copytree(local, s3 / "no-dtype")
    ref = transformers.AutoModelForCausalLM.from_pretrained(local)
    assert ref.dtype == torch.float16
    _same_model(wtr.from_pretrained(transformers.AutoModelForCausalLM, "s3://bucket/no-dtype", device="cpu"), ref,
                "s3://bucket/no-dtype")


def test_transformers_from_pretrained_from_a_bucket_missing_files(s3, tmp_path, temp_dir, monkeypatch):
    transformers = pytest.importorskip("transformers")
    wtr = pytest.importorskip("weightlift.transformers")
    local = _tiny_llama(tmp_path / "llama")
    (s3 / "no-config").mkdir()
    shutil.copy(local / "model.safetensors", s3 / "no-config" / "model.safetensors")
    with pytest.raises(weightlift.WeightliftFileNotFoundError, match="s3://bucket/no-config/config.json") as e:
        wtr.from_pretrained(transformers.AutoModelForCausalLM, "s3://bucket/no-config", device="cpu")
    assert "\n" not in str(e.value)
    (s3 / "no-weights").mkdir()
    shutil.copy(local / "config.json", s3 / "no-weights" / "config.json")
    with pytest.raises(weightlift.WeightliftFileNotFoundError, match="s3://bucket/no-weights: no model.safetensors"):
        wtr.from_pretrained(transformers.AutoModelForCausalLM, "s3://bucket/no-weights", device="cpu")
    with pytest.raises(weightlift.WeightliftFileNotFoundError, match="s3://no-such-bucket/m/config.json"):
        wtr.from_pretrained(transformers.AutoModelForCausalLM, "s3://no-such-bucket/m", device="cpu")
    # Refused credentials: the one-line error of a load (a bucket not read before: its client takes the new key).
    (s3.parent / "locked").mkdir()
    shutil.copytree(local, s3.parent / "locked" / "m")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(weightlift.WeightliftPermissionError, match="s3://locked/m/config.json: access denied") as e:
        wtr.from_pretrained(transformers.AutoModelForCausalLM, "s3://locked/m", device="cpu")
    assert "\n" not in str(e.value)
    assert list(temp_dir.glob("weightlift-model-*")) == []


def test_transformers_from_pretrained_of_a_packed_folder_in_a_bucket(s3, tmp_path, temp_dir, wl):
    transformers = pytest.importorskip("transformers")
    wtr = pytest.importorskip("weightlift.transformers")
    local = _tiny_llama(tmp_path / "llama")
    ref = transformers.AutoModelForCausalLM.from_pretrained(local)
    (s3 / "packed").mkdir()
    wl.run("pack", local / "model.safetensors", s3 / "packed" / "model.wlpack")
    for name in ("config.json", "generation_config.json"):
        shutil.copy(local / name, s3 / "packed" / name)
    url = "s3://bucket/packed"
    _same_model(wtr.from_pretrained(transformers.AutoModelForCausalLM, url, device="cpu"), ref, url)
    assert weightlift.last_report()["network"]["objects"] == [f"{url}/model.wlpack"]
    assert list(temp_dir.glob("weightlift-model-*")) == []


def test_the_cli_verifies_an_object_against_the_bucket(s3, http, wl, tmp_path):
    """`weightlift load URL --verify` reads the object again from its server (at the version loaded) and compares."""
    root, base = http
    _checkpoint(tmp_path / "v.safetensors")
    shutil.copy(tmp_path / "v.safetensors", root / "v.safetensors")
    shutil.copy(tmp_path / "v.safetensors", s3 / "v.safetensors")
    for url in (f"{base}/v.safetensors", "s3://bucket/v.safetensors"):
        report = wl.json("load", url, "--device", "cpu", "--verify", "--json", "--no-ceiling")
        assert report["verified"] is True, report


def test_a_cloud_shaped_bucket_slow_and_throttling(shaped_bucket, tmp_path):
    """Behind 20 ms to the first byte and a tenth of requests answered 503 SlowDown, every tensor is right, the
    answers are counted, and the report says how many GETs were in flight and why."""
    b = shaped_bucket(ttfb_s=0.02, slowdown=0.1)
    want = _checkpoint(tmp_path / "s.safetensors")
    shutil.copy(tmp_path / "s.safetensors", b.root / "bucket" / "s.safetensors")
    engine = weightlift._core.new_engine(remote_range_bytes="256KiB", remote_retries=40)
    _same(wst.load_file(b.url("bucket/s.safetensors"), engine=engine), want)
    net = weightlift.last_report()["network"]
    served = b.requests()
    assert all(method == "GET" for method, _, _ in served), served
    slowed = sum(1 for _, _, status in served if status == 503)
    assert net["heads"] == 0 and net["throttled"] <= slowed, (net, slowed)
    gets = net["gets"]
    assert gets["setting"] == "auto" and gets["peak_in_flight"] >= 1 and "GETs in flight" in gets["why"], gets
