//! The C API on objects: checkpoints opened and loaded from s3:// (`s3s-fs`) and http:// (nginx) URLs served on
//! 127.0.0.1 by servers this test starts, every tensor loaded into host memory and every byte compared with
//! `std::fs::read` of the local file; byte ranges read from URLs; the local copy `remote_cache_dir` keeps; a missing
//! object and refused credentials as statuses with one-line messages naming the URL. One test: the S3 credentials
//! are process-wide (the environment every S3 client reads), and the refused case changes them.

#[path = "../../weightlift/tests/servers/mod.rs"]
mod servers;

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr;

use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift_capi::*;

fn last_error() -> String {
    // SAFETY: wl_last_error always returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(wl_last_error()) }.to_string_lossy().into_owned()
}

fn generate(dir: &Path, name: &str, layout: Layout, container: Container) -> PathBuf {
    let path = dir.join(name);
    synth::generate(&path, &Spec { layout, container, size: 6 << 20, seed: 13, align: None }).unwrap();
    path
}

struct Engine(*mut wl_engine);

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: opened by `engine()`, closed once.
        unsafe { wl_engine_close(self.0) };
    }
}

/// Small chunks and staging (many ranged GETs, several in flight per lane, slots reused), and `more` settings.
fn engine(more: &str) -> Engine {
    let settings = CString::new(format!("chunk_bytes=262144,staging_bytes=4194304{more}")).unwrap();
    let mut e = ptr::null_mut();
    // SAFETY: a NUL-terminated string and a valid out-pointer.
    assert_eq!(unsafe { wl_engine_open(settings.as_ptr(), &mut e) }, wl_status::WL_OK, "{}", last_error());
    Engine(e)
}

fn host(buf: &mut [u8]) -> wl_mem {
    wl_mem { device: WL_HOST, ptr: buf.as_mut_ptr() as u64, len: buf.len() as u64 }
}

/// Opens `url` with `wl_checkpoint_open`, loads every tensor into host memory with one `wl_load_tensors`, and
/// compares each tensor (name, offset, size) with the local file's index and each byte with the file's.
fn load_every_byte(e: &Engine, url: &str, local: &Path) {
    let want = weightlift::format::open(&[local.to_path_buf()], None).unwrap();
    let file = std::fs::read(local).unwrap();
    let curl = CString::new(url).unwrap();
    // SAFETY: (all calls below) valid pointers to live objects and buffers of the lengths passed; the checkpoint
    // is closed once, after the last use of the infos pointing into it.
    unsafe {
        let mut ck = ptr::null_mut();
        assert_eq!(wl_checkpoint_open(curl.as_ptr(), &mut ck), wl_status::WL_OK, "{url}: {}", last_error());
        let n = wl_checkpoint_len(ck);
        assert_eq!(n, want.tensors.len(), "{url}");
        let mut bufs = Vec::with_capacity(n);
        for (i, t) in want.tensors.iter().enumerate() {
            let mut info = std::mem::zeroed::<wl_tensor_info>();
            assert_eq!(wl_checkpoint_tensor(ck, i, &mut info), wl_status::WL_OK, "{}", last_error());
            assert_eq!(CStr::from_ptr(info.name).to_str().unwrap(), t.name);
            assert_eq!((info.offset, info.nbytes), (t.offset, t.nbytes), "{}", t.name);
            assert_eq!(CStr::from_ptr(info.file).to_str().unwrap(), url, "{}", t.name);
            bufs.push(vec![0xA5u8; t.nbytes as usize]);
        }
        let which: Vec<usize> = (0..n).collect();
        let dests: Vec<wl_mem> = bufs.iter_mut().map(|b| host(b)).collect();
        assert_eq!(wl_load_tensors(e.0, ck, which.as_ptr(), dests.as_ptr(), n), wl_status::WL_OK, "{}", last_error());
        for (t, got) in want.tensors.iter().zip(&bufs) {
            let range = t.offset as usize..(t.offset + t.nbytes) as usize;
            assert!(got[..] == file[range], "{url}: {}: bytes differ from the local file", t.name);
        }
        wl_checkpoint_close(ck);
    }
}

/// `wl_read` and `wl_read_async` of a URL: pread semantics (fewer bytes at the end of the object).
fn read_ranges(e: &Engine, url: &str, local: &Path) {
    let file = std::fs::read(local).unwrap();
    let curl = CString::new(url).unwrap();
    let mut buf = vec![0u8; 100_000];
    let mut n = 0;
    // SAFETY: valid pointers; `buf` outlives the calls and the operation, which is waited for.
    unsafe {
        assert_eq!(wl_read(e.0, curl.as_ptr(), 4097, host(&mut buf), &mut n), wl_status::WL_OK, "{}", last_error());
        assert_eq!(n, buf.len() as u64);
        assert!(buf[..] == file[4097..4097 + buf.len()], "{url}: wl_read differs from the file");
        let tail = file.len() as u64 - 1234;
        let mut op = ptr::null_mut();
        let status = wl_read_async(e.0, curl.as_ptr(), tail, host(&mut buf), ptr::null_mut(), &mut op);
        assert_eq!(status, wl_status::WL_OK, "{}", last_error());
        assert_eq!(wl_op_wait(op, &mut n), wl_status::WL_OK, "{}", last_error());
        assert_eq!(n, 1234);
        assert!(buf[..1234] == file[tail as usize..], "{url}: wl_read_async differs from the file");
    }
}

