//! `weightlift pack`, `unpack`, `checksum`, and `inspect` of a pack.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use indicatif::ProgressBar;
use serde_json::{Value, json};
use weightlift::format::wlpack::{Codec, ItemKind, PackIndex};
use weightlift_pack::{Level, Pack, PackOptions, manifest};

use crate::units;

#[derive(clap::Args, Debug)]
pub struct PackArgs {
    /// Checkpoint to pack: a safetensors file, a model.safetensors.index.json, or a GGUF file.
    pub input: PathBuf,
    /// The pack to write (conventionally NAME.wlpack).
    pub out: PathBuf,
    /// Codec for the planes that shrink with it (huffman, zstd, lz4, deflate, raw); the others are stored raw.
    /// huffman decodes on the GPU with weightlift's own kernel (no nvCOMP needed) far faster than the link; zstd
    /// shrinks repetitive data further but nvCOMP decodes it at about the link's speed.
    #[arg(long, default_value = "huffman", value_parser = parse_codec)]
    pub codec: Codec,
    /// Compression level (zstd 1-22; deflate 1-9; huffman and lz4 have one, and accept 1-22).
    #[arg(long, default_value_t = 3)]
    pub level: i32,
    /// Bytes per plane per chunk, 512 to 2MiB (64KiB: 64 segments for the Huffman kernel, and what nvCOMP's batched
    /// GPU decoders do best with).
    #[arg(long, default_value = "64KiB", value_parser = units::parse_size)]
    pub plane_chunk: u64,
    /// Encoder threads (0: one per CPU).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct UnpackArgs {
    /// The pack to read.
    pub input: PathBuf,
    /// Where the original file goes (a directory for a pack of several files).
    pub out: PathBuf,
    /// Decoder threads (0: one per CPU).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Decode and check every chunk without writing anything (OUT is ignored).
    #[arg(long)]
    pub check: bool,
}

#[derive(clap::Args, Debug)]
pub struct ChecksumArgs {
    /// Checkpoint: a safetensors file, a model.safetensors.index.json, or a GGUF file.
    pub input: PathBuf,
    /// Manifest to write (default: INPUT.xxh3.json).
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Check INPUT against an existing manifest (this one, or --out) instead of writing one.
    #[arg(long)]
    pub verify: bool,
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

fn parse_codec(s: &str) -> Result<Codec, String> {
    Codec::parse(s).ok_or_else(|| format!("unknown codec {s:?} (huffman, zstd, lz4, deflate, raw)"))
}

fn bar(what: &str) -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(units::bar_style("{msg} [{bar:40}] {bytes}/{total_bytes} {rate} eta {eta}"));
    bar.set_message(what.to_string());
    bar
}

fn tick(bar: &ProgressBar) -> impl Fn(u64, u64) + Sync + '_ {
    move |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    }
}

pub fn pack(args: &PackArgs) -> Result<()> {
    let opts = PackOptions {
        codec: args.codec,
        level: Level(args.level),
        plane_chunk: args.plane_chunk,
        threads: args.threads,
        ..PackOptions::default()
    };
    opts.validate()?;
    crate::out::remove_partial_output_on_interrupt("pack")?;
    let progress = bar("packing");
    let start = Instant::now();
    let s = weightlift_pack::pack(&args.input, &args.out, &opts, &tick(&progress))?;
    progress.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let ratio = s.pack_bytes as f64 / s.raw_bytes.max(1) as f64;
    if args.json {
        let v = json!({"out": args.out, "files": s.files, "tensors": s.tensors, "chunks": s.chunks,
            "raw_bytes": s.raw_bytes, "pack_bytes": s.pack_bytes, "ratio": ratio, "seconds": secs, "codec": args.codec.name()});
        println!("{v}");
    } else {
        println!(
            "wrote {}: {} tensors of {} file(s), {} → {} ({:.3} of the original), {} chunks, {:.2} s ({}/s)",
            args.out.display(),
            s.tensors,
            s.files,
            units::bytes(s.raw_bytes),
            units::bytes(s.pack_bytes),
            ratio,
            s.chunks,
            secs,
            units::bytes((s.raw_bytes as f64 / secs.max(1e-9)) as u64)
        );
    }
    Ok(())
}

pub fn unpack(args: &UnpackArgs) -> Result<()> {
    let pack = Pack::open(&args.input)?;
    if !args.check {
        crate::out::remove_partial_output_on_interrupt("unpack")?;
    }
    let progress = bar(if args.check { "checking" } else { "unpacking" });
    let start = Instant::now();
    if args.check {
        weightlift_pack::verify(&pack, args.threads, &tick(&progress))?;
        progress.finish_and_clear();
        println!("{}: every chunk decodes and matches its checksum", args.input.display());
        return Ok(());
    }
    let written = weightlift_pack::unpack(&pack, &args.out, args.threads, &tick(&progress))?;
    progress.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    for w in &written {
        println!("wrote {}", w.display());
    }
    println!("{} in {:.2} s, every chunk checked", units::bytes(pack.index.raw_bytes()), secs);
    Ok(())
}

