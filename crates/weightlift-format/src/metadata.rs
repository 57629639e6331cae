//! Metadata a checkpoint file carries besides its tensors: the safetensors string map and GGUF's typed key/values.
//! A module of its own, below the readers and the index, so that none of them depends on another for these types.

use std::collections::BTreeMap;

/// Metadata a file carries besides its tensors.
#[derive(Clone, Debug, PartialEq)]
pub enum Metadata {
    /// Raw files carry none.
    None,
    /// The safetensors `__metadata__` string map.
    Safetensors(BTreeMap<String, String>),
    /// GGUF key/value pairs, in file order.
    Gguf(Vec<(String, GgufValue)>),
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// GGUF type 0: `uint8`.
    U8(u8),
    /// GGUF type 1: `int8`.
    I8(i8),
    /// GGUF type 2: `uint16`.
    U16(u16),
    /// GGUF type 3: `int16`.
    I16(i16),
    /// GGUF type 4: `uint32`.
    U32(u32),
    /// GGUF type 5: `int32`.
    I32(i32),
    /// GGUF type 6: `float32`.
    F32(f32),
    /// GGUF type 7: `bool`.
    Bool(bool),
    /// GGUF strings should be UTF-8; invalid sequences are replaced with U+FFFD.
    String(String),
    /// GGUF type 9: an array.
    Array(GgufArray),
    /// GGUF type 10: `uint64`.
    U64(u64),
    /// GGUF type 11: `int64`.
    I64(i64),
    /// GGUF type 12: `float64`.
    F64(f64),
}

/// A metadata array, stored as a vector of its element type: an array costs about what it takes in the file
/// (16 M `uint8` are 16 MiB, not 16 M enum values of 32 bytes each). The element type is kept, so an empty array
/// round-trips.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    /// An array of `uint8`.
    U8(Vec<u8>),
    /// An array of `int8`.
    I8(Vec<i8>),
    /// An array of `uint16`.
    U16(Vec<u16>),
    /// An array of `int16`.
    I16(Vec<i16>),
    /// An array of `uint32`.
    U32(Vec<u32>),
    /// An array of `int32`.
    I32(Vec<i32>),
    /// An array of `float32`.
    F32(Vec<f32>),
    /// An array of `bool`.
    Bool(Vec<bool>),
    /// An array of strings.
    String(Vec<String>),
    /// An array of arrays, each with its own element type.
    Array(Vec<GgufArray>),
    /// An array of `uint64`.
    U64(Vec<u64>),
    /// An array of `int64`.
    I64(Vec<i64>),
    /// An array of `float64`.
    F64(Vec<f64>),
}

/// Applies `$body` to the vector inside any array variant (bound as `$v`).
macro_rules! each_array {
    ($array:expr, $v:ident => $body:expr) => {
        match $array {
            GgufArray::U8($v) => $body,
            GgufArray::I8($v) => $body,
            GgufArray::U16($v) => $body,
            GgufArray::I16($v) => $body,
            GgufArray::U32($v) => $body,
            GgufArray::I32($v) => $body,
            GgufArray::F32($v) => $body,
            GgufArray::Bool($v) => $body,
            GgufArray::String($v) => $body,
            GgufArray::Array($v) => $body,
            GgufArray::U64($v) => $body,
            GgufArray::I64($v) => $body,
            GgufArray::F64($v) => $body,
        }
    };
}

impl GgufArray {
    /// An empty array of elements of type `type_id` (`None` for an unknown type), with room for `capacity`.
    pub fn with_capacity(type_id: u32, capacity: usize) -> Option<GgufArray> {
        Some(match type_id {
            0 => GgufArray::U8(Vec::with_capacity(capacity)),
            1 => GgufArray::I8(Vec::with_capacity(capacity)),
            2 => GgufArray::U16(Vec::with_capacity(capacity)),
            3 => GgufArray::I16(Vec::with_capacity(capacity)),
            4 => GgufArray::U32(Vec::with_capacity(capacity)),
            5 => GgufArray::I32(Vec::with_capacity(capacity)),
            6 => GgufArray::F32(Vec::with_capacity(capacity)),
            7 => GgufArray::Bool(Vec::with_capacity(capacity)),
            8 => GgufArray::String(Vec::with_capacity(capacity)),
            9 => GgufArray::Array(Vec::with_capacity(capacity)),
            10 => GgufArray::U64(Vec::with_capacity(capacity)),
            11 => GgufArray::I64(Vec::with_capacity(capacity)),
            12 => GgufArray::F64(Vec::with_capacity(capacity)),
            _ => return None,
        })
    }

