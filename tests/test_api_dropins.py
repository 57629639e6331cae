"""The drop-in modules against the documents of the APIs they stand in for (dstorage-gpu's ``DirectStorageLoader``,
``torch.cuda.gds``, ``cuda.bindings.cufile``): each document's usage examples, rewritten here, run against weightlift
with only the import changed, plus the error cases with their exact exception types and statuses. Every loaded byte
is compared with an independent read of the file (``numpy.fromfile`` / ``open().read()``) of random data.

On a machine without a GPU the host-memory forms run (the loaders are made with ``device="cpu"``, the documented
addition); the GPU forms run where ``torch.cuda`` and weightlift both see a GPU."""

from __future__ import annotations

import ctypes
import gc
import inspect
import os
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
weightlift = pytest.importorskip("weightlift")

from weightlift import cuda_gds, cufile, dstorage_gpu  # noqa: E402
from weightlift.cuda_gds import GdsFile, gds_deregister_buffer, gds_register_buffer  # noqa: E402
from weightlift.dstorage_gpu import DirectStorageLoader, load_tensor  # noqa: E402

GPU = torch.cuda.is_available() and weightlift.cuda_available()
DEVICES = ["cpu"] + (["cuda:0"] if GPU else [])
needs_gpu = pytest.mark.skipif(not GPU, reason=f"no usable GPU (torch: {torch.cuda.is_available()}, weightlift: {weightlift.cuda_available()})")
S = cufile.Status


def random_file(path: Path, nbytes: int, seed: int) -> np.ndarray:
    data = np.random.default_rng(seed).integers(1, 256, size=nbytes, dtype=np.uint8)
    data.tofile(path)
    return data


def host_bytes(t: "torch.Tensor") -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


# ---------------------------------------------------------------------------------------------------------------
# dstorage-gpu: DirectStorageLoader
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(params=DEVICES)
def make_loader(request):
    """The document's ``DirectStorageLoader()`` on a GPU; the same loader for host memory otherwise."""
    device = request.param
    return (lambda: DirectStorageLoader()) if device != "cpu" else (lambda: DirectStorageLoader(device="cpu")), device


def test_dstorage_signatures_match_the_document():
    load = inspect.signature(DirectStorageLoader.load_tensor).parameters
    assert list(load) == ["self", "filepath", "num_elements", "dtype", "device"]
    assert load["dtype"].default is torch.float32 and load["device"].default == "cuda"
    many = inspect.signature(DirectStorageLoader.load_tensors).parameters
    assert list(many) == ["self", "file_specs", "dtype"] and many["dtype"].default is torch.float32
    timed = inspect.signature(DirectStorageLoader.load_tensor_timed).parameters
    assert list(timed) == ["self", "filepath", "num_elements", "dtype"] and timed["dtype"].default is torch.float32
    module = inspect.signature(load_tensor).parameters
    positional = [n for n, p in module.items() if p.kind != inspect.Parameter.KEYWORD_ONLY]
    assert positional == ["filepath", "num_elements", "dtype"] and module["dtype"].default is torch.float32
    assert module["device"].kind == inspect.Parameter.KEYWORD_ONLY and module["device"].default == "cuda"  # an addition
    assert DirectStorageLoader.__init__ is not None and inspect.signature(DirectStorageLoader).bind()  # no argument needed


def test_dstorage_prepare_sets_up_the_first_load(tmp_path, make_loader):
    """The loader's prepare() sets up its own engine's lanes for its device; its first load then sets none up."""
    make, device = make_loader
    data = random_file(tmp_path / "weights.bin", 4 * 300_000, seed=7)
    loader = make()
    done = loader.prepare()
    if done["staging"] is None:
        pytest.skip(f"{device}'s data path does not read through the lanes: {done['path']}")
    assert done["staging"]["lanes_set_up"] == done["staging"]["lanes"] > 0, done
    assert done["staging"]["pinned"] == (device != "cpu"), done
    assert loader.prepare()["staging"]["lanes_set_up"] == 0
    tensor = loader.load_tensor(str(tmp_path / "weights.bin"), num_elements=300_000)
    assert host_bytes(tensor) == data.tobytes()
    times = weightlift.last_report()["times"]
    assert times["staging_setup_thread_secs"] == 0 and times["staging_wait_thread_secs"] == 0, times
    with pytest.raises(weightlift.InvalidArgumentError):
        loader.prepare("tpu:0")


def test_dstorage_quick_start(tmp_path, make_loader):
    make, device = make_loader
    data = random_file(tmp_path / "weights.bin", 4 * 50_000, seed=1)
    loader = make()
    tensor = loader.load_tensor(str(tmp_path / "weights.bin"), num_elements=50_000)
    assert tensor.shape == torch.Size([50_000]) and tensor.dtype == torch.float32
    assert tensor.device == torch.device(device)
    assert host_bytes(tensor) == data.tobytes()


