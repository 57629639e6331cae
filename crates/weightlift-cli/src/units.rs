//! Byte counts in and out: `1GiB` on the command line, `4.18 GiB` in reports.

/// Parses `123`, `4k`, `4KiB`, `512MiB`, `1GiB` (binary units for both spellings, as storage tools do) — the same
/// parser the `WEIGHTLIFT_*` byte settings use.
pub fn parse_size(s: &str) -> Result<u64, String> {
    weightlift::io::parse_bytes(s).map_err(|e| format!("{s:?}: {e} (try 1GiB, 512MiB, 4096)"))
}

/// `4.18 GiB`, `512 B`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 { format!("{n} B") } else { format!("{v:.2} {}", UNITS[i]) }
}

/// Seconds of work before a rate is shown: earlier, a burst of bytes over a few milliseconds reads as TiB/s.
const RATE_AFTER_SECS: f64 = 1.0;

/// The mean rate since the bar's start, once it has run for a second and moved some bytes.
fn steady_rate(pos: u64, elapsed_secs: f64) -> Option<f64> {
    (elapsed_secs >= RATE_AFTER_SECS && pos > 0).then(|| pos as f64 / elapsed_secs)
}

/// A progress bar style from `template`, where `{rate}` is the mean rate since the start (blank for the first
/// second) and `{eta}` the time left at that rate; indicatif's own estimates start from the first jump in position
/// and can read as absurd rates.
pub fn bar_style(template: &str) -> indicatif::ProgressStyle {
    use indicatif::ProgressState;
    use std::fmt::Write;
    let rate = |s: &ProgressState| steady_rate(s.pos(), s.elapsed().as_secs_f64());
    indicatif::ProgressStyle::with_template(template)
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .with_key("rate", move |s: &ProgressState, w: &mut dyn Write| {
            let _ = match rate(s) {
                Some(r) => write!(w, "{}/s", bytes(r as u64)),
                None => write!(w, "…"),
            };
        })
        .with_key("eta", move |s: &ProgressState, w: &mut dyn Write| {
            let left = s.len().map(|len| len.saturating_sub(s.pos()));
            let _ = match (rate(s), left) {
                (Some(r), Some(left)) => write!(w, "{:.0} s", left as f64 / r),
                _ => write!(w, "…"),
            };
        })
        .progress_chars("=> ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512MB"), Ok(512 << 20));
        assert!(parse_size("ten").is_err());
        assert!(parse_size("5 parsecs").is_err());
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 30), "3.00 GiB");
    }

    #[test]
    fn no_rate_before_a_second_of_work() {
        // The first reading of a load: 32 MiB arrived 2 ms after the bar appeared.
        assert_eq!(steady_rate(32 << 20, 0.002), None);
        assert_eq!(steady_rate(0, 5.0), None);
        let r = steady_rate(3 << 30, 2.0).unwrap();
        assert!((r - 1.5 * (1u64 << 30) as f64).abs() < 1.0);
    }
}
