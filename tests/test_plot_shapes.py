"""bench/plot_shapes.py: one bar per measured result, scaled within its case's panel, peers told apart, the case's
ceiling drawn; and a committed run's chart has a bar for every figure in its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import plot_shapes  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"

RUN = {
    "gpu": "Test GPU",
    "ceilings": {"pinned_copy": {"best": 50.0, "median": 49.0}, "disk_direct_dd16": {"best": 1.5},
                 "disk_buffered_read16": {"best": 2.0}},
    "results": [
        {"method": "weightlift.load_file", "case": "warm", "peer": False, "best": 40.0, "median": 39.0},
        {"method": "kvikio pread", "case": "warm", "peer": True, "best": 20.0, "median": 10.0},
        {"method": "weightlift.load_file", "case": "cold", "peer": False, "best": 1.8, "median": 1.7},
        {"method": "weightlift.load_file", "case": "first-load (fresh process, warm file)", "peer": False,
         "best": 30.0, "median": 29.0},
        {"method": "broken", "case": "warm", "peer": True, "error": "no figures"},
    ],
}


def bars(root: ET.Element) -> list[ET.Element]:
    return [e for e in root.iter(f"{SVG}rect") if e.get("class") == "bar"]


def test_bars_are_scaled_per_panel_and_peers_are_grey() -> None:
    root = ET.fromstring(plot_shapes.svg(RUN, "t"))
    bs = bars(root)
    assert [b.find(f"{SVG}title").text for b in bs] == [
        "weightlift.load_file / warm", "kvikio pread / warm", "weightlift.load_file / cold",
        "weightlift.load_file / first-load (fresh process, warm file)"]
    wl, peer, cold, first = (float(b.get("width")) for b in bs)
    assert abs(wl / peer - 2.0) < 0.01, "one scale within a panel"
    assert cold > peer, "the cold panel is scaled to its own figures, not to the warm ones"
    fills = [b.get("fill") for b in bs]
    assert fills[1] != fills[0] and fills[0] == fills[2] == fills[3]
    # The warm panel's ceiling (pinned copy, 50 GB/s) lies past its best bar (40 GB/s), at 50/40 of its length.
    lines = [e for e in root.iter(f"{SVG}line") if e.get("class") == "ceiling"]
    assert len(lines) == 3, "warm, cold and first-load each have a ceiling"
    x0 = plot_shapes.LABEL_W
    assert abs((float(lines[0].get("x1")) - x0) / wl - 50.0 / 40.0) < 0.01
    # Cold takes the faster of its two disk ceilings.
    assert abs((float(lines[1].get("x1")) - x0) / cold - 2.0 / 1.8) < 0.01
    heads = [t.text for t in root.iter(f"{SVG}text") if t.get("font-weight") == "bold"]
    assert heads[0].startswith("warm") and "50.00" in heads[0] and "2.00" in heads[1]


def test_a_committed_run_gets_a_bar_for_every_figure(tmp_path: Path) -> None:
    src = ROOT / "bench" / "results" / "2026-11-27-h200-e" / "shapes.json"
    if not src.exists():
        pytest.skip(f"{src} is not in this tree (a GPU bundle carries the tests, not bench/results)")
    out = tmp_path / "shapes.svg"
    subprocess.run([sys.executable, str(ROOT / "bench" / "plot_shapes.py"), str(src), str(out)], check=True)
    results = json.loads(src.read_text())["results"]
    titles = [b.find(f"{SVG}title").text for b in bars(ET.parse(out).getroot())]
    assert sorted(titles) == sorted(f"{r['method']} / {r['case']}" for r in results if "best" in r)
    assert len(titles) == 38
