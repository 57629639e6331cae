"""The Python fronts' seams: a cheap ``import weightlift`` (heavy fronts imported on first use, public paths
unchanged), ``from weightlift import *``, the typed cuFile route, one registry of cuFile handles and buffers (the
native session's), every size and offset checked against a buffer of known extent before a byte moves, one
argument-validation layer (values out of range are weightlift errors and ``ValueError``\\s naming the argument), and
the drop-in gaps (``torch.cuda.gds`` by its qualified name, the SPDK tutorial's ``read_into_tensor``, the
module-level dstorage-gpu ``load_tensor`` on the host)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import weightlift  # noqa: E402
from weightlift import _native, cufile  # noqa: E402

S = cufile.Status


def _python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout


# -- import cost and public paths ---------------------------------------------------------------------------------
def test_import_weightlift_imports_no_heavy_front():
    heavy = ["weightlift.cufile", "weightlift.cuda_gds", "weightlift.distributed", "weightlift.nvme", "weightlift.transformers", "torch"]
    out = _python(f"import sys, weightlift; print([m for m in {heavy!r} if m in sys.modules])")
    assert out.strip() == "[]", out


def test_public_paths_still_work_as_imports_and_attributes():
    code = """
import weightlift, weightlift.cufile, weightlift.nvme, weightlift.distributed, weightlift.cuda_gds, weightlift.dstorage_gpu
from weightlift import cufile, nvme, distributed, cuda_gds, dstorage_gpu
assert weightlift.cufile is cufile and weightlift.nvme is nvme and weightlift.distributed is distributed
print(weightlift.cufile.Status.CU_FILE_INVALID_VALUE.value)
"""
    assert _python(code).strip() == "5022"
    fresh = "import weightlift; print(weightlift.cufile.read.__name__, weightlift.nvme.Device.__name__)"
    assert _python(fresh).split() == ["read", "Device"]
    with pytest.raises(AttributeError):
        weightlift.no_such_thing  # noqa: B018


def test_star_import_gives_every_name_of_all():
    ns: dict = {}
    exec("from weightlift import *", ns)
    missing = [n for n in weightlift.__all__ if n not in ns]
    assert not missing and ns["GdsError"] is weightlift.GdsError and ns["cuFileError"] is weightlift.cuFileError


def test_the_error_module_imports_no_front():
    out = _python("import sys, weightlift._errors as e; print('weightlift.cufile' in sys.modules, e.cuFileError(5022).status.name)")
    assert out.split() == ["False", "CU_FILE_INVALID_VALUE"]


# -- the typed route ----------------------------------------------------------------------------------------------
def test_cufile_route_is_a_typed_value():
    route = _native.cufile_route()
    assert route.path in (_native.CufilePath.Engine, _native.CufilePath.Cufile) and route.why
    assert str(route.path) in ("engine", "cufile")
    assert cufile._route() == weightlift.cuda_gds._route() == (str(route.path), route.why)


# -- one registry -------------------------------------------------------------------------------------------------
def test_handles_and_buffers_live_in_the_native_session(tmp_path):
    from weightlift import cuda_gds

    path = tmp_path / "r.bin"
    path.write_bytes(bytes(range(256)) * 16)
    fd = os.open(path, os.O_RDONLY)
    buf = np.zeros(4096, dtype=np.uint8)
    try:
        fh = cufile.handle_register(fd)
        cufile.buf_register(buf, buf.nbytes, 0)
        session = cufile._driver.session
        assert session.handle_info(fh)[1:] == (True, False) and session.handle_of_fd(fd) == fh
        assert session.buffer(buf.ctypes.data) == (4096, "cpu")
        assert not hasattr(cufile._driver, "handles") and not hasattr(cufile._driver, "buffers")
        cufile.buf_deregister(buf)
        assert session.buffer(buf.ctypes.data) is None
        cufile.handle_deregister(fh)
        assert session.handle_of_fd(fd) is None
    finally:
        os.close(fd)
    f = cuda_gds.GdsFile(str(path), os.O_RDONLY)
    assert cuda_gds._cufile_session().handle_info(f.handle)[1:] == (True, False)
    s = torch.zeros(64, dtype=torch.uint8).untyped_storage()
    cuda_gds.gds_register_buffer(s)
    assert cuda_gds._cufile_session().buffer(s.data_ptr()) == (64, "cpu")
    cuda_gds.gds_deregister_buffer(s)
    assert not hasattr(cuda_gds, "_buffers") and not hasattr(cuda_gds, "_handles")
    del f


# -- bounds before any byte moves ---------------------------------------------------------------------------------
@pytest.fixture
def handle(tmp_path):
    path = tmp_path / "b.bin"
    path.write_bytes(b"\xab" * 8192)
    fd = os.open(path, os.O_RDWR)
    fh = cufile.handle_register(fd)
    yield fh
    cufile.handle_deregister(fh)
    os.close(fd)


def test_a_read_past_a_small_tensor_is_refused_and_moves_nothing(handle):
    # The case of the issue: a 16-byte tensor, 4096 bytes asked for.
    guard = torch.zeros(64, dtype=torch.uint8)
    t = guard[16:32]
    with pytest.raises(cufile.cuFileError) as e:
        cufile.read(handle, t, 4096, 0, 0)
    assert e.value.status == S.CU_FILE_INVALID_VALUE and isinstance(e.value, ValueError)
    assert not guard.any()
    for args in [(t, 16, 0, 1), (t, 1, 0, 16), (t, 17, 0, 0)]:
        with pytest.raises(cufile.cuFileError):
            cufile.pread(handle, *args[:2], args[2], args[3])
        with pytest.raises(cufile.cuFileError):
            cufile.write(handle, *args[:2], args[2], args[3])
    assert not guard.any()
    assert cufile.read(handle, t, 16, 0, 0) == 16 and bool((t == 0xAB).all()) and not guard[32:].any()


def test_arrays_ctypes_and_registered_buffers_are_bounded_too(handle):
    import ctypes

    arr = np.zeros(32, dtype=np.uint8)
    with pytest.raises(cufile.cuFileError):
        cufile.read(handle, arr, 33, 0, 0)
    cbuf = (ctypes.c_uint8 * 8)()
    with pytest.raises(cufile.cuFileError):
        cufile.read(handle, cbuf, 9, 0, 0)
    big = np.zeros(4096, dtype=np.uint8)
    cufile.buf_register(big.ctypes.data, 1024, 0)
    try:
        # a bare address inside a registered buffer is bounded by the registration
        with pytest.raises(cufile.cuFileError):
            cufile.read(handle, big.ctypes.data + 1000, 100, 0, 0)
        with pytest.raises(cufile.cuFileError):
            cufile.read(handle, big.ctypes.data, 1000, 0, 100)
        assert not big.any()
        # a vectored read checks every entry before the first moves a byte
        iov = [cufile.IOVec(big.ctypes.data, 10), cufile.IOVec(arr, 64)]
        with pytest.raises(cufile.cuFileError):
            cufile.readv(handle, iov, 2, 0, 0)
        assert not big.any() and not arr.any()
    finally:
        cufile.buf_deregister(big.ctypes.data)


def test_the_session_class_checks_its_requests(tmp_path):
    path = tmp_path / "s.bin"
    path.write_bytes(b"\x01" * 4096)
    t = torch.zeros(16, dtype=torch.uint8)
    with cufile.Session() as s:
        fh = s.register_handle(path, "r")
        s.register_buffer(t)
        for size, buf_offset in [(17, 0), (1, 16), (-1, 0)]:
            with pytest.raises(weightlift.InvalidArgumentError):
                s.read(fh, t, size=size, buf_offset=buf_offset)
        with pytest.raises(weightlift.InvalidArgumentError):
            s.read_async(fh, t, 4096)
        assert not t.any()
        assert s.read(fh, t) == 16 and bool((t == 1).all())


# -- one argument-validation layer --------------------------------------------------------------------------------
def test_out_of_range_numbers_are_weightlift_value_errors_naming_the_argument(tmp_path):
    raw = tmp_path / "raw.bin"
    raw.write_bytes(bytes(4096))
    loader = weightlift.Loader(device="cpu")
    for bad in (-1, 1 << 64, 1.5, 2.0):
        with pytest.raises(weightlift.InvalidArgumentError, match="num_elements") as e:
            loader.load_tensor(raw, bad, torch.uint8)
        assert isinstance(e.value, ValueError)
    with pytest.raises(TypeError):
        loader.load_tensor(raw, "4", torch.uint8)
    for dtype in (torch.complex128, torch.complex32):  # no safetensors dtype; complex64 is C64 and loads
        with pytest.raises(weightlift.InvalidArgumentError, match="dtype"):
            loader.load_tensor(raw, 2, dtype)
    assert loader.load_tensor(raw, 2, torch.complex64).dtype == torch.complex64
    assert loader.load_tensor(raw, np.int64(4), torch.uint8).numel() == 4
    f = weightlift.File(raw, "r+")
    t = torch.zeros(4, dtype=torch.uint8)
    for call in (f.pread, f.pwrite, f.load_storage, f.save_storage):
        for bad in (-1, 1 << 64):
            with pytest.raises(weightlift.InvalidArgumentError, match="offset"):
                call(t, bad)
    from weightlift import cuda_gds, dstorage_gpu

    g = cuda_gds.GdsFile(str(raw), os.O_RDWR)
    for bad in (-1, 1 << 64):
        with pytest.raises(RuntimeError, match="offset") as e:
            g.load_storage(t.untyped_storage(), bad)
        assert isinstance(e.value, weightlift.InvalidArgumentError)
    del g
    d = dstorage_gpu.DirectStorageLoader(device="cpu")
    with pytest.raises(weightlift.InvalidArgumentError, match="num_elements"):
        d.load_tensor(str(raw), -5, torch.uint8, device="cpu")
    dev = weightlift.nvme.Device(raw)
    for kw in ({"lba": -1, "count": 1}, {"lba": 0, "count": 1 << 64}):
        with pytest.raises(weightlift.InvalidArgumentError):
            dev.read(gpu_ptr=t, device="cpu", **kw)


def test_cufile_numbers_out_of_range(handle):
    buf = np.zeros(16, dtype=np.uint8)
    for args in [(-1, 0, 0), (1 << 64, 0, 0), (1, -1, 0), (1, 1 << 64, 0), (1, 0, -1), (1.5, 0, 0)]:
        with pytest.raises(cufile.cuFileError) as e:
            cufile.read(handle, buf, *args)
        assert e.value.status == S.CU_FILE_INVALID_VALUE and isinstance(e.value, weightlift.InvalidArgumentError)
    with pytest.raises(OverflowError):  # as cuda.bindings refuses a negative size_t
        cufile.read(handle, buf, -1, 0, 0)
    with pytest.raises(cufile.cuFileError):
        cufile.buf_register(buf, -1, 0)
    with pytest.raises(cufile.cuFileError):
        cufile.batch_io_set_up(1.5)


# -- drop-in gaps -------------------------------------------------------------------------------------------------
def test_cuda_gds_install_serves_qualified_call_sites(tmp_path):
    code = f"""
