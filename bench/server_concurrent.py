#!/usr/bin/env python3
"""Several processes loading one checkpoint at once, each by itself and each through a load server: the shape the
load server was meant for beside the first load and the restart (bench/shapes.py's ``first-load`` and ``restart``).

    server_concurrent.py FILE --out OUT.json [--device cuda:0] [--procs 1,2,4] [--rounds 3]

Each round starts N fresh processes per mode (``own``: WEIGHTLIFT_SERVER=off; ``server``: one
``python -m weightlift serve --prepare DEVICE`` for the round), lets each make its CUDA context, then releases them
together; each times its one ``load_file(FILE, device)`` (a fresh process's first load of the warm file). The
figures: each process's seconds, the median, and the aggregate (N × bytes over the span from the first start to the
last end). Modes alternate their order from round to round. Every process's tensors are checked after timing: a
positional checksum per tensor against the first process's, whose load was compared byte for byte with
``safetensors``' own read of the file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(path: str, device: str, check_full: bool) -> None:
    import torch

    import weightlift

    sys.path.insert(0, HERE)
    import shapes

    shapes.torch = torch  # the bench imports torch where it is used
    positional = shapes.positional

    torch.zeros(1, device=device)
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.monotonic()
    tensors = weightlift.load_file(path, device=device)
    torch.cuda.synchronize()
    t1 = time.monotonic()
    report = weightlift.last_report()
    if check_full:
        from same_as_safetensors import check

        check(path, tensors, "server_concurrent")
    sums = {k: positional(v.reshape(-1).view(torch.uint8)) for k, v in tensors.items()}
    server = report.get("server") or {}
    print(json.dumps({"start": t0, "end": t1, "seconds": t1 - t0, "sums": sums, "backend": report["backend"],
                      "served": bool(server.get("used")), "server_reason": server.get("reason")}), flush=True)


class Server:
    def __init__(self, device: str):
        self.dir = tempfile.mkdtemp(prefix="wl-serve-")
        self.path = os.path.join(self.dir, "server.sock")
        self.log = open(os.path.join(self.dir, "server.log"), "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "weightlift", "serve", "--socket", self.path,
                                      "--prepare", device], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the load server exited {self.proc.returncode}")
            try:
                with socket.socket(socket.AF_UNIX) as c:
                    c.connect(self.path)
                self.log.seek(0)
                if "listening" in self.log.read():
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the load server did not start within 120 s")
            time.sleep(0.05)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def launch(path: str, device: str, n: int, socket_path: str | None, check_first: bool) -> list[dict]:
    env = dict(os.environ, WEIGHTLIFT_SERVER=socket_path or "off")
    procs = []
    for i in range(n):
        args = [sys.executable, os.path.abspath(__file__), "--child", path, "--device", device]
        if check_first and i == 0:
            args.append("--check-full")
        procs.append(subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a child did not start: exit {p.wait()}")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    answers = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"a child exited {p.returncode}")
        answers.append(json.loads(lines[-1]))
    return answers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--check-full", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.child and not a.out:
        ap.error("--out is required")
    if a.child:
        child(a.file, a.device, a.check_full)
        return 0
    nbytes = os.path.getsize(a.file)
    warm(a.file)
    reference = None
    rows = []
    for rnd in range(a.rounds):
        modes = ("own", "server") if rnd % 2 == 0 else ("server", "own")
        for mode in modes:
            srv = Server(a.device) if mode == "server" else None
            try:
                for n in [int(x) for x in a.procs.split(",")]:
                    answers = launch(a.file, a.device, n, srv and srv.path, reference is None)
                    for ans in answers:
                        if reference is None:
                            reference = ans["sums"]
                        if ans["sums"] != reference:
                            raise SystemExit(f"{mode} N={n}: a process's tensors differ from the reference")
                        if (mode == "server") != bool(ans["served"]):
                            raise SystemExit(f"{mode} N={n}: served={ans['served']} ({ans['server_reason']})")
                    span = max(x["end"] for x in answers) - min(x["start"] for x in answers)
                    secs = [round(x["seconds"], 5) for x in answers]
                    row = {"round": rnd, "mode": mode, "procs": n, "seconds": secs,
                           "median_s": round(statistics.median(secs), 5), "span_s": round(span, 5),
                           "aggregate_gbps": round(n * nbytes / span / 1e9, 3)}
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
            finally:
                if srv is not None:
                    srv.close()
    summary = {}
    for n in sorted({r["procs"] for r in rows}):
        for mode in ("own", "server"):
            sel = [r for r in rows if r["procs"] == n and r["mode"] == mode]
            summary[f"{mode}_{n}"] = {"median_s": statistics.median(r["median_s"] for r in sel),
                                      "median_aggregate_gbps": statistics.median(r["aggregate_gbps"] for r in sel)}
        own, srv = summary[f"own_{n}"], summary[f"server_{n}"]
        summary[f"server_gain_{n}"] = round(own["median_s"] / srv["median_s"], 4)
    result = {"file": a.file, "bytes": nbytes, "device": a.device, "rows": rows, "summary": summary,
              "checked": "first process byte for byte against safetensors; every other by positional checksums"}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