/// `wl_checkpoint_open` of `url` fails with `status` and a one-line message that starts with the URL and says
/// `what`.
fn refused(url: &str, status: wl_status, what: &str) {
    let curl = CString::new(url).unwrap();
    let mut ck = ptr::null_mut();
    // SAFETY: a NUL-terminated string and a valid out-pointer.
    let got = unsafe { wl_checkpoint_open(curl.as_ptr(), &mut ck) };
    let message = last_error();
    assert_eq!(got, status, "{url}: {message}");
    assert!(ck.is_null(), "{url}: a checkpoint was handed back");
    assert!(message.starts_with(&format!("{url}: {what}")), "{message}");
    assert!(!message.contains('\n'), "{message}");
}

#[test]
fn checkpoints_load_from_s3_and_http_urls_and_errors_name_the_url() {
    let s3 = servers::s3_in_env();
    let nginx = servers::nginx(true);
    let dir = tempfile::tempdir().unwrap();
    let e = engine("");
    let files = [
        ("llama.safetensors", Layout::Llama, Container::Safetensors),
        ("many.safetensors", Layout::ManySmall { tensors: Some(300) }, Container::Safetensors),
        ("llama.gguf", Layout::Llama, Container::Gguf),
    ];
    let locals: Vec<PathBuf> = files.iter().map(|&(name, l, c)| generate(dir.path(), name, l, c)).collect();

    if let Some(nginx) = &nginx {
        for ((name, ..), local) in files.iter().zip(&locals) {
            servers::put(&nginx.root, name, local);
            load_every_byte(&e, &format!("{}/{name}", nginx.base()), local);
        }
        read_ranges(&e, &format!("{}/{}", nginx.base(), files[0].0), &locals[0]);
        let missing = format!("{}/none.safetensors", nginx.base());
        refused(&missing, wl_status::WL_ERR_NOT_FOUND, "no such object (or no such bucket)");
    }

    let Some(s3) = s3 else { return };
    for ((name, ..), local) in files.iter().zip(&locals) {
        let url = format!("s3://bucket/capi/{name}");
        weightlift::remote::upload(local, &url).unwrap();
        load_every_byte(&e, &url, local);
    }
    read_ranges(&e, "s3://bucket/capi/llama.gguf", &locals[2]);
    // With remote_cache_dir, a load of every tensor writes the object's local copy, which the next load reads.
    let cache = dir.path().join("cache");
    let cached = engine(&format!(",remote_cache_dir={}", cache.display()));
    load_every_byte(&cached, "s3://bucket/capi/llama.safetensors", &locals[0]);
    let copy = std::fs::read(cache.join("s3/bucket/capi/llama.safetensors")).expect("a local copy was written");
    assert!(copy == std::fs::read(&locals[0]).unwrap(), "the local copy differs from the file");
    load_every_byte(&cached, "s3://bucket/capi/llama.safetensors", &locals[0]);
    refused("s3://bucket/capi/none.safetensors", wl_status::WL_ERR_NOT_FOUND, "no such object (or no such bucket)");
    refused("s3://no-such-bucket/m.safetensors", wl_status::WL_ERR_NOT_FOUND, "no such object (or no such bucket)");
    // A missing object under a tensor load: the checkpoint was opened, then the object went.
    let url = "s3://bucket/capi/gone.safetensors";
    weightlift::remote::upload(&locals[0], url).unwrap();
    let curl = CString::new(url).unwrap();
    // SAFETY: valid pointers; the checkpoint is closed once.
    unsafe {
        let mut ck = ptr::null_mut();
        assert_eq!(wl_checkpoint_open(curl.as_ptr(), &mut ck), wl_status::WL_OK, "{}", last_error());
        std::fs::remove_file(s3.root.join("bucket/capi/gone.safetensors")).unwrap();
        let mut info = std::mem::zeroed::<wl_tensor_info>();
        assert_eq!(wl_checkpoint_tensor(ck, 0, &mut info), wl_status::WL_OK, "{}", last_error());
        let mut buf = vec![0u8; info.nbytes as usize];
        let dest = host(&mut buf);
        let status = wl_load_tensors(e.0, ck, &0, &dest, 1);
        assert_eq!(status, wl_status::WL_ERR_NOT_FOUND, "{}", last_error());
        assert!(last_error().starts_with(&format!("{url}: no such object")), "{}", last_error());
        wl_checkpoint_close(ck);
    }

    // Refused credentials, last: a bucket no client of this process has read yet, whose client takes the wrong
    // key from the environment.
    std::fs::create_dir_all(s3.root.join("locked")).unwrap();
    servers::put(&s3.root.join("locked"), "m.safetensors", &locals[0]);
    // SAFETY: this is the only test of this binary, and no other thread of it reads the environment now.
    unsafe { std::env::set_var("AWS_SECRET_ACCESS_KEY", "not-the-secret") };
    refused("s3://locked/m.safetensors", wl_status::WL_ERR_ACCESS_DENIED, "access denied (HTTP 403)");
}
