//! The C API from both sides: the C and C++ examples compiled with the system compilers and run against
//! generated checkpoints (every byte checked by the examples themselves against stdio reads), and the error paths
//! called directly (NULL pointers, missing files, FIFOs, reads past the end, LBAs past the device, unknown kinds).

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr;

use weightlift_capi::*;

/// Where cargo left libweightlift_capi.so: beside this test executable (target/<profile>/deps, where `cargo test`
/// builds it) or one folder up (target/<profile>, where `cargo build` puts it).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("the test's folder").to_path_buf();
    match deps.parent() {
        Some(up) if !deps.join("libweightlift_capi.so").exists() => up.to_path_buf(),
        _ => deps,
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Compiles `source` with `compiler` against the header and the shared library, or says why it cannot.
fn compile(compiler: &str, source: &str, extra: &[&str], out: &Path) -> Result<(), String> {
    let lib = lib_dir();
    if !lib.join("libweightlift_capi.so").exists() {
        return Err(format!("{} has no libweightlift_capi.so", lib.display()));
    }
    let status = Command::new(compiler)
        .args(extra)
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(repo().join("include"))
        .arg(repo().join(source))
        .arg("-L")
        .arg(&lib)
        .arg("-lweightlift_capi")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(out)
        .status()
        .map_err(|e| format!("{compiler}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{compiler} failed on {source}")) }
}

fn compiled(compiler: &str, source: &str, extra: &[&str], out: &Path) -> bool {
    match compile(compiler, source, extra, out) {
        Ok(()) => true,
        Err(why) if std::env::var_os("WEIGHTLIFT_REQUIRE_CC").is_none() && why.contains("No such file") => {
            eprintln!("skipped: cannot compile {source}: {why} (set WEIGHTLIFT_REQUIRE_CC=1 to make this a failure)");
            false
        }
        Err(why) => panic!("cannot compile {source}: {why}"),
    }
}

fn generate(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let path = dir.join(name);
    let layout = match args.first() {
        Some(&"many-small") => weightlift::format::synth::Layout::ManySmall { tensors: Some(300) },
        _ => weightlift::format::synth::Layout::Llama,
    };
    let spec = weightlift::format::synth::Spec {
        layout,
        container: weightlift::format::synth::Container::Safetensors,
        size: 24 << 20,
        seed: 7,
        align: None,
    };
    weightlift::format::synth::generate(&path, &spec).expect("generate a checkpoint");
    path
}

#[test]
fn c_and_cpp_examples_load_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let llama = generate(dir.path(), "llama.safetensors", &[]);
    let small = generate(dir.path(), "small.safetensors", &["many-small"]);
    let c_bin = dir.path().join("load");
    if compiled("cc", "examples/c/load.c", &[], &c_bin) {
        for ckpt in [&llama, &small] {
            let out = Command::new(&c_bin).arg(ckpt).output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            eprint!("{text}{}", String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "examples/c/load.c failed on {}", ckpt.display());
            assert!(text.contains(" 0 mismatches"), "{text}");
        }
        // A missing file: exit 2 with weightlift's message naming it.
        let out = Command::new(&c_bin).arg(dir.path().join("missing.safetensors")).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("WL_ERR_NOT_FOUND") && err.contains("missing.safetensors"), "{err}");
    }
    let cpp_bin = dir.path().join("layers");
    if compiled("c++", "examples/cpp/layers.cpp", &["-std=c++17"], &cpp_bin) {
        let out = Command::new(&cpp_bin).arg(&llama).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        eprint!("{text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "examples/cpp/layers.cpp failed");
        assert!(text.contains(" 0 mismatches"), "{text}");
    }
}

fn last_error() -> String {
    // SAFETY: wl_last_error always returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(wl_last_error()) }.to_string_lossy().into_owned()
}

struct Engine(*mut wl_engine);
impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: opened by `engine()`, closed once.
        unsafe { wl_engine_close(self.0) };
    }
}

fn engine() -> Engine {
    let mut e = ptr::null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { wl_engine_open(ptr::null(), &mut e) }, wl_status::WL_OK, "{}", last_error());
    Engine(e)
}

fn host(buf: &mut [u8]) -> wl_mem {
    wl_mem { device: WL_HOST, ptr: buf.as_mut_ptr() as u64, len: buf.len() as u64 }
}

