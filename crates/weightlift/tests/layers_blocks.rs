//! The layer streamer and LBA reads: every layer handed back checked byte for byte against `std::fs::read` under
//! random request orders and slot counts; a file truncated under a streamer gives a typed error for the layers it
//! lost and keeps serving the others; dropping a streamer mid-read returns. Reads by LBA against a regular file
//! and, where `losetup` works (root, loop devices), against a real loop block device. GPU variants skip with the
//! reason where no CUDA device is usable.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use weightlift::format::TensorIndex;
use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::{BlockDevice, Device, Engine, Error, LayerStreamer, RawDest, RegionTable, Settings};

fn engine() -> Arc<Engine> {
    Arc::new(Engine::new(Settings::from_env().unwrap()).unwrap())
}

fn generate(dir: &Path, size: u64) -> (PathBuf, TensorIndex) {
    let path = dir.join("m.safetensors");
    let spec = Spec { layout: Layout::Llama, container: Container::Safetensors, size, seed: 5, align: None };
    synth::generate(&path, &spec).unwrap();
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    (path, index)
}

/// Tensors grouped by their `layers.N.` number; everything else is one more layer at the end.
fn group(index: &TensorIndex) -> Vec<Vec<usize>> {
    let mut layers: Vec<Vec<usize>> = Vec::new();
    let mut rest = Vec::new();
    for (i, t) in index.tensors.iter().enumerate() {
        let n = t.name.split("layers.").nth(1).and_then(|s| s.split('.').next()).and_then(|s| s.parse::<usize>().ok());
        match n {
            Some(n) => {
                if layers.len() <= n {
                    layers.resize(n + 1, Vec::new());
                }
                layers[n].push(i);
            }
            None => rest.push(i),
        }
    }
    layers.push(rest);
    layers
}

/// Bytes of the `k`-th tensor of a handed-back layer.
fn layer_tensor(view: &weightlift::LayerView<'_>, k: usize, len: usize, device: Device) -> Vec<u8> {
    let at = view.tensor_ptr(k).unwrap();
    match device {
        // SAFETY: the layer's tensor lies inside its slot, which stays valid until the next request.
        Device::Cpu => unsafe { std::slice::from_raw_parts(at as *const u8, len) }.to_vec(),
        Device::Cuda(n) => {
            let gpu = weightlift_cuda::Gpu::open(n).unwrap();
            let mut out = vec![0u8; len];
            // SAFETY: `at..at+len` is inside the slot, device memory of this GPU.
            unsafe { weightlift_cuda::copy_device_to_host(&gpu, at, &mut out) }.unwrap();
            out
        }
        Device::PinnedCpu => unreachable!("not a slot device"),
    }
}

fn check_layer(index: &TensorIndex, file: &[u8], view: &weightlift::LayerView<'_>, device: Device) {
    for (k, &t) in view.layout.tensors.iter().enumerate() {
        let e = &index.tensors[t];
        let want = &file[e.offset as usize..(e.offset + e.nbytes) as usize];
        assert!(
            layer_tensor(view, k, e.nbytes as usize, device) == want,
            "layer {} tensor {} differs",
            view.layer,
            e.name
        );
    }
}

/// A small deterministic generator for request orders.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

fn random_orders(device: Device) {
    let dir = tempfile::tempdir().unwrap();
    let (path, index) = generate(dir.path(), 40 << 20);
    let file = std::fs::read(&path).unwrap();
    let layers = group(&index);
    assert!(layers.len() >= 4, "the test needs several layers, got {}", layers.len());
    let e = engine();
    for slots in [1, 2, 3] {
        let mut s = LayerStreamer::new(e.clone(), &index, layers.clone(), device, slots).unwrap();
        // Two sequential passes (the decoder's order), then random requests, repeats included.
        let mut rng = Lcg(slots as u64);
        let order: Vec<usize> = (0..layers.len())
            .chain(0..layers.len())
            .chain((0..3 * layers.len()).map(|_| rng.next(layers.len())))
            .collect();
        for &l in &order {
            let view = s.load_layer(l).unwrap();
            assert_eq!(view.layer, l);
            check_layer(&index, &file, &view, device);
        }
        let st = s.stats();
        assert_eq!(st.requests, order.len() as u64);
        assert!(st.loads >= layers.len() as u64, "{st:?}");
        if slots == 2 {
            // Sequential passes with prefetch: every layer after the first was read ahead at least once.
            assert!(st.ready_hits > 0, "{st:?}");
        }
    }
}

#[test]
fn layers_in_any_order_are_byte_exact_on_the_host() {
    random_orders(Device::Cpu);
}

#[test]
fn layers_in_any_order_are_byte_exact_on_the_gpu() {
    match weightlift_cuda::available() {
        Ok(_) => random_orders(Device::Cuda(0)),
        Err(why) => eprintln!("skipping layers_in_any_order_are_byte_exact_on_the_gpu: {why}"),
    }
}

