//! Streaming loads into host memory: every tensor taken in file order, in random order, or only some of them, has
//! the file's bytes; the read-ahead stays within `prefetch_bytes`; what was read ahead and never taken is counted.

use weightlift::format::synth::{self, Container, Layout, Spec};
use weightlift::{Device, Engine, Settings};

fn checkpoint(
    dir: &std::path::Path,
    size: u64,
    layout: Layout,
) -> (std::path::PathBuf, weightlift::format::TensorIndex) {
    let path = dir.join("s.safetensors");
    synth::generate(&path, &Spec { layout, container: Container::Safetensors, size, seed: 5, align: None }).unwrap();
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    (path, index)
}

/// Fisher–Yates with a xorshift state (a fixed order per seed, no dependency for it).
fn shuffle(v: &mut [usize], x: &mut u64) {
    for k in (1..v.len()).rev() {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        v.swap(k, (*x % (k as u64 + 1)) as usize);
    }
}

fn expect(file: &[u8], index: &weightlift::format::TensorIndex, i: usize, got: &weightlift::TensorData) {
    let t = &index.tensors[i];
    let mut buf = vec![0u8; got.len()];
    got.read_back(0, &mut buf).unwrap();
    assert_eq!(buf.len() as u64, t.nbytes, "{}", t.name);
    assert!(buf[..] == file[t.offset as usize..(t.offset + t.nbytes) as usize], "{} differs", t.name);
}

#[test]
fn file_order_and_random_order_give_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let (path, index) = checkpoint(dir.path(), 24 << 20, Layout::Llama);
    let file = std::fs::read(&path).unwrap();
    let engine = Engine::new(Settings::default().prefetch_bytes(4 << 20)).unwrap();
    let all: Vec<usize> = (0..index.tensors.len()).collect();
    // File order.
    let mut order = all.clone();
    order.sort_by_key(|&i| index.tensors[i].offset);
    let s = engine.stream(&index, &all, Device::Cpu).unwrap();
    for &i in &order {
        expect(&file, &index, i, &s.take(i).unwrap());
    }
    let stats = s.close().unwrap();
    // Blocks of small neighbours carry the few bytes between them.
    let read = stats.streamed_bytes + stats.on_demand_bytes;
    assert!(read >= index.total_bytes() && read <= file.len() as u64, "{stats:?}");
    assert_eq!(stats.wasted_bytes, 0, "{stats:?}");
    // In file order the stream stays ahead of the takes: nothing is read apart.
    assert_eq!(stats.on_demand_reads, 0, "{stats:?}");
    // A random order (fixed seed).
    let mut shuffled = all.clone();
    shuffle(&mut shuffled, &mut 0x9E37_79B9_7F4A_7C15u64);
    let s = engine.stream(&index, &all, Device::Cpu).unwrap();
    for &i in &shuffled {
        expect(&file, &index, i, &s.take(i).unwrap());
    }
    assert!(s.take(shuffled[0]).is_err(), "a tensor can be taken once");
}

#[test]
fn read_ahead_stays_within_prefetch_and_untaken_bytes_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (path, index) = checkpoint(dir.path(), 32 << 20, Layout::Llama);
    let file = std::fs::read(&path).unwrap();
    let prefetch = 4u64 << 20;
    let engine = Engine::new(Settings::default().prefetch_bytes(prefetch)).unwrap();
    let all: Vec<usize> = (0..index.tensors.len()).collect();
    let largest = index.tensors.iter().map(|t| t.nbytes).max().unwrap();
    let s = engine.stream(&index, &all, Device::Cpu).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let ahead = s.stats().streamed_bytes;
    assert!(ahead > 0, "the stream read nothing ahead");
    // One admission may overshoot by the blocks of one read.
    assert!(ahead <= prefetch + 2 * largest, "read {ahead} bytes ahead with prefetch {prefetch}");
    let first = index.tensors.iter().enumerate().min_by_key(|(_, t)| t.offset).unwrap().0;
    expect(&file, &index, first, &s.take(first).unwrap());
    // Taking it made room: the stream reads on (waited for, so that closing does not race it).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.stats().streamed_bytes <= ahead.max(index.tensors[first].nbytes) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let stats = s.close().unwrap();
    assert!(stats.wasted_bytes > 0, "untaken tensors read ahead must be counted: {stats:?}");
}

/// Takes racing the lanes, many times over: the stream's gate runs under the engine's locks while takes wake the
/// engine, and a lock taken in the wrong order once hung a take here. A watchdog turns a hang into a failure.
#[test]
fn many_streams_with_racing_takes_never_hang() {
    let dir = tempfile::tempdir().unwrap();
    let (path, index) = checkpoint(dir.path(), 6 << 20, Layout::ManySmall { tensors: Some(400) });
    let file = std::fs::read(&path).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let engine = Engine::new(Settings::default().prefetch_bytes(1 << 20)).unwrap();
        let all: Vec<usize> = (0..index.tensors.len()).collect();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for round in 0..60 {
            let mut order = all.clone();
            if round % 2 == 0 {
                shuffle(&mut order, &mut x);
            }
            let s = engine.stream(&index, &all, Device::Cpu).unwrap();
            for &i in &order {
                expect(&file, &index, i, &s.take(i).unwrap());
            }
            s.close().unwrap();
        }
        tx.send(()).unwrap();
    });
    rx.recv_timeout(std::time::Duration::from_secs(240)).expect("a streaming load hung");
}