#[test]
fn errors_are_statuses_with_messages() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let file = dir.path().join("data.bin");
    std::fs::write(&file, &data).unwrap();
    let cfile = CString::new(file.to_str().unwrap()).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: (all calls below) valid pointers to live objects and buffers of the lengths passed.
    unsafe {
        // NULL arguments.
        assert_eq!(wl_engine_open(ptr::null(), ptr::null_mut()), wl_status::WL_ERR_INVALID_ARGUMENT);
        assert_eq!(wl_read(e.0, ptr::null(), 0, host(&mut buf), ptr::null_mut()), wl_status::WL_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("path is NULL"));
        // A bad setting names itself.
        let mut e2 = ptr::null_mut();
        let bad = CString::new("threads=lots").unwrap();
        assert_eq!(wl_engine_open(bad.as_ptr(), &mut e2), wl_status::WL_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("threads"), "{}", last_error());
        // pread semantics: fewer bytes at the end, none past it.
        let mut n = 0;
        assert_eq!(wl_read(e.0, cfile.as_ptr(), 8000, host(&mut buf), &mut n), wl_status::WL_OK);
        assert_eq!(n, 2000);
        assert_eq!(&buf[..2000], &data[8000..]);
        assert_eq!(wl_read(e.0, cfile.as_ptr(), 20_000, host(&mut buf), &mut n), wl_status::WL_OK);
        assert_eq!(n, 0);
        // Missing file, FIFO.
        let missing = CString::new(dir.path().join("nope").to_str().unwrap()).unwrap();
        assert_eq!(wl_read(e.0, missing.as_ptr(), 0, host(&mut buf), &mut n), wl_status::WL_ERR_NOT_FOUND);
        assert!(last_error().contains("nope"));
        let fifo = dir.path().join("fifo");
        let cfifo = CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(libc_mkfifo(&cfifo), 0);
        assert_eq!(wl_read(e.0, cfifo.as_ptr(), 0, host(&mut buf), &mut n), wl_status::WL_ERR_NOT_A_FILE);
        let mut ck = ptr::null_mut();
        assert_ne!(wl_checkpoint_open(cfifo.as_ptr(), &mut ck), wl_status::WL_OK);
        let mut blk = ptr::null_mut();
        assert_eq!(wl_block_open(e.0, cfifo.as_ptr(), 0, &mut blk), wl_status::WL_ERR_NOT_A_FILE);
        // A malformed checkpoint.
        let junk = dir.path().join("junk.safetensors");
        std::fs::write(&junk, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a header").unwrap();
        let cjunk = CString::new(junk.to_str().unwrap()).unwrap();
        assert_eq!(wl_checkpoint_open(cjunk.as_ptr(), &mut ck), wl_status::WL_ERR_FORMAT);
        assert!(last_error().contains("junk.safetensors"), "{}", last_error());
        // Host memory with a CUDA stream is refused.
        let mut op = ptr::null_mut();
        let fake_stream = 8usize as *mut std::ffi::c_void;
        assert_eq!(
            wl_read_async(e.0, cfile.as_ptr(), 0, host(&mut buf), fake_stream, &mut op),
            wl_status::WL_ERR_INVALID_ARGUMENT
        );
        // Preparing: a NULL engine and a device that is neither host nor a CUDA ordinal are refused; the host
        // is always there to prepare for, twice over.
        assert_eq!(wl_engine_prepare(ptr::null(), WL_HOST), wl_status::WL_ERR_INVALID_ARGUMENT);
        assert_eq!(wl_engine_prepare(e.0, -5), wl_status::WL_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("device -5"), "{}", last_error());
        assert_eq!(wl_engine_prepare(e.0, WL_HOST), wl_status::WL_OK, "{}", last_error());
        assert_eq!(wl_engine_prepare(e.0, WL_HOST), wl_status::WL_OK, "{}", last_error());
        if let Err(why) = weightlift::cuda::available() {
            assert_ne!(wl_engine_prepare(e.0, 0), wl_status::WL_OK, "prepared cuda:0 without CUDA ({why})");
            assert!(!last_error().is_empty());
        }
        // Status names.
        assert_eq!(CStr::from_ptr(wl_status_name(wl_status::WL_ERR_IO as i32)).to_str().unwrap(), "WL_ERR_IO");
    }
}

