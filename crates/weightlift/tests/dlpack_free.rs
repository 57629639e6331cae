//! Releasing an exported tensor frees its memory exactly once, and not before, whichever way the consumer releases
//! it: dropping the `Managed`, or calling the C deleter itself. A counting allocator watches the frees of each
//! tensor's buffer and of its DLPack header; a tensor in a mapped buffer (1 MiB or more) goes back to the engine's
//! host cache instead, counted there. One test in a binary of its own, since the allocator sees every thread's frees.
#![cfg(feature = "dlpack")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use weightlift::dlpark::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use weightlift::format::safetensors::{TensorSpec, serialize};
use weightlift::format::{DType, synth};
use weightlift::{Device, Engine, LoadOpts, Settings, TensorData};

const SLOTS: usize = 32;
/// Addresses watched (0: a free slot), and how many times each was freed since.
static WATCHED: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static FREES: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];

struct Counting;

fn freed(ptr: *mut u8) {
    for (w, f) in WATCHED.iter().zip(&FREES) {
        if w.load(Ordering::SeqCst) == ptr as usize {
            f.fetch_add(1, Ordering::SeqCst);
        }
    }
}

// SAFETY: every call is passed to the system allocator unchanged; counting touches only atomics (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        freed(ptr);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() && moved != ptr {
            freed(ptr);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Starts counting the frees of `addr`; its slot.
fn watch(addr: usize) -> usize {
    let slot = WATCHED.iter().position(|w| w.load(Ordering::SeqCst) == 0).expect("a free slot");
    FREES[slot].store(0, Ordering::SeqCst);
    WATCHED[slot].store(addr, Ordering::SeqCst);
    slot
}

fn frees(slot: usize) -> usize {
    FREES[slot].load(Ordering::SeqCst)
}

#[test]
fn releasing_an_export_frees_its_memory_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("free.safetensors");
    let mut tensors = Vec::new();
    for i in 0..6u64 {
        let shape = vec![5 + i, 1000];
        let mut data = vec![0u8; DType::F32.byte_size(&shape).unwrap() as usize];
        synth::tensor_bytes(5, i, 0, &mut data);
        tensors.push((TensorSpec::new(format!("small{i}"), DType::F32, shape), data));
    }
    let large = vec![3u64 << 20];
    let mut data = vec![0u8; large[0] as usize];
    synth::tensor_bytes(5, 6, 0, &mut data);
    tensors.push((TensorSpec::new("large", DType::U8, large), data));
    let refs: Vec<(TensorSpec, &[u8])> = tensors.iter().map(|(s, d)| (s.clone(), d.as_slice())).collect();
    std::fs::write(&path, serialize(&refs, &BTreeMap::new(), 8).unwrap()).unwrap();
    let index = weightlift::format::open(std::slice::from_ref(&path), None).unwrap();
    let engine = Engine::new(Settings::default()).unwrap();
    let mut loaded = engine.load(&index, Device::Cpu, &LoadOpts::default()).unwrap().tensors;
    let large = loaded.pop().unwrap();

    let data_addr = |t: &weightlift::Tensor| match &t.data {
        TensorData::Host(b) => b.as_ptr() as usize,
        _ => panic!("{}: not in host memory", t.name),
    };
    for (i, tensor) in loaded.into_iter().enumerate() {
        let what = tensor.name.clone();
        let data = watch(data_addr(&tensor));
        let legacy = i % 2 == 0;
        let header;
        if legacy {
            let managed = weightlift::dlpack::export::<DLManagedTensor>(tensor).unwrap();
            header = watch(managed.as_ptr() as usize);
            assert_eq!((frees(data), frees(header)), (0, 0), "{what}: freed while exported");
            let raw = managed.into_raw();
            // As a C consumer releases it.
            // SAFETY: the deleter of the managed tensor just handed over, called once with its own pointer.
            unsafe { ((*raw).deleter.expect("a deleter"))(raw) };
        } else {
            let managed = weightlift::dlpack::export::<DLManagedTensorVersioned>(tensor).unwrap();
            header = watch(managed.as_ptr() as usize);
            assert_eq!((frees(data), frees(header)), (0, 0), "{what}: freed while exported");
            drop(managed);
        }
        assert_eq!(frees(data), 1, "{what}: the tensor's buffer");
        assert_eq!(frees(header), 1, "{what}: the DLPack header");
        WATCHED[data].store(0, Ordering::SeqCst);
        WATCHED[header].store(0, Ordering::SeqCst);
    }

    // A mapped buffer: its mapping returns to the engine's host cache when released, once.
    let cache = engine.host_cache();
    // Its mapping: the buffer in 2 MiB steps, and one huge page of slack that aligns its start.
    let mapped = large.data.len().next_multiple_of(2 << 20) + (2 << 20);
    let before = cache.cached_bytes();
    let managed = weightlift::dlpack::export::<DLManagedTensor>(large).unwrap();
    assert_eq!(cache.cached_bytes(), before, "the mapping went back while exported");
    drop(managed);
    assert_eq!(cache.cached_bytes(), before + mapped, "the mapping went back once");
}
