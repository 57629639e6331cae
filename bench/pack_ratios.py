"""Packs one checkpoint with every compressing codec of `weightlift pack` (not `raw`) and writes the ratios (and whether `weightlift unpack`
gave the file back byte for byte) to a JSON file.

    WEIGHTLIFT_BIN=target/release/weightlift python3 bench/pack_ratios.py MODEL.safetensors OUT.json [--what TEXT]
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CODECS = ("huffman", "zstd", "lz4", "deflate")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--what", default="", help="what the checkpoint is (recorded)")
    args = ap.parse_args()
    wl = os.environ.get("WEIGHTLIFT_BIN") or shutil.which("weightlift") or "weightlift"
    digest = hashlib.sha256(args.checkpoint.read_bytes()).hexdigest()
    result = {"what": args.what, "file_bytes": args.checkpoint.stat().st_size, "sha256": digest, "codecs": {}}
    with tempfile.TemporaryDirectory() as d:
        for codec in CODECS:
            packed, back = Path(d) / f"{codec}.wlpack", Path(d) / "back.safetensors"
            run = subprocess.run([wl, "pack", args.checkpoint, packed, "--codec", codec, "--json"], check=True,
                                 capture_output=True, text=True)
            info = json.loads(run.stdout.strip().splitlines()[-1])
            subprocess.run([wl, "unpack", packed, back], check=True, capture_output=True)
            info["round_trip_equal"] = hashlib.sha256(back.read_bytes()).hexdigest() == digest
            info.pop("out", None)
            result["codecs"][codec] = info
            print(f"{codec:8s} ratio {info['ratio']:.3f}  round trip {'equal' if info['round_trip_equal'] else 'DIFFERS'}")
            back.unlink()
            packed.unlink()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(c["round_trip_equal"] for c in result["codecs"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
