//! Times the steps of opening a `.wlpack` (`pack_open [PACK [ROUNDS]]`): reading its preamble, header and tables,
//! hashing them, parsing the header, the whole validated read, and `weightlift::Pack::open`. Prints JSON with the
//! minimum and median of each step over the rounds. Without a path it times a small pack written for the run.

mod common;

use std::os::unix::fs::FileExt;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = tempfile::tempdir()?;
    let path = match args.next() {
        Some(p) => std::path::PathBuf::from(p),
        None => {
            let checkpoint = common::weights(dir.path(), 8, 512, 1)?;
            let pack = dir.path().join("model.wlpack");
            weightlift_pack::pack(&checkpoint, &pack, &Default::default(), &|_, _| {})?;
            pack
        }
    };
    let rounds: usize = args.next().map_or(Ok(30), |s| s.parse())?;
    if rounds == 0 {
        return Err("ROUNDS must be at least 1".into());
    }
    // Checked (and the index validated) once before anything is sized from the file.
    weightlift::Pack::open(&path)?;
    let mut steps: Vec<(&str, Vec<f64>)> =
        ["read_preamble", "read_header", "read_tables", "hash", "parse_header", "format_read", "pack_open"]
            .iter()
            .map(|&n| (n, Vec::new()))
            .collect();
    for _ in 0..rounds {
        let mut t = Instant::now();
        let lap = |i: usize, steps: &mut Vec<(&str, Vec<f64>)>, t: &mut Instant| {
            steps[i].1.push(t.elapsed().as_secs_f64() * 1e3);
            *t = Instant::now();
        };
        let f = std::fs::File::open(&path)?;
        let mut pre = [0u8; 32];
        f.read_exact_at(&mut pre, 0)?;
        let word = |i: usize| u64::from_le_bytes(pre[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        let (header_len, tables_len) = (word(1), word(2));
        lap(0, &mut steps, &mut t);
        let mut header = vec![0u8; header_len as usize];
        f.read_exact_at(&mut header, 32)?;
        lap(1, &mut steps, &mut t);
        let mut tables = vec![0u8; tables_len as usize];
        f.read_exact_at(&mut tables, 32 + header_len)?;
        lap(2, &mut steps, &mut t);
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&header);
        h.update(&tables);
        std::hint::black_box(h.digest());
        lap(3, &mut steps, &mut t);
        std::hint::black_box(serde_json::from_slice::<serde_json::Value>(&header)?);
        lap(4, &mut steps, &mut t);
        drop((header, tables));
        t = Instant::now();
        std::hint::black_box(weightlift::format::wlpack::read(&path)?);
        lap(5, &mut steps, &mut t);
        std::hint::black_box(weightlift::Pack::open(&path)?);
        lap(6, &mut steps, &mut t);
    }
    let mut out = serde_json::Map::new();
    for (name, mut v) in steps {
        v.sort_by(f64::total_cmp);
        out.insert(name.into(), serde_json::json!({"min_ms": v[0], "median_ms": v[v.len() / 2]}));
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