/// The hostile caller: values no status has, offsets at the end of the u64 range, NULL out-pointers on every
/// entry point with a result to hand back. Each is a status with a message, never a crash or a caught panic.
#[test]
fn hostile_arguments_are_invalid_argument_never_a_crash_or_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine();
    let ckpt_path = generate(dir.path(), "m.safetensors", &[]);
    let cckpt = CString::new(ckpt_path.to_str().unwrap()).unwrap();
    let file = dir.path().join("w.bin");
    std::fs::write(&file, vec![1u8; 8192]).unwrap();
    let cfile = CString::new(file.to_str().unwrap()).unwrap();
    let data = [9u8; 16];
    let src = wl_mem { device: WL_HOST, ptr: data.as_ptr() as u64, len: data.len() as u64 };
    let invalid = wl_status::WL_ERR_INVALID_ARGUMENT;
    // SAFETY: (all calls below) valid pointers to live objects and buffers of the lengths passed, NULL where the
    // test says so.
    unsafe {
        for bad in [999, -1, 14, i32::MIN, i32::MAX] {
            assert_eq!(CStr::from_ptr(wl_status_name(bad)).to_str().unwrap(), "unknown status");
        }
        assert_eq!(CStr::from_ptr(wl_status_name(11)).to_str().unwrap(), "WL_ERR_INTERNAL");
        assert_eq!(CStr::from_ptr(wl_status_name(12)).to_str().unwrap(), "WL_ERR_ACCESS_DENIED");
        assert_eq!(CStr::from_ptr(wl_status_name(13)).to_str().unwrap(), "WL_ERR_CHECKSUM");

        // Offsets whose end overflows u64 or passes the largest file offset: EINVAL, as pwrite(2) says.
        for offset in [u64::MAX - 4, u64::MAX, i64::MAX as u64 - 4] {
            let mut n = 7;
            assert_eq!(wl_write(e.0, cfile.as_ptr(), offset, src, 0, &mut n), invalid, "offset {offset}");
            assert!(last_error().contains("w.bin"), "{}", last_error());
            assert_eq!(n, 7, "a failed write reported a count");
            let mut buf = [0u8; 16];
            assert_eq!(wl_read(e.0, cfile.as_ptr(), offset, host(&mut buf), &mut n), wl_status::WL_OK);
            assert_eq!(n, 0, "a read past the end of the file reads nothing");
        }
        assert_eq!(std::fs::metadata(&file).unwrap().len(), 8192, "a refused write changed the file");
        // Device memory at address 0.
        let zero = wl_mem { device: 0, ptr: 0, len: 16 };
        assert_eq!(wl_write(e.0, cfile.as_ptr(), 0, zero, 0, ptr::null_mut()), invalid);

        // NULL out-pointers where the result is the point of the call.
        let mut ck = ptr::null_mut();
        assert_eq!(wl_checkpoint_open(cckpt.as_ptr(), ptr::null_mut()), invalid);
        assert_eq!(wl_checkpoint_open(cckpt.as_ptr(), &mut ck), wl_status::WL_OK, "{}", last_error());
        let name = CString::new("model.embed_tokens.weight").unwrap();
        let mut i = usize::MAX;
        assert_eq!(wl_checkpoint_find(ck, name.as_ptr(), &mut i), wl_status::WL_OK, "{}", last_error());
        assert_eq!(wl_checkpoint_find(ck, name.as_ptr(), ptr::null_mut()), invalid);
        assert!(last_error().contains("index is NULL"), "{}", last_error());
        assert_eq!(wl_checkpoint_tensor(ck, i, ptr::null_mut()), invalid);
        let mut blk = ptr::null_mut();
        assert_eq!(wl_block_open(e.0, cfile.as_ptr(), 0, ptr::null_mut()), invalid);
        assert_eq!(wl_block_open(e.0, cfile.as_ptr(), 0, &mut blk), wl_status::WL_OK);
        assert_eq!(wl_block_info(blk, ptr::null_mut(), ptr::null_mut()), invalid);
        let mut regions = ptr::null_mut();
        assert_eq!(wl_regions_new(blk, ptr::null_mut()), invalid);
        assert_eq!(wl_regions_new(blk, &mut regions), wl_status::WL_OK);
        let kind = CString::new("weights").unwrap();
        assert_eq!(wl_regions_set(regions, kind.as_ptr(), 0, 4), wl_status::WL_OK);
        assert_eq!(wl_regions_get(regions, kind.as_ptr(), ptr::null_mut(), ptr::null_mut()), invalid);
        let mut buf = [0u8; 16];
        assert_eq!(wl_read_async(e.0, cfile.as_ptr(), 0, host(&mut buf), ptr::null_mut(), ptr::null_mut()), invalid);
        assert_eq!(wl_block_read_async(blk, 0, 0, host(&mut buf), ptr::null_mut(), ptr::null_mut()), invalid);
        let layer_of = vec![0u32; wl_checkpoint_len(ck)];
        assert_eq!(wl_layers_open(e.0, ck, layer_of.as_ptr(), 1, WL_HOST, 2, ptr::null_mut()), invalid);
        let mut layers = ptr::null_mut();
        assert_eq!(wl_layers_open(e.0, ck, layer_of.as_ptr(), 1, WL_HOST, 2, &mut layers), wl_status::WL_OK);
        assert_eq!(wl_layers_load(layers, 0, ptr::null_mut(), ptr::null_mut()), invalid);
        assert_eq!(wl_layers_stats_get(layers, ptr::null_mut()), invalid);
        assert_eq!(wl_cuda_alloc(e.0, 0, 16, ptr::null_mut()), invalid);
        assert_eq!(wl_op_wait(ptr::null_mut(), ptr::null_mut()), invalid);
        wl_layers_close(layers);
        wl_regions_free(regions);
        wl_block_close(blk);
        wl_checkpoint_close(ck);
    }
}