#[test]
fn a_truncated_file_fails_the_layers_it_lost_and_serves_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (path, index) = generate(dir.path(), 24 << 20);
    let file = std::fs::read(&path).unwrap();
    let layers = group(&index);
    let mut s = LayerStreamer::new(engine(), &index, layers.clone(), Device::Cpu, 2).unwrap();
    // Cut the file inside the last layer that has a tensor past the first layer's data.
    let first_end = layers[0].iter().map(|&t| index.tensors[t].offset + index.tensors[t].nbytes).max().unwrap();
    let lost =
        (0..layers.len()).rev().find(|&l| layers[l].iter().any(|&t| index.tensors[t].offset > first_end)).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(first_end).unwrap();
    match s.load_layer(lost) {
        Err(e @ Error::Io(_)) => assert!(e.to_string().contains("m.safetensors"), "{e}"),
        other => panic!("expected an I/O error naming the file, got {other:?}"),
    }
    let view = s.load_layer(0).unwrap();
    check_layer(&index, &file, &view, Device::Cpu);
}

#[test]
fn dropping_a_streamer_mid_read_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (_path, index) = generate(dir.path(), 64 << 20);
    for _ in 0..5 {
        let mut s = LayerStreamer::new(engine(), &index, group(&index), Device::Cpu, 3).unwrap();
        s.load_layer(0).unwrap(); // queues the next two layers
        drop(s);
    }
}

#[test]
fn groupings_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (_path, index) = generate(dir.path(), 8 << 20);
    let e = engine();
    let err = LayerStreamer::new(e.clone(), &index, vec![vec![0], vec![0]], Device::Cpu, 2).unwrap_err();
    assert!(err.to_string().contains("belongs to one layer"), "{err}");
    let err = LayerStreamer::new(e.clone(), &index, vec![vec![10_000]], Device::Cpu, 2).unwrap_err();
    assert!(err.to_string().contains("10000"), "{err}");
    let err = LayerStreamer::new(e, &index, vec![vec![0]], Device::Cpu, 0).unwrap_err();
    assert!(err.to_string().contains("at least one slot"), "{err}");
}

fn lba_checks(dev: &BlockDevice, data: &[u8]) {
    let bs = dev.block_size() as usize;
    let mut buf = vec![0u8; 3 * bs];
    // SAFETY: `buf` holds 3 blocks and is used by nothing else during the call.
    unsafe { dev.read(2, 3, RawDest::Host(buf.as_mut_ptr())) }.unwrap();
    assert!(buf == data[2 * bs..5 * bs], "LBA 2..5 differs");
    // SAFETY: as above.
    let err = unsafe { dev.read(dev.blocks() - 1, 2, RawDest::Host(buf.as_mut_ptr())) }.unwrap_err();
    assert!(matches!(err, Error::LbaOutOfRange { .. }), "{err}");
    let mut t = RegionTable::new(dev.clone());
    t.insert("weights", 1, 4).unwrap();
    t.insert("kv", 6, 2).unwrap();
    assert!(t.insert("past", dev.blocks() - 1, 2).is_err());
    // SAFETY: as above.
    unsafe { t.read_kind("weights", 1, 3, RawDest::Host(buf.as_mut_ptr())) }.unwrap();
    assert!(buf == data[2 * bs..5 * bs], "kind read differs");
    // SAFETY: as above.
    let err = unsafe { t.read_kind("kv", 1, 2, RawDest::Host(buf.as_mut_ptr())) }.unwrap_err();
    assert!(err.to_string().contains("\"kv\""), "{err}");
    // SAFETY: as above.
    let err = unsafe { t.read_kind("optimizer", 0, 1, RawDest::Host(buf.as_mut_ptr())) }.unwrap_err();
    assert!(matches!(err, Error::UnknownKind { .. }), "{err}");
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| (i.wrapping_mul(0x9E37_79B9) >> 11) as u8).collect()
}

#[test]
fn lba_reads_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(64 * 4096 + 123);
    let path = dir.path().join("disk.img");
    std::fs::write(&path, &data).unwrap();
    let dev = BlockDevice::open(engine(), &path, None).unwrap();
    assert_eq!((dev.block_size(), dev.blocks(), dev.is_block_device()), (512, (64 * 4096) / 512, false));
    lba_checks(&dev, &data);
    let dev = BlockDevice::open(engine(), &path, Some(4096)).unwrap();
    assert_eq!(dev.blocks(), 64);
    lba_checks(&dev, &data);
    assert!(BlockDevice::open(engine(), &path, Some(3000)).is_err());
}

/// A loop device over an image file, detached on drop.
struct Loop(String);
impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[test]
fn lba_reads_from_a_loop_block_device() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(4 << 20);
    let img = dir.path().join("loop.img");
    std::fs::write(&img, &data).unwrap();
    let out =
        std::process::Command::new("losetup").args(["--find", "--show", "--sector-size", "4096"]).arg(&img).output();
    let dev_path = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        Ok(o) => return eprintln!("skipping: losetup failed: {}", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => return eprintln!("skipping: no losetup: {e}"),
    };
    let _detach = Loop(dev_path.clone());
    let dev = BlockDevice::open(engine(), Path::new(&dev_path), None).unwrap();
    assert!(dev.is_block_device());
    assert_eq!(dev.block_size(), 4096, "the loop device's logical block size");
    assert_eq!(dev.blocks(), (4 << 20) / 4096);
    lba_checks(&dev, &data);
    // A block size below the device's is refused.
    assert!(BlockDevice::open(engine(), Path::new(&dev_path), Some(512)).is_err());
    // Checkpoint loads still refuse block devices.
    assert!(weightlift::format::open(&[PathBuf::from(&dev_path)], None).is_err());
}
