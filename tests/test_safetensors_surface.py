"""weightlift.safetensors as a drop-in for ``safetensors.torch``: upstream's own test cases of its torch module
(bindings/python/tests/test_pt.py and test_pt_model.py, rewritten here against weightlift's module and compared with
upstream where it is installed), its refusals and messages, its error class, ``backend="mmap"``, ``framework="np"``,
and the progress hook of long loads."""

from __future__ import annotations

import copy
import struct

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")
from safetensors import SafetensorError  # noqa: E402

import weightlift  # noqa: E402
import weightlift.safetensors as wst  # noqa: E402

GPU = torch.cuda.is_available() and weightlift.cuda_available()


@pytest.fixture
def odd_dtypes():
    return {
        "test": torch.zeros((2, 2), dtype=torch.bfloat16),
        "test2": torch.zeros((2, 2), dtype=torch.float16),
        "test3": torch.zeros((2, 2), dtype=torch.bool),
    }


def _same(a: dict, b: dict) -> None:
    assert isinstance(b, dict) and a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].cpu(), b[k].cpu()), k


# -- test_pt.py's cases ------------------------------------------------------------------------------------------
def test_odd_dtypes_round_trip_through_a_file(tmp_path, odd_dtypes):
    path = tmp_path / "odd.safetensors"
    wst.save_file(odd_dtypes, path)
    _same(odd_dtypes, wst.load_file(path))
    _same(odd_dtypes, st.load_file(path))


def test_load_of_bytes(odd_dtypes):
    data = wst.save(odd_dtypes)
    assert data == st.save(odd_dtypes)
    _same(odd_dtypes, wst.load(data))
    _same(odd_dtypes, wst.load(st.save(odd_dtypes)))


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_gpu_tensors_save_and_load_to_the_host(tmp_path):
    path = tmp_path / "gpu.safetensors"
    wst.save_file({"test": torch.arange(4).view((2, 2)).to("cuda:0")}, path)
    assert torch.equal(torch.arange(4).view((2, 2)), wst.load_file(path)["test"])


def test_sparse_tensors_are_refused_as_upstream_refuses_them(tmp_path):
    data = {"test": torch.sparse_coo_tensor(size=(2, 3))}
    with pytest.raises(ValueError) as ours:
        wst.save_file(data, tmp_path / "s.safetensors")
    with pytest.raises(ValueError) as theirs:
        st.save_file(data, tmp_path / "s.safetensors")
    assert str(ours.value) == str(theirs.value) and isinstance(ours.value, weightlift.WeightliftError)


def test_non_contiguous_tensors_are_refused(tmp_path):
    x = torch.arange(6, dtype=torch.float32).reshape((1, 2, 3))[:, :, 1]
    assert not x.is_contiguous()
    with pytest.raises(ValueError) as ours:
        wst.save_file({"test": x}, tmp_path / "n.safetensors")
    with pytest.raises(ValueError) as theirs:
        st.save_file({"test": x}, tmp_path / "n.safetensors")
    assert str(ours.value) == str(theirs.value) and isinstance(ours.value, weightlift.InvalidArgumentError)
    assert not (tmp_path / "n.safetensors").exists()


def test_non_tensors_and_non_dicts_are_refused_with_upstream_messages(tmp_path):
    for bad in ({"a": [1, 2]}, [("a", torch.zeros(1))]):
        with pytest.raises(ValueError) as ours:
            wst.save_file(bad, tmp_path / "x.safetensors")
        with pytest.raises(ValueError) as theirs:
            st.save_file(bad, tmp_path / "x.safetensors")
        assert str(ours.value) == str(theirs.value)


def test_slice_of_the_last_dimension(tmp_path):
    tensor = torch.arange(6, dtype=torch.float32).reshape((1, 2, 3))
    path = tmp_path / "slice.safetensors"
    wst.save_file({"test": tensor}, path)
    with wst.safe_open(path, framework="pt") as f:
        got = f.get_slice("test")[:, :, 1:2]
    assert got.numpy().tobytes() == b"\x00\x00\x80?\x00\x00\x80@"
    assert torch.equal(got, tensor[:, :, 1:2])