fn libc_mkfifo(path: &CString) -> i32 {
    Command::new("mkfifo").arg(path.to_str().unwrap()).status().map(|s| if s.success() { 0 } else { 1 }).unwrap_or(1)
}

#[test]
fn async_read_and_write_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let file = dir.path().join("w.bin");
    let cfile = CString::new(file.to_str().unwrap()).unwrap();
    let src = wl_mem { device: WL_HOST, ptr: data.as_ptr() as u64, len: data.len() as u64 };
    let mut written = 0;
    let mut back = vec![0u8; data.len()];
    // SAFETY: valid pointers; `data` and `back` outlive the calls and the operation.
    unsafe {
        assert_eq!(wl_write(e.0, cfile.as_ptr(), 4096, src, 1, &mut written), wl_status::WL_OK, "{}", last_error());
        assert_eq!(written, data.len() as u64);
        let mut op = ptr::null_mut();
        assert_eq!(
            wl_read_async(e.0, cfile.as_ptr(), 4096, host(&mut back), ptr::null_mut(), &mut op),
            wl_status::WL_OK
        );
        let mut n = 0;
        assert_eq!(wl_op_wait(op, &mut n), wl_status::WL_OK, "{}", last_error());
        assert_eq!(n, data.len() as u64);
    }
    assert!(back == data, "async read differs from what was written");
    assert_eq!(&std::fs::read(&file).unwrap()[4096..], &data[..]);
}

