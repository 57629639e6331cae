//! Byte planes: `k`-byte groups split so that plane `j` holds byte `j` of every group (the exponent bytes of bf16
//! weights end up together, the mantissa bytes elsewhere), and merged back.

/// Splits `raw` (a multiple of `planes.len()` bytes) into `planes`, each `raw.len() / planes.len()` bytes.
pub fn split(raw: &[u8], planes: &mut [&mut [u8]]) {
    let k = planes.len();
    match planes {
        [p] => p.copy_from_slice(raw),
        [a, b] => {
            for (i, g) in raw.chunks_exact(2).enumerate() {
                a[i] = g[0];
                b[i] = g[1];
            }
        }
        [a, b, c, d] => {
            for (i, g) in raw.chunks_exact(4).enumerate() {
                a[i] = g[0];
                b[i] = g[1];
                c[i] = g[2];
                d[i] = g[3];
            }
        }
        _ => {
            for (i, g) in raw.chunks_exact(k).enumerate() {
                for (p, &byte) in planes.iter_mut().zip(g) {
                    p[i] = byte;
                }
            }
        }
    }
}

/// Merges `planes` (equal lengths) into `out` (`planes.len()` times as long): the inverse of [`split`].
pub fn merge(planes: &[&[u8]], out: &mut [u8]) {
    let k = planes.len();
    match planes {
        [p] => out.copy_from_slice(p),
        [a, b] => {
            for (i, g) in out.chunks_exact_mut(2).enumerate() {
                g[0] = a[i];
                g[1] = b[i];
            }
        }
        [a, b, c, d] => {
            for (i, g) in out.chunks_exact_mut(4).enumerate() {
                g[0] = a[i];
                g[1] = b[i];
                g[2] = c[i];
                g[3] = d[i];
            }
        }
        _ => {
            for (i, g) in out.chunks_exact_mut(k).enumerate() {
                for (byte, p) in g.iter_mut().zip(planes) {
                    *byte = p[i];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_then_merge_is_identity_for_every_plane_count() {
        for k in [1usize, 2, 4, 8] {
            for n in [0usize, 1, 3, 1000] {
                let raw: Vec<u8> = (0..n * k).map(|i| (i * 7 + i / 3) as u8).collect();
                let mut bufs = vec![vec![0u8; n]; k];
                let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
                split(&raw, &mut refs);
                for (j, p) in bufs.iter().enumerate() {
                    assert!(p.iter().enumerate().all(|(i, &b)| b == raw[i * k + j]));
                }
                let mut back = vec![0u8; n * k];
                let planes: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
                merge(&planes, &mut back);
                assert_eq!(back, raw);
            }
        }
    }
}
