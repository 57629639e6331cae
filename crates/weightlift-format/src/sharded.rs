//! Sharded safetensors checkpoints: `model.safetensors.index.json` maps every tensor name to the shard file that
//! holds it; the shards are read and joined into one index.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Component, Path};

use serde_json::Value;

use crate::error::{ErrorKind, FormatError};
use crate::index::TensorIndex;
use crate::input::Input;
use crate::safetensors;

/// Index files larger than this are refused (real ones are well under a megabyte).
pub const MAX_INDEX_BYTES: u64 = 100_000_000;

/// Reads a shard index and every shard it names.
pub fn read(index_path: impl AsRef<Path>) -> Result<TensorIndex, FormatError> {
    let index_path = index_path.as_ref();
    let input = Input::open(index_path)?;
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
    let dir = index_path.parent().unwrap_or(Path::new("."));
    let mut parts = Vec::with_capacity(by_shard.len());
    for (shard, tensors) in &by_shard {
        let part = safetensors::read(dir.join(shard))?;
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