#[test]
fn lba_reads_and_regions() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine();
    let data: Vec<u8> = (0..(4096 * 40 + 100) as u32).map(|i| (i ^ (i >> 7)) as u8).collect();
    let file = dir.path().join("disk.img");
    std::fs::write(&file, &data).unwrap();
    let cfile = CString::new(file.to_str().unwrap()).unwrap();
    // SAFETY: valid pointers and buffers of the lengths passed.
    unsafe {
        let mut dev = ptr::null_mut();
        assert_eq!(wl_block_open(e.0, cfile.as_ptr(), 4096, &mut dev), wl_status::WL_OK, "{}", last_error());
        let (mut bs, mut blocks) = (0, 0);
        assert_eq!(wl_block_info(dev, &mut bs, &mut blocks), wl_status::WL_OK);
        assert_eq!((bs, blocks), (4096, 40)); // the trailing 100 bytes are not a whole block
        let mut buf = vec![0u8; 3 * 4096];
        assert_eq!(wl_block_read(dev, 5, 3, host(&mut buf)), wl_status::WL_OK, "{}", last_error());
        assert_eq!(&buf[..], &data[5 * 4096..8 * 4096]);
        assert_eq!(wl_block_read(dev, 38, 3, host(&mut buf)), wl_status::WL_ERR_OUT_OF_RANGE);
        assert!(last_error().contains("LBA 38"), "{}", last_error());
        assert_eq!(wl_block_read(dev, 0, 4, host(&mut buf)), wl_status::WL_ERR_INVALID_ARGUMENT); // too small
        let mut op = ptr::null_mut();
        assert_eq!(wl_block_read_async(dev, 1, 2, host(&mut buf), ptr::null_mut(), &mut op), wl_status::WL_OK);
        assert_eq!(wl_op_wait(op, ptr::null_mut()), wl_status::WL_OK);
        assert_eq!(&buf[..2 * 4096], &data[4096..3 * 4096]);
        // 512-byte blocks by default for a file.
        let mut dev512 = ptr::null_mut();
        assert_eq!(wl_block_open(e.0, cfile.as_ptr(), 0, &mut dev512), wl_status::WL_OK);
        assert_eq!(wl_block_info(dev512, &mut bs, ptr::null_mut()), wl_status::WL_OK);
        assert_eq!(bs, 512);
        assert_eq!(wl_block_open(e.0, cfile.as_ptr(), 1000, &mut dev512), wl_status::WL_ERR_INVALID_ARGUMENT);

        let mut regions = ptr::null_mut();
        assert_eq!(wl_regions_new(dev, &mut regions), wl_status::WL_OK);
        wl_block_close(dev); // the table keeps the device open
        let weights = CString::new("weights").unwrap();
        let kv = CString::new("kv_cache").unwrap();
        assert_eq!(wl_regions_set(regions, weights.as_ptr(), 0, 30), wl_status::WL_OK);
        assert_eq!(wl_regions_set(regions, kv.as_ptr(), 30, 10), wl_status::WL_OK);
        assert_eq!(wl_regions_set(regions, kv.as_ptr(), 35, 10), wl_status::WL_ERR_OUT_OF_RANGE);
        assert_eq!(wl_regions_read(regions, kv.as_ptr(), 2, 3, host(&mut buf)), wl_status::WL_OK);
        assert_eq!(&buf[..], &data[32 * 4096..35 * 4096]);
        let (mut start, mut count) = (0, 0);
        assert_eq!(wl_regions_get(regions, kv.as_ptr(), &mut start, &mut count), wl_status::WL_OK);
        assert_eq!((start, count), (30, 10));
        assert_eq!(wl_regions_read(regions, kv.as_ptr(), 8, 3, host(&mut buf)), wl_status::WL_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("kv_cache"), "{}", last_error());
        let other = CString::new("optimizer").unwrap();
        assert_eq!(wl_regions_read(regions, other.as_ptr(), 0, 1, host(&mut buf)), wl_status::WL_ERR_NOT_FOUND);
        assert!(last_error().contains("weights"), "the message lists the known kinds: {}", last_error());
        wl_regions_free(regions);
        wl_block_close(dev512);
    }
}

#[test]
fn layer_streamer_rejects_bad_groupings() {
    let dir = tempfile::tempdir().unwrap();
    let path = generate(dir.path(), "m.safetensors", &[]);
    let e = engine();
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: valid pointers; `layer_of` holds one entry per tensor.
    unsafe {
        let mut ck = ptr::null_mut();
        assert_eq!(wl_checkpoint_open(cpath.as_ptr(), &mut ck), wl_status::WL_OK);
        let n = wl_checkpoint_len(ck);
        let mut layer_of = vec![0u32; n];
        layer_of[0] = 5;
        let mut l = ptr::null_mut();
        assert_eq!(
            wl_layers_open(e.0, ck, layer_of.as_ptr(), 2, WL_HOST, 2, &mut l),
            wl_status::WL_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("layer_of[0] = 5"), "{}", last_error());
        layer_of[0] = 0;
        assert_eq!(
            wl_layers_open(e.0, ck, layer_of.as_ptr(), 2, WL_HOST, 0, &mut l),
            wl_status::WL_ERR_INVALID_ARGUMENT
        );
        assert_eq!(wl_layers_open(e.0, ck, layer_of.as_ptr(), 2, WL_HOST, 1, &mut l), wl_status::WL_OK);
        let mut view = std::mem::zeroed::<wl_layer>();
        assert_eq!(wl_layers_load(l, 2, ptr::null_mut(), &mut view), wl_status::WL_ERR_INVALID_ARGUMENT);
        // Layer 1 is empty; layer 0 holds every tensor (one slot: every request reloads).
        assert_eq!(wl_layers_load(l, 1, ptr::null_mut(), &mut view), wl_status::WL_OK);
        assert_eq!(view.count, 0);
        assert_eq!(wl_layers_load(l, 0, ptr::null_mut(), &mut view), wl_status::WL_OK, "{}", last_error());
        assert_eq!(view.count, n);
        let file = std::fs::read(&path).unwrap();
        for k in 0..view.count {
            let mut info = std::mem::zeroed::<wl_tensor_info>();
            assert_eq!(wl_checkpoint_tensor(ck, *view.tensors.add(k), &mut info), wl_status::WL_OK);
            let got = std::slice::from_raw_parts((view.base + *view.offsets.add(k)) as *const u8, info.nbytes as usize);
            let at = info.offset as usize;
            assert!(got == &file[at..at + info.nbytes as usize], "tensor {k} differs");
        }
        wl_layers_close(l);
        wl_checkpoint_close(ck);
    }
}