    /// The type id of the elements.
    pub fn element_type(&self) -> u32 {
        match self {
            GgufArray::U8(_) => 0,
            GgufArray::I8(_) => 1,
            GgufArray::U16(_) => 2,
            GgufArray::I16(_) => 3,
            GgufArray::U32(_) => 4,
            GgufArray::I32(_) => 5,
            GgufArray::F32(_) => 6,
            GgufArray::Bool(_) => 7,
            GgufArray::String(_) => 8,
            GgufArray::Array(_) => 9,
            GgufArray::U64(_) => 10,
            GgufArray::I64(_) => 11,
            GgufArray::F64(_) => 12,
        }
    }

    /// Elements in the array (not counting those of nested arrays).
    pub fn len(&self) -> usize {
        each_array!(self, v => v.len())
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as JSON.
    fn item_json(&self, i: usize, max_items: Option<usize>) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            GgufArray::String(v) => J::from(v[i].as_str()),
            GgufArray::Array(v) => v[i].json(max_items),
            GgufArray::F32(v) => J::from(v[i]),
            GgufArray::F64(v) => J::from(v[i]),
            GgufArray::Bool(v) => J::from(v[i]),
            GgufArray::U8(v) => J::from(v[i]),
            GgufArray::I8(v) => J::from(v[i]),
            GgufArray::U16(v) => J::from(v[i]),
            GgufArray::I16(v) => J::from(v[i]),
            GgufArray::U32(v) => J::from(v[i]),
            GgufArray::I32(v) => J::from(v[i]),
            GgufArray::U64(v) => J::from(v[i]),
            GgufArray::I64(v) => J::from(v[i]),
        }
    }

    /// The array as JSON: every element, or (with `max_items`) an array that long or shorter in full and a longer
    /// one as `{"type", "len", "head"}` with its first `max_items` elements.
    fn json(&self, max_items: Option<usize>) -> serde_json::Value {
        let n = self.len();
        let shown = max_items.map_or(n, |m| m.min(n));
        let items: Vec<serde_json::Value> = (0..shown).map(|i| self.item_json(i, max_items)).collect();
        if shown == n {
            return serde_json::Value::Array(items);
        }
        serde_json::json!({"type": type_name(self.element_type()), "len": n, "head": items})
    }
}

impl GgufValue {
    /// The value's GGUF type id (`gguf_metadata_value_type`).
    pub fn type_id(&self) -> u32 {
        match self {
            GgufValue::U8(_) => 0,
            GgufValue::I8(_) => 1,
            GgufValue::U16(_) => 2,
            GgufValue::I16(_) => 3,
            GgufValue::U32(_) => 4,
            GgufValue::I32(_) => 5,
            GgufValue::F32(_) => 6,
            GgufValue::Bool(_) => 7,
            GgufValue::String(_) => 8,
            GgufValue::Array(..) => 9,
            GgufValue::U64(_) => 10,
            GgufValue::I64(_) => 11,
            GgufValue::F64(_) => 12,
        }
    }

    /// The value's GGUF type name (`uint32`, `string`, `array`).
    pub fn type_name(&self) -> &'static str {
        type_name(self.type_id())
    }

    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as JSON, arrays in full (a JSON value per element: for a long array, many times its size).
    pub fn to_json(&self) -> serde_json::Value {
        self.json(None)
    }

    /// The value as JSON with arrays longer than `max_items` summarized as `{"type", "len", "head"}` (the first
    /// `max_items` elements): what a report of a hostile or a large file shows by default.
    pub fn to_json_summary(&self, max_items: usize) -> serde_json::Value {
        self.json(Some(max_items))
    }

    fn json(&self, max_items: Option<usize>) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            GgufValue::U8(v) => J::from(*v),
            GgufValue::I8(v) => J::from(*v),
            GgufValue::U16(v) => J::from(*v),
            GgufValue::I16(v) => J::from(*v),
            GgufValue::U32(v) => J::from(*v),
            GgufValue::I32(v) => J::from(*v),
            GgufValue::F32(v) => J::from(*v),
            GgufValue::Bool(v) => J::from(*v),
            GgufValue::String(v) => J::from(v.as_str()),
            GgufValue::Array(a) => a.json(max_items),
            GgufValue::U64(v) => J::from(*v),
            GgufValue::I64(v) => J::from(*v),
            GgufValue::F64(v) => J::from(*v),
        }
    }
}

pub(crate) fn type_name(id: u32) -> &'static str {
    match id {
        0 => "uint8",
        1 => "int8",
        2 => "uint16",
        3 => "int16",
        4 => "uint32",
        5 => "int32",
        6 => "float32",
        7 => "bool",
        8 => "string",
        9 => "array",
        10 => "uint64",
        11 => "int64",
        12 => "float64",
        _ => "unknown",
    }
}
