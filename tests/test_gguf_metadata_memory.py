"""A GGUF whose metadata holds one long array costs the Python front about the array's size (issue 40: a 16 MiB
file once took 1.8 GB in `load_gguf`, its metadata made into lists of ints through JSON). The numeric arrays come
as `array.array` of their element type, with the file's values."""

from __future__ import annotations

import array
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

N = 16 << 20


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_gguf(path: Path, n: int) -> None:
    """GGUF v3 by hand: one `uint8` array of `n` values, one f32 tensor of 4 values."""
    kv = _string("test.long_array") + struct.pack("<IIQ", 9, 0, n) + bytes(i % 251 for i in range(256)) * (n // 256)
    kv += _string("test.u32s") + struct.pack("<IIQ", 9, 4, 3) + struct.pack("<3I", 1, 2, 4_000_000_000)
    info = _string("w") + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<IQ", 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 2) + kv + info
    head += b"\0" * (-len(head) % 32)
    path.write_bytes(head + struct.pack("<4f", 1.0, 2.0, 3.0, 4.0))


def test_a_long_metadata_array_costs_about_its_size(tmp_path: Path) -> None:
    path, small = tmp_path / "long.gguf", tmp_path / "short.gguf"
    write_gguf(path, N)
    write_gguf(small, 256)
    program = textwrap.dedent(f"""
        import resource, weightlift
        weightlift.load_gguf({str(small)!r}, device="cpu")  # everything a load needs, but not the long array
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        ck = weightlift.load_gguf({str(path)!r}, device="cpu")
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        a = ck.metadata["test.long_array"]
        print(type(a).__name__, a.typecode, len(a), a[0], a[250], a[251], after - before)
        print(list(ck.metadata["test.u32s"]))
        """)
    p = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    first, second = p.stdout.splitlines()[-2:]
    kind, code, n, a0, a250, a251, grew_kib = first.split()
    assert (kind, code, int(n), int(a0), int(a250), int(a251)) == ("array", "B", N, 0, 250, 0)
    # Parsing holds the array once, making it Python's a few times more for a moment; JSON made it 115 times.
    assert int(grew_kib) * 1024 < 6 * N, f"peak RSS grew {int(grew_kib) >> 10} MiB for a {N >> 20} MiB array"
    assert second == "[1, 2, 4000000000]"
    assert array.array("B", [0]).itemsize == 1