#[test]
fn stream_ordered_async_read_on_the_gpu() {
    use cudarc::driver::sys;
    if let Err(why) = weightlift::cuda::available() {
        return eprintln!("skipping stream_ordered_async_read_on_the_gpu: {why}");
    }
    let dir = tempfile::tempdir().unwrap();
    let e = engine();
    // SAFETY: a live engine.
    assert_eq!(unsafe { wl_engine_prepare(e.0, 0) }, wl_status::WL_OK, "{}", last_error());
    let data: Vec<u8> = (0..(3u32 << 20) + 123).map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8).collect();
    let file = dir.path().join("s.bin");
    std::fs::write(&file, &data).unwrap();
    let cfile = CString::new(file.to_str().unwrap()).unwrap();
    let len = 4u64 << 20; // longer than what the file holds from the offset: pread semantics
    let offset = 4096u64;
    let want = &data[offset as usize..];
    let gpu = weightlift::cuda::Gpu::open(0).unwrap();
    let stream = gpu.stream(1).unwrap();
    let s = stream.cu_stream();
    // SAFETY: device memory from wl_cuda_alloc, a live stream of device 0, buffers of the lengths passed.
    unsafe {
        let (mut a, mut b) = (0u64, 0u64);
        assert_eq!(wl_cuda_alloc(e.0, 0, len, &mut a), wl_status::WL_OK, "{}", last_error());
        assert_eq!(wl_cuda_alloc(e.0, 0, len, &mut b), wl_status::WL_OK);
        gpu.bind().unwrap();
        // Earlier work: fill with 7s (the read must land after it). Later work: copy a → b (must see the file).
        sys::cuMemsetD8Async(a, 7, len as usize, s).result().unwrap();
        let mut op = ptr::null_mut();
        let dest = wl_mem { device: 0, ptr: a, len };
        assert_eq!(
            wl_read_async(e.0, cfile.as_ptr(), offset, dest, s as *mut _, &mut op),
            wl_status::WL_OK,
            "{}",
            last_error()
        );
        sys::cuMemcpyDtoDAsync_v2(b, a, len as usize, s).result().unwrap();
        sys::cuStreamSynchronize(s).result().unwrap();
        let mut n = 0;
        assert_eq!(wl_op_wait(op, &mut n), wl_status::WL_OK, "{}", last_error());
        assert_eq!(n, want.len() as u64);
        let mut got = vec![0u8; len as usize];
        assert_eq!(wl_cuda_copy_to_host(e.0, 0, b, got.as_mut_ptr().cast(), len), wl_status::WL_OK);
        assert!(&got[..want.len()] == want, "the later copy did not see the file's bytes");
        assert!(got[want.len()..].iter().all(|&x| x == 7), "bytes past the end of the file were overwritten");
        wl_cuda_free(a);
        wl_cuda_free(b);
    }
}

