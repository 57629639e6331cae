//! A horizontal bar chart of a bench's cases as SVG: one bar per case (best GB/s), a mark at its ceiling.
//! Written by hand: a dozen rectangles do not justify a plotting dependency.

use std::fmt::Write;

use super::case::Case;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

pub fn svg(title: &str, cases: &[Case]) -> String {
    let (label_w, bar_w, row_h, top) = (360.0, 520.0, 26.0, 50.0);
    let max = cases.iter().flat_map(|c| [c.rate.best(), c.ceiling_gbps.unwrap_or(0.0)]).fold(1.0, f64::max) * 1.08;
    let height = top + row_h * cases.len() as f64 + 50.0;
    let width = label_w + bar_w + 120.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"##
    );
    let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let _ = writeln!(s, r##"<text x="10" y="24" font-size="16">{}</text>"##, escape(title));
    let _ = writeln!(
        s,
        r##"<text x="10" y="40" fill="#555">bar: best GB/s of the runs; black mark: the ceiling measured in the same run</text>"##
    );
    for (i, c) in cases.iter().enumerate() {
        let y = top + row_h * i as f64;
        let w = c.rate.best() / max * bar_w;
        let peer = c.extra.get("peer").is_some();
        let color = if peer { "#9aa5b1" } else { "#2f6fdf" };
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{}</text>"##,
            label_w - 8.0,
            y + 16.0,
            escape(&c.name)
        );
        let _ = writeln!(
            s,
            r##"<rect x="{label_w}" y="{}" width="{w:.1}" height="{}" fill="{color}"/>"##,
            y + 4.0,
            row_h - 8.0
        );
        let ratio = c.ratio().map(|r| format!(" ({:.0}%)", r * 100.0)).unwrap_or_default();
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{}">{:.2}{}</text>"##,
            label_w + w + 6.0,
            y + 16.0,
            c.rate.best(),
            ratio
        );
        if let Some(cg) = c.ceiling_gbps {
            let x = label_w + cg / max * bar_w;
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{}" stroke="black" stroke-width="2"/>"##,
                y + 1.0,
                y + row_h - 1.0
            );
        }
    }
    let axis_y = top + row_h * cases.len() as f64 + 8.0;
    let _ =
        writeln!(s, r##"<line x1="{label_w}" x2="{}" y1="{axis_y}" y2="{axis_y}" stroke="#333"/>"##, label_w + bar_w);
    let step = nice_step(max);
    let mut v = 0.0;
    while v <= max {
        let x = label_w + v / max * bar_w;
        let _ =
            writeln!(s, r##"<text x="{x:.1}" y="{}" text-anchor="middle" fill="#333">{v:.0}</text>"##, axis_y + 16.0);
        v += step;
    }
    let _ = writeln!(s, r##"<text x="{}" y="{}" fill="#333">GB/s</text>"##, label_w + bar_w + 10.0, axis_y + 16.0);
    s.push_str("</svg>\n");
    s
}

fn nice_step(max: f64) -> f64 {
    let raw = max / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(mag * 10.0)
}