def test_dstorage_raw_weight_matrix(tmp_path, make_loader):
    make, device = make_loader
    path = tmp_path / "attention_weight.bin"
    reference = np.random.default_rng(2).standard_normal((768, 3072), dtype=np.float32)
    reference.tofile(path)
    loader = make()
    count = Path(path).stat().st_size // 4
    weight = loader.load_tensor(path, count).reshape(768, 3072)
    assert weight.shape == (768, 3072) and weight.device == torch.device(device)
    assert np.array_equal(weight.cpu().numpy(), reference)


def test_dstorage_batch_of_layers(tmp_path, make_loader):
    make, device = make_loader
    layer_dir = tmp_path / "model"
    layer_dir.mkdir()
    expected = []
    for i in range(24):
        values = np.random.default_rng(100 + i).standard_normal(1000 + 37 * i, dtype=np.float32)
        values.tofile(layer_dir / f"layer_{i:02d}.bin")
        expected.append(values)
    loader = make()
    specs = []
    for i in range(24):
        p = str(layer_dir / f"layer_{i:02d}.bin")
        specs.append((p, Path(p).stat().st_size // 4))
    layers = loader.load_tensors(specs)
    assert isinstance(layers, list) and len(layers) == 24
    for got, want in zip(layers, expected):
        assert got.shape == torch.Size([want.size]) and got.device == torch.device(device)
        assert np.array_equal(got.cpu().numpy(), want)


def test_dstorage_timed_load(tmp_path, make_loader):
    make, _ = make_loader
    data = random_file(tmp_path / "weights.bin", 4 * 262_144, seed=3)
    tensor, elapsed = make().load_tensor_timed(tmp_path / "weights.bin", 262_144)
    assert isinstance(elapsed, float) and elapsed > 0
    gbps = 262_144 * 4 / 1e9 / elapsed  # the document prints this figure
    assert gbps > 0
    assert host_bytes(tensor) == data.tobytes()


def test_dstorage_from_a_checkpoint_converted_to_raw_files(tmp_path, make_loader):
    make, _ = make_loader
    g = torch.Generator().manual_seed(4)
    torch.save({"embed.weight": torch.randn(64, 32, generator=g), "head.bias": torch.randn(32, generator=g)}, tmp_path / "model.pt")
    out = tmp_path / "model"
    out.mkdir()
    state = torch.load(tmp_path / "model.pt", map_location="cpu")
    for name, param in state.items():
        param.contiguous().numpy().tofile(out / f"{name}.bin")
    loader = make()
    for name, param in state.items():
        got = loader.load_tensor(out / f"{name}.bin", param.numel()).reshape(param.shape)
        assert torch.equal(got.cpu(), param)


def test_dstorage_keywords_dtypes_and_the_module_function(tmp_path, make_loader, monkeypatch):
    make, device = make_loader
    data = random_file(tmp_path / "a.bin", 8192, seed=5)
    loader = make()
    halves = loader.load_tensor(filepath=tmp_path / "a.bin", num_elements=4096, dtype=torch.int16)
    assert halves.dtype == torch.int16 and host_bytes(halves) == data.tobytes()
    prefix = loader.load_tensor(tmp_path / "a.bin", 100, torch.uint8, device=device)
    assert host_bytes(prefix) == data[:100].tobytes()
    pair = loader.load_tensors(file_specs=[(tmp_path / "a.bin", 2048), (str(tmp_path / "a.bin"), 10)], dtype=torch.float16)
    assert [t.dtype for t in pair] == [torch.float16] * 2
    assert host_bytes(pair[0]) == data[:4096].tobytes() and host_bytes(pair[1]) == data[:20].tobytes()
    # The module-level function uses one loader shared by the process (a GPU one; the host one stands in here).
    monkeypatch.setattr(dstorage_gpu, "_shared", loader)
    assert host_bytes(load_tensor(tmp_path / "a.bin", 2048)) == data.tobytes()


def test_dstorage_errors(tmp_path):
    random_file(tmp_path / "short.bin", 400, seed=6)
    loader = DirectStorageLoader(device="cpu")
    with pytest.raises(FileNotFoundError):
        loader.load_tensor(tmp_path / "missing.bin", 10)
    with pytest.raises(ValueError, match="short.bin"):
        loader.load_tensor(tmp_path / "short.bin", 101)  # 404 bytes asked, 400 there
    if not GPU:
        with pytest.raises(RuntimeError, match="CUDA"):
            DirectStorageLoader().load_tensor(tmp_path / "short.bin", 100)


# ---------------------------------------------------------------------------------------------------------------
# torch.cuda.gds
# ---------------------------------------------------------------------------------------------------------------


def test_gds_module_matches_torch_signatures():
    assert {"gds_register_buffer", "gds_deregister_buffer", "GdsFile"} <= set(cuda_gds.__all__)
    assert cuda_gds.is_available() is True
    real = pytest.importorskip("torch.cuda.gds")
    for name in real.__all__:  # the installed torch's names (newer releases add is_available)
        assert list(inspect.signature(getattr(cuda_gds, name)).parameters) == list(inspect.signature(getattr(real, name)).parameters), name
    for method in ("register_handle", "deregister_handle", "load_storage", "save_storage"):
        mine, theirs = inspect.signature(getattr(GdsFile, method)), inspect.signature(getattr(real.GdsFile, method))
        assert [(p.name, p.default) for p in mine.parameters.values()] == [(p.name, p.default) for p in theirs.parameters.values()], method


@pytest.mark.parametrize("device", DEVICES)
def test_gds_save_then_load_two_storages(tmp_path, device):
    f = str(tmp_path / "gds.bin")
    src1 = torch.randn(1024, device=device)
    src2 = torch.randn(2, 1024, device=device)
    file = GdsFile(f, os.O_CREAT | os.O_RDWR)
    file.save_storage(src1.untyped_storage(), offset=0)
    file.save_storage(src2.untyped_storage(), offset=src1.nbytes)
    with open(f, "rb") as plain:
        assert plain.read() == host_bytes(src1) + host_bytes(src2)
    dest1 = torch.empty(1024, device=device)
    dest2 = torch.empty(2, 1024, device=device)
    file.load_storage(dest1.untyped_storage(), offset=0)
    file.load_storage(dest2.untyped_storage(), offset=src1.nbytes)
    assert torch.equal(src1, dest1) and torch.equal(src2, dest2)
    report = weightlift.last_report()
    assert report["api"] == "torch.cuda.gds" and report["call"] == "cuFileRead"
    assert report["path"] == cuda_gds._route()[0] and report["path_why"]
    del file


@pytest.mark.parametrize("device", DEVICES)
def test_gds_buffer_registration(device):
    s = torch.randn(1024, device=device).untyped_storage()
    gds_register_buffer(s)
    with pytest.raises(RuntimeError, match="cuFileBufRegister failed"):
        gds_register_buffer(s)
    gds_deregister_buffer(s)
    with pytest.raises(RuntimeError, match="cuFileBufDeregister failed"):
        gds_deregister_buffer(s)


def test_gds_attributes_and_handle_misuse(tmp_path):
    path = tmp_path / "f.bin"
    data = random_file(path, 3 * 4096 + 5, seed=7)
    file = GdsFile(str(path), os.O_RDONLY)
    assert file.filename == str(path) and file.flags == os.O_RDONLY
    assert isinstance(file.fd, int) and os.fstat(file.fd).st_size == data.size
    import fcntl

    assert fcntl.fcntl(file.fd, fcntl.F_GETFL) & os.O_DIRECT
    assert isinstance(file.handle, int)
    with pytest.raises(AssertionError):
        file.register_handle()
    file.deregister_handle()
    assert file.handle is None
    with pytest.raises(AssertionError):
        file.deregister_handle()
    dest = torch.zeros(10, dtype=torch.uint8)
    with pytest.raises(AssertionError):
        file.load_storage(dest.untyped_storage())
    with pytest.raises(AssertionError):
        file.save_storage(dest.untyped_storage())
    file.register_handle()
    file.load_storage(dest.untyped_storage(), 4096)
    assert host_bytes(dest) == data[4096:4106].tobytes()
    with pytest.raises(RuntimeError, match="cuFileWrite failed"):
        file.save_storage(dest.untyped_storage())  # opened read-only
    fd = file.fd
    del file
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_gds_short_read_and_access_modes(tmp_path):
    path = tmp_path / "f.bin"
    data = random_file(path, 1000, seed=8)
    file = GdsFile(str(path), os.O_RDWR)
    dest = torch.full((4096,), 7, dtype=torch.uint8)
    file.load_storage(dest.untyped_storage(), offset=200)  # as torch's cuFileRead: a short read is no error
    assert host_bytes(dest[:800]) == data[200:].tobytes() and bool((dest[800:] == 7).all())
    with pytest.raises(RuntimeError, match="cuFileRead failed"):
        file.load_storage(dest.untyped_storage(), offset=-1)
    writer = GdsFile(str(tmp_path / "w.bin"), os.O_CREAT | os.O_WRONLY)
    writer.save_storage(dest.untyped_storage(), offset=4096)
    with open(tmp_path / "w.bin", "rb") as plain:
        assert plain.read() == bytes(4096) + host_bytes(dest)
    with pytest.raises(RuntimeError, match="cuFileRead failed"):
        writer.load_storage(dest.untyped_storage())  # opened write-only
    with pytest.raises(FileNotFoundError):
        GdsFile(str(tmp_path / "missing.bin"), os.O_RDONLY)


# ---------------------------------------------------------------------------------------------------------------
# cuda.bindings.cufile
# ---------------------------------------------------------------------------------------------------------------


class Memory:
    """Buffers as the document's examples allocate them: device memory on a GPU, host memory otherwise; ``ptr``
    is an integer either way."""

    def __init__(self, device: str):
        self.device = device
        self.keep: list = []

    def alloc(self, nbytes: int) -> int:
        t = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
        self.keep.append(t)
        return t.data_ptr()

    def read(self, ptr: int, nbytes: int) -> bytes:
        t = next(t for t in self.keep if t.data_ptr() <= ptr < t.data_ptr() + t.numel())
        start = ptr - t.data_ptr()
        return host_bytes(t[start : start + nbytes])

    def count(self, ptr: int) -> int:
        return int(np.frombuffer(self.read(ptr, 8), dtype=np.int64)[0])

    def stream(self) -> int:
        return torch.cuda.Stream().cuda_stream if self.device != "cpu" else 0

    def sync(self, stream: int) -> None:
        if self.device != "cpu":
            torch.cuda.ExternalStream(stream).synchronize()


@pytest.fixture(params=DEVICES)
def mem(request):
    return Memory(request.param)


def test_cufile_names_and_arguments_match_the_document():
    expected = {
        "driver_open": [],
        "driver_close": [],
        "get_version": [],
        "handle_register": ["descr"],
        "handle_deregister": ["fh"],
        "buf_register": ["devPtr_base", "size", "flags"],
        "buf_deregister": ["devPtr_base"],
        "read": ["fh", "buf_ptr_base", "size", "file_offset", "buf_ptr_offset"],
        "write": ["fh", "buf_ptr_base", "size", "file_offset", "buf_ptr_offset"],
        "pread": ["fh", "buf_ptr_base", "size", "file_offset", "buf_ptr_offset"],
        "pwrite": ["fh", "buf_ptr_base", "size", "file_offset", "buf_ptr_offset"],
        "read_async": ["fh", "buf_ptr_base", "size", "file_offset", "buf_ptr_offset", "bytes_read_ptr", "stream"],
        "write_async": ["fh", "buf_ptr_base", "size", "file_offset", "buf_ptr_offset", "bytes_written_ptr", "stream"],
        "readv": ["fh", "iov", "iovcnt", "file_offset", "bytes_read_ptr"],
        "writev": ["fh", "iov", "iovcnt", "file_offset", "bytes_written_ptr"],
        "get_file_properties": ["fh"],
        "set_file_properties": ["fh", "props"],
        "batch_io_set_up": ["nr"],
        "batch_io_submit": ["batch_idp", "nr", "iocbp", "flags"],
        "batch_io_get_status": ["batch_idp", "min_nr", "nr", "iocbp", "timeout"],
        "batch_io_cancel": ["batch_idp"],
        "batch_io_destroy": ["batch_idp"],
    }
    for name, params in expected.items():
        assert list(inspect.signature(getattr(cufile, name)).parameters) == params, name
    for cls, names in [
        (cufile.Status, ["CU_FILE_SUCCESS", "CU_FILE_INVALID_VALUE", "CU_FILE_INVALID_HANDLE", "CU_FILE_CUDA_MEMORY_TYPE_NOT_SUPPORTED", "CU_FILE_IO_NOT_SUPPORTED", "CU_FILE_PERMISSION_DENIED", "CU_FILE_INVALID_FILE_OPEN_FLAG", "CU_FILE_MEMORY_ALREADY_REGISTERED", "CU_FILE_MEMORY_NOT_REGISTERED", "CU_FILE_PLATFORM_NOT_SUPPORTED", "CU_FILE_FILE_SYSTEM_NOT_SUPPORTED"]),
        (cufile.OpError, ["CU_FILE_OP_SUCCESS", "CU_FILE_OP_FAILED", "CU_FILE_OP_INVALID_ARG", "CU_FILE_OP_IO_FAILED", "CU_FILE_OP_MEMORY_INVALID", "CU_FILE_OP_PARTIAL_COMPLETION"]),
        (cufile.FeatureFlags, ["CU_FILE_FEATURE_GDS_SUPPORTED", "CU_FILE_FEATURE_BATCH_IO_SUPPORTED", "CU_FILE_FEATURE_ASYNC_IO_SUPPORTED", "CU_FILE_FEATURE_VECTOR_IO_SUPPORTED"]),
        (cufile.FileHandleType, ["CU_FILE_HANDLE_TYPE_OPAQUE_FD", "CU_FILE_HANDLE_TYPE_OPAQUE_WIN32"]),
    ]:
        for n in names:
            assert isinstance(getattr(cls, n), int), n
    assert S.CU_FILE_SUCCESS == 0 and S.CU_FILE_INVALID_VALUE == 5022 and S.CU_FILE_INVALID_HANDLE == 5027
    for flag in ("NONE", "READ_ONLY", "WRITE_ONLY"):
        assert isinstance(getattr(cufile, f"CU_FILE_BUF_REGISTER_FLAGS_{flag}"), int)
    err = cufile.cuFileError(S.CU_FILE_INVALID_VALUE, "bad")
    assert err.status is S.CU_FILE_INVALID_VALUE and "bad" in str(err) and isinstance(err, weightlift.WeightliftError)
    v = cufile.IOVec()
    assert (v.ptr, v.size, v.file_offset, v.buf_offset) == (0, 0, 0, 0)


def test_cufile_basic_read(tmp_path, mem):
    data = random_file(tmp_path / "large_dataset.dat", 1 << 20, seed=10)
    cufile.driver_open()
    try:
        fd = os.open(tmp_path / "large_dataset.dat", os.O_RDONLY | os.O_DIRECT)
        handle = cufile.handle_register(fd)
        size = 1 << 20
        buf = mem.alloc(size)
        cufile.buf_register(buf, size, cufile.CU_FILE_BUF_REGISTER_FLAGS_NONE)
        assert cufile.read(handle, buf, size, 0, 0) == size
        assert mem.read(buf, size) == data.tobytes()
        report = weightlift.last_report()
        assert report["api"] == "cuda.bindings.cufile" and report["path"] == cufile._route()[0] and report["bytes"] == size
        cufile.buf_deregister(buf)
        cufile.handle_deregister(handle)
        os.close(fd)
    finally:
        cufile.driver_close()


def test_cufile_async_double_buffered_copy(tmp_path, mem):
    chunk = 64 * 1024
    data = random_file(tmp_path / "input.dat", 5 * chunk + 1000, seed=11)
    cufile.driver_open()
    stream = mem.stream()
    in_fd = os.open(tmp_path / "input.dat", os.O_RDONLY | os.O_DIRECT)
    out_fd = os.open(tmp_path / "output.dat", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    try:
        src, dst = cufile.handle_register(in_fd), cufile.handle_register(out_fd)
        current, following = mem.alloc(chunk), mem.alloc(chunk)
        for b in (current, following):
            cufile.buf_register(b, chunk, cufile.CU_FILE_BUF_REGISTER_FLAGS_NONE)
        counts = {current: mem.alloc(8), following: mem.alloc(8)}
        written_ptr = mem.alloc(8)
        cufile.read_async(src, current, chunk, 0, 0, counts[current], stream)
        offset = 0
        while True:
            mem.sync(stream)
            got = mem.count(counts[current])
            if got == 0:
                break
            cufile.read_async(src, following, chunk, offset + got, 0, counts[following], stream)
            cufile.write_async(dst, current, got, offset, 0, written_ptr, stream)
            mem.sync(stream)
            assert mem.count(written_ptr) == got
            offset += got
            current, following = following, current
        assert offset == data.size
        for b in counts:
            cufile.buf_deregister(b)
        cufile.handle_deregister(src)
        cufile.handle_deregister(dst)
    finally:
        os.close(in_fd)
        os.close(out_fd)
        cufile.driver_close()
    assert (tmp_path / "output.dat").read_bytes() == data.tobytes()


def test_cufile_vector_read_of_scattered_blocks(tmp_path, mem):
    block = 16 * 1024
    data = random_file(tmp_path / "sparse_matrix.dat", 101 * block, seed=12)
    cufile.driver_open()
    try:
        fd = os.open(tmp_path / "sparse_matrix.dat", os.O_RDONLY | os.O_DIRECT)
        fh = cufile.handle_register(fd)
        buffers = []
        for _ in range(4):
            b = mem.alloc(block + 16)
            cufile.buf_register(b, block + 16, cufile.CU_FILE_BUF_REGISTER_FLAGS_READ_ONLY)
            buffers.append(b)
        offsets = [0, 10 * block, 50 * block, 100 * block]
        iov_list = []
        for i, (b, off) in enumerate(zip(buffers, offsets)):
            iov = cufile.IOVec()
            iov.ptr, iov.size, iov.file_offset, iov.buf_offset = b, block, off, 16 if i == 1 else 0
            iov_list.append(iov)
        bytes_read_ptr = mem.alloc(8)
        assert cufile.readv(fh, iov_list, len(iov_list), 0, bytes_read_ptr) == 4 * block
        assert mem.count(bytes_read_ptr) == 4 * block
        for iov, off in zip(iov_list, offsets):
            assert mem.read(iov.ptr + iov.buf_offset, block) == data[off : off + block].tobytes()
        # The call's file_offset adds to every entry's; iovcnt limits the entries used.
        assert cufile.readv(fh, iov_list, 1, 7, 0) == block
        assert mem.read(buffers[0], block) == data[7 : 7 + block].tobytes()
        for b in buffers:
            cufile.buf_deregister(b)
        cufile.handle_deregister(fh)
        os.close(fd)
    finally:
        cufile.driver_close()


def test_cufile_vector_write(tmp_path, mem):
    cufile.driver_open()
    fd = os.open(tmp_path / "out.dat", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fh = cufile.handle_register(fd)
        parts = [mem.alloc(1000) for _ in range(3)]
        src = random_file(tmp_path / "src.bin", 3000, seed=13)
        srcfd = os.open(tmp_path / "src.bin", os.O_RDONLY)
        sh = cufile.handle_register(srcfd)
        for i, p in enumerate(parts):
            assert cufile.pread(sh, p, 1000, 1000 * i, 0) == 1000
        iov = [cufile.IOVec(ptr=p, size=1000, file_offset=5000 - 2000 * i, buf_offset=0) for i, p in enumerate(parts)]
        count = ctypes.c_int64(0)
        assert cufile.writev(fh, iov, 3, 100, ctypes.addressof(count)) == 3000 and count.value == 3000
        written = (tmp_path / "out.dat").read_bytes()
        for i in range(3):
            at = 100 + 5000 - 2000 * i
            assert written[at : at + 1000] == src[1000 * i : 1000 * (i + 1)].tobytes()
        cufile.handle_deregister(fh)
        cufile.handle_deregister(sh)
        os.close(srcfd)
    finally:
        os.close(fd)
        cufile.driver_close()


def test_cufile_read_throughput_profile(tmp_path, mem):
    """The document's profiler: the driver opened and closed per buffer size, reads at ``i * buffer_size``."""
    data = random_file(tmp_path / "test_data.dat", 5 * 256 * 1024, seed=14)
    stats = {"total_bytes": 0, "total_time": 0.0, "operations": 0}
    for buffer_size in (64 * 1024, 256 * 1024):
        cufile.driver_open()
        try:
            fd = os.open(tmp_path / "test_data.dat", os.O_RDONLY | os.O_DIRECT)
            fh = cufile.handle_register(fd)
            buf = mem.alloc(buffer_size)
            cufile.buf_register(buf, buffer_size, cufile.CU_FILE_BUF_REGISTER_FLAGS_READ_ONLY)
            for i in range(5):
                start = time.perf_counter()
                cufile.read(fh, buf, buffer_size, i * buffer_size, 0)
                stats["total_time"] += time.perf_counter() - start
                stats["total_bytes"] += buffer_size
                stats["operations"] += 1
                assert mem.read(buf, buffer_size) == data[i * buffer_size : (i + 1) * buffer_size].tobytes()
            cufile.buf_deregister(buf)
            cufile.handle_deregister(fh)
            os.close(fd)
        finally:
            cufile.driver_close()
    assert stats["operations"] == 10 and stats["total_bytes"] == 5 * (64 + 256) * 1024 and stats["total_time"] > 0
    assert cufile.use_count() == 0


def test_cufile_batch(tmp_path, mem):
    data = random_file(tmp_path / "b.dat", 300_000, seed=15)
    fd = os.open(tmp_path / "b.dat", os.O_RDONLY)
    cufile.driver_open()
    try:
        fh = cufile.handle_register(fd)
        bufs = [mem.alloc(50_000) for _ in range(4)]
        batch = cufile.batch_io_set_up(4)
        params = cufile.IOParams(4)
        offsets = [0, 123_457, 250_000, 299_000]  # the last reads 1000 bytes: the end of the file
        for i, (b, off) in enumerate(zip(bufs, offsets)):
            p = params[i]
            p.mode, p.fh, p.opcode, p.cookie = cufile.BatchMode.BATCH, fh, cufile.Opcode.READ, 100 + i
            p.u.batch.dev_ptr_base, p.u.batch.file_offset, p.u.batch.dev_ptr_offset, p.u.batch.size_ = b, off, 0, 50_000
        cufile.batch_io_submit(batch, 4, params.ptr, 0)
        events = cufile.IOEvents(4)
        nr = ctypes.c_uint(4)
        assert cufile.batch_io_get_status(batch, 4, ctypes.addressof(nr), events.ptr, None) == 4 and nr.value == 4
        done = {events[i].cookie: (events[i].status, events[i].ret) for i in range(4)}
        assert set(done) == {100, 101, 102, 103}
        for i, (b, off) in enumerate(zip(bufs, offsets)):
            status, ret = done[100 + i]
            assert status == cufile.BatchStatus.COMPLETE and ret == min(50_000, data.size - off)
            assert mem.read(b, ret) == data[off : off + ret].tobytes()
        # Nothing more to reap; entries hold their slot until reaped, so a full batch refuses more.
        assert cufile.batch_io_get_status(batch, 0, 4, events, 0.01) == 0
        cufile.batch_io_submit(batch, 4, params, 0)
        with pytest.raises(cufile.cuFileError) as e:
            cufile.batch_io_submit(batch, 1, params, 0)
        assert e.value.status == S.CU_FILE_BATCH_FULL
        cufile.batch_io_cancel(batch)
        cufile.batch_io_get_status(batch, 0, 4, events, 0)
        cufile.batch_io_destroy(batch)
        with pytest.raises(cufile.cuFileError) as e:
            cufile.batch_io_cancel(batch)
        assert e.value.status == S.CU_FILE_INVALID_VALUE
        for bad in (0, 129):
            with pytest.raises(cufile.cuFileError) as e:
                cufile.batch_io_set_up(bad)
            assert e.value.status == S.CU_FILE_INVALID_VALUE
        cufile.handle_deregister(fh)
    finally:
        os.close(fd)
        cufile.driver_close()


def test_cufile_batch_failed_entry_and_descriptor_struct(tmp_path):
    data = random_file(tmp_path / "d.dat", 10_000, seed=16)
    fd = os.open(tmp_path / "d.dat", os.O_RDONLY)
    descr = cufile.Descr()
    descr.type_ = cufile.FileHandleType.CU_FILE_HANDLE_TYPE_OPAQUE_FD
    descr.handle.fd = fd
    fh = cufile.handle_register(descr.ptr)  # upstream's form: the address of a CUfileDescr_t
    buf = np.zeros(4096, dtype=np.uint8)
    cufile.buf_register(buf.ctypes.data, 4096, 0)
    batch = cufile.batch_io_set_up(2)
    params = cufile.IOParams(2)
    for i, size in enumerate((4096, 5000)):  # the second is past the registered buffer: that entry fails
        params[i].mode, params[i].fh, params[i].opcode, params[i].cookie = cufile.BatchMode.BATCH, fh, cufile.Opcode.READ, i + 1
        params[i].u.batch.dev_ptr_base, params[i].u.batch.file_offset, params[i].u.batch.size_ = buf.ctypes.data, 10, size
    cufile.batch_io_submit(batch, 2, params, 0)
    events = cufile.IOEvents(2)
    count = np.array([2], dtype=np.uint32)
    cufile.batch_io_get_status(batch, 2, count, events, None)
    assert count[0] == 2
    by_cookie = {events[i].cookie: events[i] for i in range(2)}
    assert by_cookie[1].status == cufile.BatchStatus.COMPLETE and by_cookie[1].ret == 4096
    assert by_cookie[2].status == cufile.BatchStatus.FAILED and by_cookie[2].ret == (-int(S.CU_FILE_INVALID_VALUE)) & (2**64 - 1)
    assert buf.tobytes() == data[10:4106].tobytes()
    cufile.batch_io_destroy(batch)
    cufile.buf_deregister(buf.ctypes.data)
    cufile.handle_deregister(fh)
    os.close(fd)


def test_cufile_batch_cancel(tmp_path):
    piece = 32 * 1024
    data = random_file(tmp_path / "c.dat", 128 * piece, seed=20)
    fd = os.open(tmp_path / "c.dat", os.O_RDONLY)
    try:
        fh = cufile.handle_register(fd)
        dest = np.zeros(128 * piece, dtype=np.uint8)
        batch = cufile.batch_io_set_up(128)
        params = cufile.IOParams(128)
        for i in range(128):
            p = params[i]
            p.mode, p.fh, p.opcode, p.cookie = cufile.BatchMode.BATCH, fh, cufile.Opcode.READ, i + 1
            p.u.batch.dev_ptr_base, p.u.batch.file_offset, p.u.batch.size_ = dest.ctypes.data + i * piece, i * piece, piece
        cufile.batch_io_submit(batch, 128, params, 0)
        cufile.batch_io_cancel(batch)  # returns once nothing runs: every entry is complete or canceled
        events = cufile.IOEvents(128)
        assert cufile.batch_io_get_status(batch, 0, 128, events, 0) == 128
        seen = set()
        for i in range(128):
            e = events[i]
            k = e.cookie - 1
            seen.add(k)
            got = dest[k * piece : (k + 1) * piece]
            if e.status == cufile.BatchStatus.COMPLETE:
                assert e.ret == piece and got.tobytes() == data[k * piece : (k + 1) * piece].tobytes()
            else:
                assert e.status == cufile.BatchStatus.CANCELED and e.ret == 0 and not got.any()
        assert seen == set(range(128))
        cufile.batch_io_destroy(batch)
        cufile.handle_deregister(fh)
    finally:
        os.close(fd)


def expect_status(status, fn, *args):
    with pytest.raises(cufile.cuFileError) as e:
        fn(*args)
    assert e.value.status == status, str(e.value)
    return e.value


def test_cufile_errors(tmp_path):
    data = random_file(tmp_path / "e.dat", 10_000, seed=17)
    fd = os.open(tmp_path / "e.dat", os.O_RDONLY)
    try:
        buf = np.zeros(8192, dtype=np.uint8)
        ptr = buf.ctypes.data
        # bad descriptors
        closed = os.open(tmp_path / "e.dat", os.O_RDONLY)
        os.close(closed)
        expect_status(S.CU_FILE_INVALID_VALUE, cufile.handle_register, closed)
        r, w = os.pipe()
        expect_status(S.CU_FILE_INVALID_FILE_TYPE, cufile.handle_register, r)
        os.close(r)
        os.close(w)
        fh = cufile.handle_register(fd)
        expect_status(S.CU_FILE_HANDLE_ALREADY_REGISTERED, cufile.handle_register, fd)
        # buffers
        cufile.buf_register(ptr, 8192, cufile.CU_FILE_BUF_REGISTER_FLAGS_NONE)
        expect_status(S.CU_FILE_MEMORY_ALREADY_REGISTERED, cufile.buf_register, ptr + 100, 10, 0)
        expect_status(S.CU_FILE_INVALID_VALUE, cufile.buf_register, ptr + 9000, 10, 1 << 20)
        # wrong sizes and offsets
        expect_status(S.CU_FILE_INVALID_VALUE, cufile.read, fh, ptr, 8192, 0, 1)
        expect_status(S.CU_FILE_INVALID_VALUE, cufile.read, fh, ptr, 10, -1, 0)
        with pytest.raises(OverflowError):
            cufile.read(fh, ptr, -1, 0, 0)
        expect_status(S.CU_FILE_INVALID_VALUE, cufile.readv, fh, [cufile.IOVec(ptr, 10)], 2, 0, 0)
        # past the end of the file: short counts, then nothing
        assert cufile.read(fh, ptr, 8192, 6000, 0) == 4000 and buf[:4000].tobytes() == data[6000:].tobytes()
        buf[:] = 9
        assert cufile.pread(fh, ptr, 100, 10_000, 0) == 0 and bool((buf == 9).all())
        # access modes: a read-only fd refuses writes
        expect_status(S.CU_FILE_PERMISSION_DENIED, cufile.write, fh, ptr, 10, 0, 0)
        # an async call on a stream needs CUDA
        if not GPU:
            expect_status(S.CU_FILE_INVALID_VALUE, cufile.read_async, fh, ptr, 10, 0, 0, 0, 0x1234)
        # deregistered handles and buffers
        cufile.buf_deregister(ptr)
        expect_status(S.CU_FILE_MEMORY_NOT_REGISTERED, cufile.buf_deregister, ptr)
        cufile.handle_deregister(fh)
        cufile.handle_deregister(fh)  # as cuFileHandleDeregister: an unknown handle is ignored
        err = expect_status(S.CU_FILE_INVALID_HANDLE, cufile.read, fh, ptr, 10, 0, 0)
        assert err.status == S.CU_FILE_HANDLE_NOT_REGISTERED and isinstance(err, weightlift.WeightliftError)
        wfd = os.open(tmp_path / "w.dat", os.O_WRONLY | os.O_CREAT, 0o644)
        wh = cufile.handle_register(wfd)
        expect_status(S.CU_FILE_PERMISSION_DENIED, cufile.read, wh, ptr, 10, 0, 0)
        cufile.handle_deregister(wh)
        os.close(wfd)
    finally:
        os.close(fd)
    while cufile.use_count():
        cufile.driver_close()
    cufile.driver_open()
    cufile.driver_close()
    expect_status(S.CU_FILE_DRIVER_NOT_INITIALIZED, cufile.driver_close)
    version = weightlift.probe()["cufile"].get("version")  # known once the cuFile driver opened
    if version is None:
        expect_status(S.CU_FILE_PLATFORM_NOT_SUPPORTED, cufile.get_version)
    else:
        assert cufile.get_version() == version


def test_cufile_properties_tensors_and_unregistered_memory(tmp_path):
    data = random_file(tmp_path / "p.dat", 20_000, seed=18)
    fd = os.open(tmp_path / "p.dat", os.O_RDWR)
    try:
        fh = cufile.handle_register(fd)
        props = cufile.get_file_properties(fh)
        assert props["fd"] == fd and props["size"] == 20_000 and props["readable"] and props["writable"]
        assert props["direct_io"] is False and props["path"] == cufile._route()[0]
        assert props["features"] & cufile.FeatureFlags.CU_FILE_FEATURE_BATCH_IO_SUPPORTED
        cufile.set_file_properties(fh, {"direct_io": True})
        assert cufile.get_file_properties(fh)["direct_io"] is True
        expect_status(S.CU_FILE_INVALID_VALUE, cufile.set_file_properties, fh, {"size": 1})
        # a torch tensor as the buffer; memory never registered works as in cuFile
        t = torch.zeros(3000, dtype=torch.uint8)
        cufile.buf_register(t, t.numel(), 0)
        assert cufile.read(fh, t, 2000, 333, 1000) == 2000 and host_bytes(t[1000:]) == data[333:2333].tobytes()
        cufile.buf_deregister(t)
        raw = (ctypes.c_ubyte * 777)()
        assert cufile.read(fh, ctypes.addressof(raw), 777, 19_000, 0) == 777 and bytes(raw) == data[19_000:19_777].tobytes()
        assert cufile.pwrite(fh, raw, 777, 0, 0) == 777
        assert (tmp_path / "p.dat").read_bytes()[:777] == data[19_000:19_777].tobytes()
        cufile.handle_deregister(fh)
    finally:
        os.close(fd)


def test_cufile_takes_a_tensor_as_memory_in_a_fresh_process(tmp_path):
    """A one-element tensor is memory, not the integer it holds, even before weightlift itself imported torch."""
    import subprocess
    import sys

    random_file(tmp_path / "t.dat", 100, seed=21)
    code = (
        "import os, torch\n"
        "from weightlift import cufile\n"
        f"fd = os.open({str(tmp_path / 't.dat')!r}, os.O_RDONLY)\n"
        "t = torch.zeros(1, dtype=torch.uint8)\n"
        "assert cufile.read(cufile.handle_register(fd), t, 1, 42, 0) == 1\n"
        "print(int(t[0]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True)
    assert int(out.stdout) == np.fromfile(tmp_path / "t.dat", dtype=np.uint8)[42]


@needs_gpu
def test_cufile_torch_stream_object(tmp_path):
    data = random_file(tmp_path / "s.dat", 65_536, seed=19)
    fd = os.open(tmp_path / "s.dat", os.O_RDONLY)
    try:
        fh = cufile.handle_register(fd)
        t = torch.zeros(65_536, dtype=torch.uint8, device="cuda:0")
        count = torch.zeros(1, dtype=torch.int64, device="cuda:0")
        stream = torch.cuda.Stream()
        cufile.read_async(fh, t.data_ptr(), 65_536, 0, 0, count.data_ptr(), stream)
        stream.synchronize()
        assert int(count.item()) == 65_536 and host_bytes(t) == data.tobytes()
        cufile.handle_deregister(fh)
    finally:
        os.close(fd)