/// `wl_checkpoint_find` for every tensor of a 200,000-tensor checkpoint takes about as long as opening it (a
/// search through the list per call made this quadratic).
#[test]
fn finding_every_tensor_by_name_is_not_quadratic() {
    use weightlift::format::DType;
    use weightlift::format::safetensors::{self, TensorSpec};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wide.safetensors");
    let names: Vec<CString> = (0..200_000).map(|i| CString::new(format!("t{i}")).unwrap()).collect();
    let specs: Vec<(TensorSpec, &[u8])> =
        names.iter().map(|n| (TensorSpec::new(n.to_str().unwrap(), DType::U8, vec![1]), &[1u8][..])).collect();
    std::fs::write(&path, safetensors::serialize(&specs, &Default::default(), 8).unwrap()).unwrap();
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: valid pointers; the checkpoint is closed once.
    unsafe {
        let t0 = std::time::Instant::now();
        let mut ck = ptr::null_mut();
        assert_eq!(wl_checkpoint_open(cpath.as_ptr(), &mut ck), wl_status::WL_OK, "{}", last_error());
        let open_secs = t0.elapsed().as_secs_f64();
        let t0 = std::time::Instant::now();
        for n in &names {
            let mut i = usize::MAX;
            assert_eq!(wl_checkpoint_find(ck, n.as_ptr(), &mut i), wl_status::WL_OK);
            let mut info = std::mem::zeroed();
            assert_eq!(wl_checkpoint_tensor(ck, i, &mut info), wl_status::WL_OK);
            assert_eq!(CStr::from_ptr(info.name), n.as_c_str());
        }
        let find_secs = t0.elapsed().as_secs_f64();
        wl_checkpoint_close(ck);
        assert!(find_secs < 5.0 * open_secs + 2.0, "finding took {find_secs:.2} s, opening {open_secs:.2} s");
    }
}

/// `wl_load_tensors_checked`: every tensor of a checkpoint with its manifest loads and checks; a changed byte is
/// `WL_ERR_CHECKSUM` naming its tensor (the plain load of the same bytes succeeds); no manifest is
/// `WL_ERR_CHECKSUM` saying how to write one, before anything is read.
#[test]
fn checked_loads_compare_with_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let path = generate(dir.path(), "m.safetensors", &[]);
    let m = weightlift::pack::manifest::create(&path, 2, &|_, _| {}).unwrap();
    let mut manifest = path.clone().into_os_string();
    manifest.push(weightlift::pack::manifest::SUFFIX);
    m.write(Path::new(&manifest), &[path.as_path()]).unwrap();
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    let e = engine();
    let mut ck = ptr::null_mut();
    // SAFETY: (all calls below) valid pointers to live objects, and buffers of the lengths passed.
    unsafe {
        assert_eq!(wl_checkpoint_open(cpath.as_ptr(), &mut ck), wl_status::WL_OK, "{}", last_error());
        let n = index.tensors.len();
        let which: Vec<usize> = (0..n).collect();
        let load = |checked: bool| {
            let mut bufs: Vec<Vec<u8>> = index.tensors.iter().map(|t| vec![0xA5; t.nbytes as usize]).collect();
            let dests: Vec<wl_mem> = bufs.iter_mut().map(|b| host(b)).collect();
            let f = if checked { wl_load_tensors_checked } else { wl_load_tensors };
            (f(e.0, ck, which.as_ptr(), dests.as_ptr(), n), bufs)
        };
        let (status, bufs) = load(true);
        assert_eq!(status, wl_status::WL_OK, "{}", last_error());
        let file = std::fs::read(&path).unwrap();
        for (t, b) in index.tensors.iter().zip(&bufs) {
            assert!(b[..] == file[t.offset as usize..(t.offset + t.nbytes) as usize], "{}", t.name);
        }

        let victim = index.tensors.iter().max_by_key(|t| t.nbytes).unwrap();
        let mut changed = file.clone();
        changed[(victim.offset + victim.nbytes / 3) as usize] ^= 0x01;
        std::fs::write(&path, &changed).unwrap();
        let (status, _) = load(true);
        assert_eq!(status, wl_status::WL_ERR_CHECKSUM, "{}", last_error());
        assert!(last_error().contains(&victim.name), "{}", last_error());
        assert_eq!(load(false).0, wl_status::WL_OK, "{}", last_error());
        assert_eq!(
            CStr::from_ptr(wl_status_name(wl_status::WL_ERR_CHECKSUM as i32)).to_str().unwrap(),
            "WL_ERR_CHECKSUM"
        );

        std::fs::remove_file(&manifest).unwrap();
        let (status, _) = load(true);
        assert_eq!(status, wl_status::WL_ERR_CHECKSUM, "{}", last_error());
        assert!(last_error().contains("weightlift checksum"), "{}", last_error());
        wl_checkpoint_close(ck);
    }
}
