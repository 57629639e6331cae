"""Packed checkpoints against the links they must beat, all in one run: the effective load rate (raw bytes
delivered per second of wall time) of a `.wlpack` of weight-like bf16, warm and cold, beside the pinned host→device
copy ceiling, the disk's O_DIRECT sequential rate, and weightlift loading the unpacked file; the ratio `weightlift
pack` reaches on a transformers-written Llama, a GGUF file and (when given) other files; ZipNN's CPU decompression
of the same bf16 file where the `zipnn` package imports.

Usage: python bench/pack_load_bench.py OUTDIR [--size 4GiB] [--runs 3] [--dir DIR] [--extra FILE...]
Writes OUTDIR/pack-load.json. Cold cases need root (drop_caches); without it they are skipped and say so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

WL = os.environ.get("WEIGHTLIFT_BIN", "weightlift")


def say(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def parse_size(s: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def wl_json(*args) -> dict:
    out = subprocess.run([WL, *map(str, args), "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def weights_bf16(path: Path, size: int, device: str) -> dict:
    """Weight-like bf16 (N(0, 0.02), the spread of initialised and trained transformer weights) in 4096-wide
    matrices, written by safetensors.torch.save_file."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator(device=device).manual_seed(0)
    n_tensors = max(1, size // (4096 * 4096 * 2))
    per = size // n_tensors // 2
    rows = max(1, per // 4096)
    tensors = {}
    for i in range(n_tensors):
        t = torch.randn(rows, 4096, generator=g, device=device) * 0.02
        tensors[f"layers.{i}.weight"] = t.to(torch.bfloat16).cpu()
    save_file(tensors, str(path), metadata={"format": "pt"})
    return {"tensors": n_tensors, "bytes": path.stat().st_size}


def pinned_ceiling(device: str) -> float:
    import torch

    src = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
    dst = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    best = 0.0
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, src.numel() / (time.perf_counter() - t) / 1e9)
    return best


def disk_ceiling(path: Path) -> float | None:
    """Sequential O_DIRECT read of the file with dd (64 MiB requests), cold."""
    if not drop_caches():
        return None
    t = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=64M", "iflag=direct"], check=True, capture_output=True)
    return path.stat().st_size / (time.perf_counter() - t) / 1e9


def timed_load(path: Path, device: str, verify: bool = False) -> tuple[float, dict]:
    import torch
    import weightlift

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    tensors = weightlift.load_file(path, device, verify=verify)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    secs = time.perf_counter() - t
    report = weightlift.last_report() or {}
    del tensors
    return secs, report


def same_tensors(a: Path, b: Path, device: str) -> bool:
    import torch
    import weightlift

    x, y = weightlift.load_file(a, device), weightlift.load_file(b, device)
    return x.keys() == y.keys() and all(
        torch.equal(x[k].reshape(-1).view(torch.uint8), y[k].reshape(-1).view(torch.uint8)) for k in x
    )


def rates(path: Path, raw: int, device: str, runs: int, cold: bool, verify: bool = False) -> dict:
    out = {"seconds": [], "decoder": None, "reports": []}
    if not cold:
        timed_load(path, device, verify)  # warm-up: page cache, engine, kernels
    for _ in range(runs):
        if cold and not drop_caches():
            return {"skipped": "cold cases need root (drop_caches)"}
        secs, report = timed_load(path, device, verify)
        out["seconds"].append(secs)
        out["reports"].append({k: report.get(k) for k in ("pack", "gbps", "seconds", "cache", "direct_bytes", "checks")})
    out["median_s"] = statistics.median(out["seconds"])
    out["gbps"] = raw / out["median_s"] / 1e9
    out["decoder"] = (out["reports"][-1].get("pack") or {}).get("decoder")
    return out


def verify_cost(path: Path, device: str, runs: int) -> dict:
    """verify=True against the same load without it, interleaved (plain, verify, plain, verify, ...) so that both
    see the same state of the machine; the cost is the median of the per-pair ratios."""
    timed_load(path, device, False)
    timed_load(path, device, True)
    plain, checked, tails = [], [], []
    for _ in range(max(runs, 5)):
        plain.append(timed_load(path, device, False)[0])
        secs, report = timed_load(path, device, True)
        checked.append(secs)
        tails.append((report.get("checks") or {}).get("tail_secs"))
    ratios = [c / p for p, c in zip(plain, checked)]
    return {
        "plain_s": plain,
        "verify_s": checked,
        "verify_tail_s": tails,
        "cost_median_of_pairs": statistics.median(ratios) - 1,
        "cost_of_medians": statistics.median(checked) / statistics.median(plain) - 1,
        "checks": report.get("checks"),
    }


def checksum(src: Path) -> dict:
    t = time.perf_counter()
    out = subprocess.run([WL, "checksum", src], check=True, capture_output=True, text=True).stdout
    return {"wall_s": time.perf_counter() - t, "output": out.strip()[-300:]}


def pack(src: Path, dst: Path, codec: str = "huffman") -> dict:
    t = time.perf_counter()
    info = wl_json("pack", src, dst, "--codec", codec)
    info["wall_s"] = time.perf_counter() - t
    return info


def zipnn_case(src: Path, work: Path) -> dict:
    try:
        import zipnn  # noqa: F401
        from zipnn import ZipNN
    except Exception as e:  # the package or its compiled core is missing
        return {"skipped": f"zipnn does not import: {e!r}"}
    data = src.read_bytes()
    original = bytearray(data)  # a copy: whether compress() changes its input is checked below
    z = ZipNN(bytearray_dtype="bfloat16", is_streaming=False, threads=os.cpu_count())
    t = time.perf_counter()
    packed = z.compress(data)
    comp_s = time.perf_counter() - t
    best = None
    for _ in range(3):
        t = time.perf_counter()
        back = z.decompress(packed)
        s = time.perf_counter() - t
        best = s if best is None else min(best, s)
    return {
        "version": getattr(zipnn, "__version__", None),
        "ratio": len(packed) / len(data),
        "compress_s": comp_s,
        "decompress_s": best,
        "decompress_gbps": len(data) / best / 1e9,
        "equal": bytes(back) == bytes(original),
        "input_changed_by_compress": bytes(original) != data,
        "threads": os.cpu_count(),
        "what": "ZipNN's CPU decompression of the whole file into host memory (bytes), best of 3",
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--size", default="4GiB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the checkpoints go (local disk)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--extra", nargs="*", default=[], help="more checkpoints to pack for their ratio")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--codec", default="huffman", help="the packs' codec (weightlift pack --codec)")
    args = ap.parse_args()
    import torch

    args.outdir.mkdir(parents=True, exist_ok=True)
    work = Path(args.dir) / "weightlift-pack-bench"
    work.mkdir(parents=True, exist_ok=True)
    gpu = args.device.startswith("cuda") and torch.cuda.is_available()
    result: dict = {"device": args.device, "gpu": torch.cuda.get_device_name(0) if gpu else None, "cases": {}}
    out_file = args.outdir / "pack-load.json"

    def save() -> None:
        out_file.write_text(json.dumps(result, indent=1))

    def case(name, f):
        say("case", name)
        try:
            result["cases"][name] = f()
        except Exception as e:  # recorded, the other cases go on
            result["cases"][name] = {"error": repr(e), "trace": traceback.format_exc()[-2000:]}
        say(" ", json.dumps(result["cases"][name])[:400])
        save()

    src = work / "weights-bf16.safetensors"
    packed = work / "weights-bf16.wlpack"
    case("input", lambda: weights_bf16(src, parse_size(args.size), "cuda" if gpu else "cpu"))
    case("pack", lambda: pack(src, packed, args.codec))
    raw = src.stat().st_size
    result["raw_bytes"], result["pack_bytes"] = raw, packed.stat().st_size
    if gpu:
        case("pinned_ceiling_gbps", lambda: pinned_ceiling(args.device))
    case("disk_ceiling_gbps", lambda: disk_ceiling(src))
    case("bytes_equal", lambda: same_tensors(src, packed, args.device))
    case("warm_plain", lambda: rates(src, raw, args.device, args.runs, cold=False))
    # verify=True on the unpacked file: its checksum manifest (`weightlift checksum`), checked on the GPU.
    case("checksum", lambda: checksum(src))
    case("warm_plain_verify", lambda: rates(src, raw, args.device, args.runs, cold=False, verify=True))
    case("verify_interleaved", lambda: verify_cost(src, args.device, args.runs))
    case("warm_packed", lambda: rates(packed, raw, args.device, args.runs, cold=False))
    case("cold_plain", lambda: rates(src, raw, args.device, 2, cold=True))
    case("cold_packed", lambda: rates(packed, raw, args.device, 2, cold=True))
    case("warm_packed_host", lambda: rates(packed, raw, "cpu", 2, cold=False))
    case("warm_plain_host", lambda: rates(src, raw, "cpu", 2, cold=False))
    case("zipnn", lambda: zipnn_case(src, work))
    ratios = {}
    if not args.no_llama:
        try:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            import pack_inputs

            llama_dir = work / "llama"
            llama_dir.mkdir(exist_ok=True)
            result["llama"] = pack_inputs.llama(llama_dir, 1024, 8)
            ratios["llama-bf16 (save_pretrained, sharded)"] = pack(
                llama_dir / "llama-bf16" / "model.safetensors.index.json", work / "llama-sharded.wlpack", args.codec
            )
        except Exception as e:
            ratios["llama-bf16 (save_pretrained, sharded)"] = {"error": repr(e)}
    gguf = work / "q.gguf"
    try:
        subprocess.run([WL, "generate", gguf, "--format", "gguf", "--size", "256MiB"], check=True, capture_output=True)
        ratios["gguf (weightlift generate)"] = pack(gguf, work / "q.wlpack", args.codec)
    except Exception as e:
        ratios["gguf (weightlift generate)"] = {"error": repr(e)}
    for extra in args.extra:
        ratios[extra] = pack(Path(extra), work / (Path(extra).name + ".wlpack"), args.codec)
    result["ratios"] = ratios
    c = result["cases"]
    summary = {}
    for k in ("warm_plain", "warm_plain_verify", "warm_packed", "cold_plain", "cold_packed", "warm_packed_host",
              "warm_plain_host"):
        if isinstance(c.get(k), dict) and "gbps" in c[k]:
            summary[k + "_gbps"] = c[k]["gbps"]
    pin, disk = c.get("pinned_ceiling_gbps"), c.get("disk_ceiling_gbps")
    if isinstance(pin, float) and "warm_packed_gbps" in summary:
        summary["warm_packed_to_pinned_ceiling"] = summary["warm_packed_gbps"] / pin
    if isinstance(disk, float) and "cold_packed_gbps" in summary:
        summary["cold_packed_to_disk_ceiling"] = summary["cold_packed_gbps"] / disk
    if "warm_plain_verify_gbps" in summary:
        summary["verify_cost"] = c["warm_plain_verify"]["median_s"] / c["warm_plain"]["median_s"] - 1
    if "cost_median_of_pairs" in c.get("verify_interleaved", {}):
        summary["verify_cost_interleaved"] = c["verify_interleaved"]["cost_median_of_pairs"]
    summary["pack_ratio"] = result["pack_bytes"] / raw
    result["summary"] = summary
    save()
    say("summary", json.dumps(summary))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