import os, torch, torch.cuda
import weightlift.cuda_gds
weightlift.cuda_gds.install()
import torch.cuda.gds
assert torch.cuda.gds is weightlift.cuda_gds
path = {str(tmp_path / 'q.bin')!r}
open(path, 'wb').write(bytes(range(16)))
f = torch.cuda.gds.GdsFile(path, os.O_RDONLY)
t = torch.zeros(16, dtype=torch.uint8)
f.load_storage(t.untyped_storage(), 0)
print(t.tolist() == list(range(16)))
"""
    assert _python(code).strip() == "True"


def test_dstorage_module_load_tensor_on_the_host(tmp_path):
    from weightlift import dstorage_gpu

    raw = tmp_path / "w.bin"
    np.arange(8, dtype=np.float32).tofile(raw)
    t = dstorage_gpu.load_tensor(str(raw), 8, device="cpu")
    assert t.device.type == "cpu" and t.tolist() == list(range(8))


def test_nvme_read_into_tensor_without_init(monkeypatch, tmp_path):
    from weightlift import nvme

    nvme.cleanup()
    image = tmp_path / "disk.img"
    image.write_bytes(bytes(range(256)) * 8)
    monkeypatch.setattr(nvme, "DEFAULT_DEVICE", str(image))
    t = torch.zeros(512, dtype=torch.uint8)
    assert nvme.read_into_tensor(t, lba=0) == 512 and t.tolist() == list(range(256)) * 2
    nvme.cleanup()
    monkeypatch.setattr(nvme, "DEFAULT_DEVICE", str(tmp_path / "none"))
    with pytest.raises(weightlift.InvalidArgumentError, match="init"):
        nvme.read_into_tensor(t)
    nvme.cleanup()


def test_layer_and_lba_arguments_are_checked(tmp_path):
    image = tmp_path / "disk.img"
    image.write_bytes(bytes(4096))
    dev = weightlift.nvme.Device(image)
    for kw in ({"size": -512}, {"size_mb": -1}, {"size_mb": "1"}):
        with pytest.raises(weightlift.InvalidArgumentError):
            dev.read_to_gpu(device="cpu", **kw)
    assert dev.read_to_gpu(device="cpu", size=1024).numel() == 1024
    path = tmp_path / "m.safetensors"
    weightlift.save_file({f"model.layers.{i}.w": torch.full((4,), float(i)) for i in range(3)}, path)
    streamer = weightlift.LayerStreamer(path, device="cpu")
    with pytest.raises(weightlift.InvalidArgumentError, match="i 1.5"):
        streamer.load_layer(1.5)
    with pytest.raises(weightlift.InvalidArgumentError, match="slots"):
        weightlift.LayerStreamer(path, device="cpu", slots=2.5)
    assert float(next(iter(streamer.load_layer(2).values()))[0]) == 2.0
