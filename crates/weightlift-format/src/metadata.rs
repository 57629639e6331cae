//! Metadata a checkpoint file carries besides its tensors: the safetensors string map and GGUF's typed key/values.
//! A module of its own, below the readers and the index, so that none of them depends on another for these types.

use std::collections::BTreeMap;

/// Metadata a file carries besides its tensors.
#[derive(Clone, Debug, PartialEq)]
pub enum Metadata {
    None,
    /// The safetensors `__metadata__` string map.
    Safetensors(BTreeMap<String, String>),
    /// GGUF key/value pairs, in file order.
    Gguf(Vec<(String, GgufValue)>),
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    /// GGUF strings should be UTF-8; invalid sequences are replaced with U+FFFD.
    String(String),
    /// An array with the type id of its elements (kept so an empty array round-trips).
    Array(u32, Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
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

    /// The value as JSON (arrays become JSON arrays).
    pub fn to_json(&self) -> serde_json::Value {
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
            GgufValue::Array(_, items) => J::Array(items.iter().map(GgufValue::to_json).collect()),
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