pub fn checksum(args: &ChecksumArgs) -> Result<()> {
    let out = args.out.clone().unwrap_or_else(|| {
        let mut name = args.input.as_os_str().to_os_string();
        name.push(manifest::SUFFIX);
        PathBuf::from(name)
    });
    if args.verify {
        let m = manifest::Manifest::read(&out)?;
        manifest::verify(&args.input, &m, args.threads)?;
        println!("{}: {} tensors match {}", args.input.display(), m.tensors.len(), out.display());
        return Ok(());
    }
    // Refused before the hashing, not after: the manifest must not replace the checkpoint (or a shard of it).
    let index = weightlift::format::open(std::slice::from_ref(&args.input), None)?;
    let inputs: Vec<&Path> =
        std::iter::once(args.input.as_path()).chain(index.files.iter().map(|f| f.path.as_path())).collect();
    weightlift::format::output::check_target(&out, &inputs)?;
    crate::out::remove_partial_output_on_interrupt("checksum")?;
    let progress = bar("hashing");
    let m = manifest::create(&args.input, args.threads, &tick(&progress))?;
    progress.finish_and_clear();
    m.write(&out, &inputs)?;
    let chunks: usize = m.tensors.iter().map(|t| t.chunks.len()).sum();
    println!(
        "wrote {}: {} tensors, {chunks} chunks of up to {}",
        out.display(),
        m.tensors.len(),
        units::bytes(m.chunk_bytes)
    );
    Ok(())
}

/// Stored and raw bytes per plane.
#[derive(Default, Clone, Copy)]
struct Sizes {
    raw: u64,
    stored: u64,
}

impl Sizes {
    fn ratio(self) -> f64 {
        self.stored as f64 / self.raw.max(1) as f64
    }
}

fn plane_sizes(index: &PackIndex, item: &weightlift::format::wlpack::Item) -> Vec<Sizes> {
    let mut planes = vec![Sizes::default(); usize::from(item.planes)];
    for c in item.chunks.clone() {
        for s in index.chunk_streams(c, item.planes) {
            let p = &mut planes[usize::from(s.plane)];
            p.raw += s.raw_len;
            p.stored += s.stored_len;
        }
    }
    planes
}

/// `inspect` of a pack: the ratio overall, per dtype and plane, and per tensor.
pub fn inspect(path: &Path, json_out: bool, top: usize) -> Result<()> {
    let index = weightlift::format::wlpack::read(path)?;
    let mut by_dtype: BTreeMap<String, Vec<Sizes>> = BTreeMap::new();
    let mut tensors = Vec::new();
    let mut codecs: BTreeMap<&str, u64> = BTreeMap::new();
    for s in &index.streams {
        *codecs.entry(s.codec.name()).or_default() += 1;
    }
    for item in &index.items {
        let planes = plane_sizes(&index, item);
        let key = match &item.kind {
            ItemKind::Tensor { dtype, .. } => dtype.name().to_string(),
            ItemKind::Gap => "(between tensors)".to_string(),
        };
        let acc = by_dtype.entry(key).or_insert_with(|| vec![Sizes::default(); planes.len()]);
        for (a, p) in acc.iter_mut().zip(&planes) {
            a.raw += p.raw;
            a.stored += p.stored;
        }
        if let ItemKind::Tensor { name, dtype, shape } = &item.kind {
            tensors.push((name.clone(), *dtype, shape.clone(), planes));
        }
    }
    let total = Sizes { raw: index.raw_bytes(), stored: index.len };
    if json_out {
        let planes_json = |p: &[Sizes]| -> Value {
            p.iter().map(|s| json!({"raw": s.raw, "stored": s.stored, "ratio": s.ratio()})).collect()
        };
        let v = json!({
            "path": path, "source": index.source, "files": index.files, "raw_bytes": total.raw, "pack_bytes": total.stored,
            "ratio": total.ratio(), "chunks": index.chunks.len(), "streams": codecs,
            "dtypes": by_dtype.iter().map(|(d, p)| (d.clone(), planes_json(p))).collect::<serde_json::Map<_, _>>(),
            "tensors": tensors.iter().map(|(n, d, s, p)| json!({"name": n, "dtype": d.name(), "shape": s, "planes": planes_json(p)})).collect::<Vec<_>>(),
        });
        println!("{v}");
        return Ok(());
    }
    println!(
        "{}: wlpack of {} ({} file(s)), {} tensors, {} chunks",
        path.display(),
        index.source,
        index.files.len(),
        tensors.len(),
        index.chunks.len()
    );
    println!("  {} → {} ({:.3} of the original)", units::bytes(total.raw), units::bytes(total.stored), total.ratio());
    println!("  streams: {}", codecs.iter().map(|(c, n)| format!("{n} {c}")).collect::<Vec<_>>().join(", "));
    let fmt_planes = |p: &[Sizes]| p.iter().map(|s| format!("{:.3}", s.ratio())).collect::<Vec<_>>().join(" ");
    println!("  ratio per plane (plane 0 = lowest byte):");
    for (d, p) in &by_dtype {
        let all = Sizes { raw: p.iter().map(|s| s.raw).sum(), stored: p.iter().map(|s| s.stored).sum() };
        println!("    {d:<18} {:>10}  {:.3}  [{}]", units::bytes(all.raw), all.ratio(), fmt_planes(p));
    }
    tensors.sort_by_key(|t| std::cmp::Reverse(t.3.iter().map(|s| s.raw).sum::<u64>()));
    println!("  largest tensors:");
    for (name, dtype, shape, planes) in tensors.iter().take(top) {
        let raw: u64 = planes.iter().map(|s| s.raw).sum();
        let stored: u64 = planes.iter().map(|s| s.stored).sum();
        println!(
            "    {name} {dtype} {shape:?}: {} → {:.3} [{}]",
            units::bytes(raw),
            stored as f64 / raw.max(1) as f64,
            fmt_planes(planes)
        );
    }
    Ok(())
}