def test_metadata_none_and_given(tmp_path):
    tensor = torch.arange(6, dtype=torch.float32).reshape((1, 2, 3))
    wst.save_file({"test": tensor}, tmp_path / "a.safetensors")
    with wst.safe_open(tmp_path / "a.safetensors", framework="pt") as f:
        assert f.metadata() is None
    wst.save_file({"test": tensor}, tmp_path / "b.safetensors", metadata={"Something": "more"})
    with wst.safe_open(tmp_path / "b.safetensors", framework="pt") as f:
        assert f.metadata() == {"Something": "more"}


# -- test_pt_model.py's cases ------------------------------------------------------------------------------------
class OnesModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.a.weight = torch.nn.Parameter(torch.ones((4, 4)))
        self.a.bias = torch.nn.Parameter(torch.ones((4,)))
        self.b = self.a


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(100, 100)
        self.b = self.a


class NonContiguous(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(100, 100)
        self.a.weight = torch.nn.Parameter(torch.zeros((100, 100)).transpose(0, 1))


class Copied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(100, 100)
        self.b = copy.deepcopy(self.a)


class Untied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(100, 100)
        self.b = torch.nn.Linear(100, 100)


def _same_model(a: torch.nn.Module, b: torch.nn.Module) -> None:
    want = a.state_dict()
    for k, v in b.state_dict().items():
        torch.testing.assert_close(v, want[k])


def test_shared_tensors_are_refused_by_save_file(tmp_path):
    with pytest.raises(RuntimeError) as ours:
        wst.save_file(Tied().state_dict(), tmp_path / "t.safetensors")
    assert isinstance(ours.value, weightlift.WeightliftError) and "share memory" in str(ours.value)
    assert "save_model" in str(ours.value)


def test_save_model_bytes_and_metadata_as_upstream(tmp_path):
    model = OnesModel()
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    wst.save_model(model, ours)
    st.save_model(model, theirs)
    with wst.safe_open(ours, framework="pt") as f:
        assert f.metadata() == {"b.bias": "a.bias", "b.weight": "a.weight"}
    # upstream's own check: the bytes after its 192-byte header are twenty float32 ones
    assert ours.read_bytes()[192:] == b"\x00\x00\x80?" * 20
    assert ours.read_bytes()[192:] == theirs.read_bytes()[192:]
    model2 = OnesModel()
    assert wst.load_model(model2, ours) == ([], [])
    _same_model(model, model2)


def test_tied_model_round_trip(tmp_path):
    model = Tied()
    wst.save_model(model, tmp_path / "m.safetensors")
    model2 = Tied()
    wst.load_model(model2, tmp_path / "m.safetensors")
    _same_model(model, model2)
    # a file holding the other names of the tied tensors loads too
    state = model.state_dict()
    del state["a.weight"], state["a.bias"]
    wst.save_file(state, tmp_path / "other.safetensors")
    model3 = Tied()
    wst.load_model(model3, tmp_path / "other.safetensors")
    _same_model(model, model3)


def test_save_model_force_contiguous(tmp_path):
    model = NonContiguous()
    with pytest.raises(ValueError, match=r"use save_model\(\.\.\., force_contiguous=True\)"):
        wst.save_model(model, tmp_path / "c.safetensors", force_contiguous=False)
    wst.save_model(model, tmp_path / "c.safetensors", force_contiguous=True)
    model2 = NonContiguous()
    wst.load_model(model2, tmp_path / "c.safetensors")
    _same_model(model, model2)


def test_copied_model_round_trip(tmp_path):
    model = Copied()
    wst.save_model(model, tmp_path / "m.safetensors")
    model2 = Copied()
    wst.load_model(model2, tmp_path / "m.safetensors")
    _same_model(model, model2)


def test_load_model_strict_names_missing_and_unexpected_keys(tmp_path):
    wst.save_model(Tied(), tmp_path / "tied.safetensors")
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "b.bias", "b.weight"'):
        wst.load_model(Untied(), tmp_path / "tied.safetensors")
    wst.save_model(Untied(), tmp_path / "untied.safetensors")
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "b.bias", "b.weight"'):
        wst.load_model(Tied(), tmp_path / "untied.safetensors")
    missing, unexpected = wst.load_model(Untied(), tmp_path / "tied.safetensors", strict=False)
    assert sorted(missing) == ["b.bias", "b.weight"] and unexpected == []


# -- errors, backends, frameworks, meta tensors, progress ---------------------------------------------------------
def test_format_errors_are_safetensor_errors(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    for call in (lambda: wst.load_file(bad), lambda: wst.safe_open(bad, framework="pt"), lambda: wst.load(bad.read_bytes())):
        with pytest.raises(SafetensorError) as e:
            call()
        assert isinstance(e.value, weightlift.FormatError)
    with pytest.raises(SafetensorError):
        st.load_file(bad)  # upstream raises that class too


def test_unknown_tensor_is_a_safetensor_error_and_a_key_error(tmp_path):
    wst.save_file({"a": torch.zeros(2)}, tmp_path / "a.safetensors")
    with wst.safe_open(tmp_path / "a.safetensors", framework="pt") as f:
        with pytest.raises(SafetensorError):
            f.get_tensor("nope")
        with pytest.raises(KeyError):
            f.get_slice("nope")


def test_mmap_backend_and_numpy_framework(tmp_path):
    np = pytest.importorskip("numpy")
    tensors = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "i": torch.arange(5, dtype=torch.int64)}
    path = tmp_path / "m.safetensors"
    wst.save_file(tensors, path)
    _same(tensors, wst.load_file(path, backend="mmap"))
    with wst.safe_open(path, framework="pt", backend="mmap") as f:
        _same(tensors, {k: f.get_tensor(k) for k in f.keys()})
    with wst.safe_open(path, framework="np") as f, st.safe_open(str(path), framework="np") as r:
        for k in f.keys():
            got, want = f.get_tensor(k), r.get_tensor(k)
            assert isinstance(got, np.ndarray) and got.dtype == want.dtype and (got == want).all()
        assert isinstance(f.get_slice("w")[1:], np.ndarray)
    with pytest.raises(weightlift.InvalidArgumentError, match="framework 'jax'"):
        wst.safe_open(path, framework="jax")


def test_meta_tensor_save_is_a_weightlift_error(tmp_path):
    with pytest.raises(weightlift.InvalidArgumentError, match="meta"):
        wst.save_file({"m": torch.empty(4, device="meta")}, tmp_path / "m.safetensors")


def test_progress_of_a_load(tmp_path, capsys):
    tensors = {f"w{i}": torch.randn(256, 256) for i in range(8)}
    path = tmp_path / "p.safetensors"
    wst.save_file(tensors, path)
    seen = []
    _same(tensors, wst.load_file(path, progress=lambda done, total: seen.append((done, total))))
    total = sum(t.nbytes for t in tensors.values())
    assert seen and seen[-1] == (total, total) and all(0 <= d <= t == total for d, t in seen)
    _same(tensors, weightlift.load_file(path, progress=True))  # under a second: nothing shown
    assert capsys.readouterr().err == ""

    def stop(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        wst.load_file(path, progress=stop)
    _same(tensors, wst.load_file(path))
    with pytest.raises(weightlift.InvalidArgumentError, match="progress"):
        wst.load_file(path, progress="yes")
    model = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.empty_like(v)) for k, v in tensors.items()})
    seen.clear()
    weightlift.load_into(model, path, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (total, total) and all(torch.equal(model[k], v) for k, v in tensors.items())


def test_get_slice_reads_only_the_rows_basic_indexing_spans(tmp_path):
    tensor = torch.arange(10 * 6 * 4, dtype=torch.float32).reshape(10, 6, 4)
    path = tmp_path / "s.safetensors"
    wst.save_file({"t": tensor}, path)
    cases = [
        (slice(2, 7),), (slice(1, 9, 3),), (3,), (-1,), (slice(None), 2), (4, slice(1, 5, 2), -1), (Ellipsis, 1),
        (slice(8, 2),), (slice(-3, None), None), (slice(None, None, 2), Ellipsis, slice(0, 2)),
    ]
    with wst.safe_open(path, framework="pt") as f, st.safe_open(str(path), framework="pt") as r:
        for index in cases:
            got = f.get_slice("t")[index]
            assert torch.equal(got, tensor[index]), index
            assert torch.equal(got, r.get_slice("t")[index]), index
            report = weightlift.last_report()
            if index[0] is not Ellipsis:
                rows = len(range(*index[0].indices(10))) if isinstance(index[0], slice) else 1
                span = range(10)[index[0]] if isinstance(index[0], slice) else [index[0] % 10]
                want = (max(span) - min(span) + 1 if rows else 0) * 6 * 4 * 4
                assert report["bytes"] == want, (index, report["bytes"], want)
        with pytest.raises(IndexError):
            f.get_slice("t")[10]
