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
}
