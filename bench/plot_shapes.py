#!/usr/bin/env python3
"""A bar chart of a bench/shapes.py run as SVG: one panel per case (warm, tmpfs, cold, restart, ...), one bar per
method (its best GB/s, a tick at its median), weightlift's bars blue and the peers' grey, and the case's ceiling
measured in the same run as a line. Each panel has its own scale (cold loads run at a twentieth of warm ones).

Written by hand, as `weightlift bench`'s chart is: a few dozen rectangles do not justify a plotting dependency on
the GPU machine or in the tests.

Usage: plot_shapes.py SHAPES.json OUT.svg [--title TEXT]
"""

import argparse
import json
import sys
from xml.sax.saxutils import escape

# The ceiling drawn in each case's panel: the fastest of these (the keys of `ceilings` in shapes.json).
CASE_CEILINGS = {
    "warm": ("pinned_copy",),
    "tmpfs": ("pinned_copy",),
    "cold": ("disk_direct_dd16", "disk_buffered_read16"),
    "restart": ("pinned_copy",),
    "first-load": ("pinned_copy",),
    "sharded warm": ("pinned_copy",),
    "sharded cold": ("disk_direct_dd16", "disk_buffered_read16"),
}
CEILING_NAMES = {"pinned_copy": "pinned host→device copy", "disk_direct_dd16": "disk, 16 × dd iflag=direct",
                 "disk_buffered_read16": "disk, 16 buffered readers"}

LABEL_W, BAR_W, ROW_H, HEAD_H, GAP = 400.0, 460.0, 22.0, 20.0, 14.0


def case_family(case: str) -> str:
    """A result's case as its panel's name: "first-load (fresh process, warm file)" → "first-load"."""
    for name in CASE_CEILINGS:
        if case == name or case.startswith(name + " "):
            return name
    return case.split(" (")[0].split(",")[0]


def ceiling_of(family: str, ceilings: dict) -> "tuple[float, str] | None":
    keys = CASE_CEILINGS.get(family, ())
    rates = [(ceilings[k]["best"], k) for k in keys if isinstance(ceilings.get(k), dict) and "best" in ceilings[k]]
    if not rates:
        return None
    best, key = max(rates)
    return best, f"{CEILING_NAMES.get(key, key)} {best:.2f}"


def panels(data: dict) -> list:
    """[(family, [result, ...]), ...] in the order the run measured them; results without figures are left out."""
    order: list = []
    groups: dict = {}
    for r in data.get("results", []):
        if not isinstance(r.get("best"), (int, float)):
            continue
        fam = case_family(r["case"])
        if fam not in groups:
            groups[fam] = []
            order.append(fam)
        groups[fam].append(r)
    return [(fam, groups[fam]) for fam in order]


def svg(data: dict, title: str) -> str:
    ps = panels(data)
    ceilings = data.get("ceilings", {})
    height = 70.0 + sum(HEAD_H + ROW_H * len(rs) + GAP for _, rs in ps) + 10.0
    width = LABEL_W + BAR_W + 130.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'font-family="sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="10" y="24" font-size="16">{escape(title)}</text>',
           '<text x="10" y="42" fill="#555">bar: best GB/s of the runs (blue: weightlift, grey: peers); white tick: '
           'median; black line: the ceiling measured in the same run; each panel has its own scale</text>']
    y = 70.0
    for fam, rs in ps:
        ceil = ceiling_of(fam, ceilings)
        top = max([r["best"] for r in rs] + [ceil[0] if ceil else 0.0]) * 1.08 or 1.0
        head = fam + (f" · ceiling: {ceil[1]} GB/s" if ceil else "")
        out.append(f'<text x="10" y="{y + 12:.1f}" font-weight="bold">{escape(head)}</text>')
        y += HEAD_H
        first_row = y
        for r in rs:
            w = r["best"] / top * BAR_W
            color = "#9aa5b1" if r.get("peer") else "#2f6fdf"
            out.append(f'<text x="{LABEL_W - 8:.1f}" y="{y + 15:.1f}" text-anchor="end">{escape(r["method"])}</text>')
            out.append(f'<rect class="bar" x="{LABEL_W:.1f}" y="{y + 3:.1f}" width="{w:.1f}" height="{ROW_H - 6:.1f}" '
                       f'fill="{color}"><title>{escape(r["method"])} / {escape(r["case"])}</title></rect>')
            if isinstance(r.get("median"), (int, float)):
                mx = LABEL_W + r["median"] / top * BAR_W
                out.append(f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{y + 4:.1f}" y2="{y + ROW_H - 4:.1f}" '
                           'stroke="white" stroke-width="2"/>')
            out.append(f'<text x="{LABEL_W + w + 6:.1f}" y="{y + 15:.1f}">{r["best"]:.2f}</text>')
            y += ROW_H
        if ceil:
            cx = LABEL_W + ceil[0] / top * BAR_W
            out.append(f'<line class="ceiling" x1="{cx:.1f}" x2="{cx:.1f}" y1="{first_row:.1f}" y2="{y:.1f}" '
                       'stroke="black" stroke-width="2"/>')
        y += GAP
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes_json")
    ap.add_argument("out_svg")
    ap.add_argument("--title", help="default: the GPU (or host) and the file's size")
    a = ap.parse_args()
    with open(a.shapes_json) as f:
        data = json.load(f)
    title = a.title
    if title is None:
        up = (data.get("files") or {}).get("upstream") or {}
        size = f", {up['file_bytes'] / 1e9:.2f} GB file" if up.get("file_bytes") else ""
        title = f"bench/shapes.py on {data.get('gpu') or data.get('device', '?')}{size}"
    with open(a.out_svg, "w") as f:
        f.write(svg(data, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
