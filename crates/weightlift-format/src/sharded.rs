//! Sharded safetensors checkpoints: `model.safetensors.index.json` maps every tensor name to the shard file that
//! holds it; the shards are read and joined into one index.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Component, Path};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;
use weightlift_remote::Location;

use crate::error::{ErrorKind, FormatError};
use crate::index::TensorIndex;
use crate::input::Input;
use crate::safetensors;

/// Index files larger than this are refused (real ones are well under a megabyte).
pub const MAX_INDEX_BYTES: u64 = 100_000_000;

/// Headers of an object's shards fetched at once: each is one GET (a round trip of 20-80 ms to a cloud bucket), so
/// a checkpoint of 163 shards read one after another would wait seconds before its first byte of weights.
pub(crate) const SHARDS_AT_ONCE: usize = 64;

/// Reads a shard index and every shard it names.
pub fn read(index_path: impl AsRef<Path>) -> Result<TensorIndex, FormatError> {
    let index_path = index_path.as_ref();
    let location = Location::new(index_path).map_err(|e| FormatError::new(index_path, ErrorKind::Remote(e)))?;
    read_at(&location)
}

/// [`read`] of a location: the shards are beside the index (in its folder, or under its URL's "folder"); an object's
/// shards are opened [`SHARDS_AT_ONCE`] at a time.
pub fn read_at(location: &Location) -> Result<TensorIndex, FormatError> {
    let index_path = location.as_path();
    let input = Input::open_at(location)?;
    let bad = |message: String| input.err(ErrorKind::ShardIndex { message });
    if input.len > MAX_INDEX_BYTES {
        return Err(bad(format!("{} bytes is over the {MAX_INDEX_BYTES}-byte limit", input.len)));
    }
    let bytes = input.read_vec(0, input.len, "shard index")?;
    let json: Value = serde_json::from_slice(&bytes).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let Some(Value::Object(weight_map)) = json.get("weight_map") else {
        return Err(bad("no \"weight_map\" object".into()));
    };
    let mut by_shard: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (tensor, shard) in weight_map {
        let Value::String(shard) = shard else {
            return Err(bad(format!("weight_map entry for {tensor:?} is not a file name")));
        };
        let escapes = Path::new(shard).components().any(|c| !matches!(c, Component::Normal(_)));
        if shard.is_empty() || escapes {
            return Err(bad(format!("shard {shard:?} is not a file name inside the index's directory")));
        }
        by_shard.entry(shard.clone()).or_default().insert(tensor.clone());
    }
    let shards: Vec<(&String, &BTreeSet<String>)> = by_shard.iter().collect();
    let locations = shards
        .iter()
        .map(|(shard, _)| location.sibling(shard).map_err(|e| FormatError::new(index_path, ErrorKind::Remote(e))))
        .collect::<Result<Vec<_>, _>>()?;
    let at_once = if location.object().is_some() { SHARDS_AT_ONCE } else { 1 };
    let read = read_all(&locations, at_once, safetensors::read_at);
    let mut parts = Vec::with_capacity(shards.len());
    for ((shard, tensors), part) in shards.into_iter().zip(read) {
        let part = part?;
        // One lookup per weight_map entry: through a set, since a list makes 100 k entries (a MoE model) hang.
        let held: HashSet<&str> = part.tensors.iter().map(|t| t.name.as_str()).collect();
        for name in tensors {
            if !held.contains(name.as_str()) {
                let kind = ErrorKind::ShardTensorMissing { tensor: name.clone(), shard: shard.clone() };
                return Err(FormatError::new(index_path, kind));
            }
        }
        parts.push(part);
    }
    TensorIndex::merge(parts)
}

/// `read` of each location, by `at_once` threads (results in the order given).
pub(crate) fn read_all(
    locations: &[Location],
    at_once: usize,
    read: impl Fn(&Location) -> Result<TensorIndex, FormatError> + Sync,
) -> Vec<Result<TensorIndex, FormatError>> {
    if at_once <= 1 || locations.len() <= 1 {
        return locations.iter().map(read).collect();
    }
    let next = AtomicUsize::new(0);
    let mut out: Vec<Option<Result<TensorIndex, FormatError>>> = (0..locations.len()).map(|_| None).collect();
    let results = Mutex::new(&mut out);
    std::thread::scope(|scope| {
        for _ in 0..at_once.min(locations.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(location) = locations.get(i) else { break };
                    let part = read(location);
                    results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(part);
                }
            });
        }
    });
    out.into_iter()
        .zip(locations)
        .map(|(r, l)| {
            r.unwrap_or_else(|| Err(FormatError::new(l.as_path(), ErrorKind::Open(std::io::Error::other("not read")))))
        })
        .collect()
}
