//! Element types: every dtype the safetensors format defines, and every ggml tensor type that GGUF files carry.

use crate::error::ErrorKind;
use std::fmt;

/// The element type of a tensor.
///
/// Plain types are shared between formats (a GGUF `F16` tensor and a safetensors `F16` tensor have the same dtype).
/// Block-quantized ggml types have no element size of their own: their byte size is counted in blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// A boolean, one byte.
    Bool,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 64-bit integer.
    I64,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16: the top half of an `f32`.
    BF16,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
    /// Complex number made of two `F32` parts.
    C64,
    /// 8-bit float, 4 exponent and 3 mantissa bits (OCP FP8 E4M3FN).
    F8E4M3,
    /// 8-bit float, 5 exponent and 2 mantissa bits (OCP FP8 E5M2).
    F8E5M2,
    /// 8-bit scale: 8 exponent bits, no mantissa (MX block scales).
    F8E8M0,
    /// FP8 E4M3 with no negative zero or infinities (AMD's variant).
    F8E4M3Fnuz,
    /// FP8 E5M2 with no negative zero or infinities (AMD's variant).
    F8E5M2Fnuz,
    /// 6-bit float (OCP microscaling), packed.
    F6E2M3,
    /// 6-bit float (OCP microscaling), packed.
    F6E3M2,
    /// 4-bit float (OCP microscaling), packed two to a byte.
    F4,
    /// A block-quantized ggml type (never one of the plain types above).
    Ggml(GgmlType),
}

/// Why a byte size could not be computed for a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// The element count or the byte count does not fit in 64 bits.
    Overflow,
    /// A packed sub-byte type whose element count does not fill whole bytes.
    NotWholeBytes {
        /// Bits per element.
        bits: u64,
    },
    /// A block-quantized type whose innermost dimension is not a whole number of blocks.
    NotWholeBlocks {
        /// Elements per block.
        block: u64,
    },
}

const PLAIN: [(DType, &str, u64); 22] = [
    (DType::Bool, "BOOL", 8),
    (DType::U8, "U8", 8),
    (DType::I8, "I8", 8),
    (DType::U16, "U16", 16),
    (DType::I16, "I16", 16),
    (DType::U32, "U32", 32),
    (DType::I32, "I32", 32),
    (DType::U64, "U64", 64),
    (DType::I64, "I64", 64),
    (DType::F16, "F16", 16),
    (DType::BF16, "BF16", 16),
    (DType::F32, "F32", 32),
    (DType::F64, "F64", 64),
    (DType::C64, "C64", 64),
    (DType::F8E4M3, "F8_E4M3", 8),
    (DType::F8E5M2, "F8_E5M2", 8),
    (DType::F8E8M0, "F8_E8M0", 8),
    (DType::F8E4M3Fnuz, "F8_E4M3FNUZ", 8),
    (DType::F8E5M2Fnuz, "F8_E5M2FNUZ", 8),
    (DType::F6E2M3, "F6_E2M3", 6),
    (DType::F6E3M2, "F6_E3M2", 6),
    (DType::F4, "F4", 4),
];

impl DType {
    /// Every plain (non-ggml) dtype, in a stable order.
    pub fn plain() -> impl Iterator<Item = DType> {
        PLAIN.iter().map(|(d, _, _)| *d)
    }

    /// The name this dtype has in a safetensors header (`"BF16"`, `"F8_E4M3"`), or the ggml name of a quantized type.
    pub fn name(self) -> &'static str {
        match self {
            DType::Ggml(g) => g.name(),
            plain => PLAIN.iter().find(|(d, _, _)| *d == plain).map_or("?", |(_, n, _)| n),
        }
    }

    /// Parses a dtype as written in a safetensors header. Quantized ggml names are not safetensors dtypes.
    pub fn from_safetensors_name(name: &str) -> Option<DType> {
        PLAIN.iter().find(|(_, n, _)| *n == name).map(|(d, _, _)| *d)
    }

    /// Parses any dtype name weightlift prints: safetensors names and ggml type names (case-insensitive).
    pub fn parse(name: &str) -> Option<DType> {
        let upper = name.to_ascii_uppercase();
        DType::from_safetensors_name(&upper).or_else(|| GgmlType::from_name(&upper).map(GgmlType::dtype))
    }

    /// Bits per element of a plain dtype; `None` for block-quantized types.
    pub fn bits(self) -> Option<u64> {
        PLAIN.iter().find(|(d, _, _)| *d == self).map(|(_, _, b)| *b)
    }

    /// Bytes per element when that is a whole number (plain types of 8 bits or more).
    pub fn element_bytes(self) -> Option<u64> {
        self.bits().filter(|b| b % 8 == 0).map(|b| b / 8)
    }

    /// Byte size of a tensor of this dtype and shape (row-major, innermost dimension last).
    pub fn byte_size(self, shape: &[u64]) -> Result<u64, SizeError> {
        let elements = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).ok_or(SizeError::Overflow)?;
        match self {
            DType::Ggml(g) => {
                let block = g.block_size();
                let inner = shape.last().copied().unwrap_or(1);
                if inner % block != 0 {
                    return Err(SizeError::NotWholeBlocks { block });
                }
                (elements / block).checked_mul(g.type_size()).ok_or(SizeError::Overflow)
            }
            plain => {
                let bits = plain.bits().unwrap_or(8);
                let total = elements.checked_mul(bits).ok_or(SizeError::Overflow)?;
                if total % 8 != 0 {
                    return Err(SizeError::NotWholeBytes { bits });
                }
                Ok(total / 8)
            }
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $name:literal, $block:literal, $size:literal;)*) => {
        /// A ggml tensor type as stored in GGUF tensor infos (the `ggml_type` enum of ggml.h).
        ///
        /// Ids that ggml has retired (4, 5, 31–33, 36–38) are not listed: a file using them is rejected,
        /// since their block layout cannot be known for certain.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType { $(#[doc = concat!("ggml's `", $name, "` (type id ", stringify!($id), ").")] $variant),* }

        impl GgmlType {
            /// Every ggml type weightlift knows.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant),*];

            /// The numeric id stored in a GGUF file.
            pub fn id(self) -> u32 {
                match self { $(GgmlType::$variant => $id),* }
            }

            /// Looks a type up by its numeric id.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id { $($id => Some(GgmlType::$variant),)* _ => None }
            }

            /// The type's name as ggml prints it (`"Q4_K"`).
            pub fn name(self) -> &'static str {
                match self { $(GgmlType::$variant => $name),* }
            }

            /// Looks a type up by its name.
            pub fn from_name(name: &str) -> Option<GgmlType> {
                match name { $($name => Some(GgmlType::$variant),)* _ => None }
            }

            /// Elements per block (1 for plain types).
            pub fn block_size(self) -> u64 {
                match self { $(GgmlType::$variant => $block),* }
            }

            /// Bytes per block.
            pub fn type_size(self) -> u64 {
                match self { $(GgmlType::$variant => $size),* }
            }
        }
    };
}

// Block sizes and block bytes follow the block structs of ggml-common.h (QK_K = 256).
ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 36;
    Q2_K = 10, "Q2_K", 256, 84;
    Q3_K = 11, "Q3_K", 256, 110;
    Q4_K = 12, "Q4_K", 256, 144;
    Q5_K = 13, "Q5_K", 256, 176;
    Q6_K = 14, "Q6_K", 256, 210;
    Q8_K = 15, "Q8_K", 256, 292;
    IQ2_XXS = 16, "IQ2_XXS", 256, 66;
    IQ2_XS = 17, "IQ2_XS", 256, 74;
    IQ3_XXS = 18, "IQ3_XXS", 256, 98;
    IQ1_S = 19, "IQ1_S", 256, 50;
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    IQ3_S = 21, "IQ3_S", 256, 110;
    IQ2_S = 22, "IQ2_S", 256, 82;
    IQ4_XS = 23, "IQ4_XS", 256, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", 256, 56;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", 256, 54;
    TQ2_0 = 35, "TQ2_0", 256, 66;
    MXFP4 = 39, "MXFP4", 32, 17;
    NVFP4 = 40, "NVFP4", 64, 36;
    Q1_0 = 41, "Q1_0", 128, 18;
}

impl GgmlType {
    /// The dtype of a tensor of this ggml type: plain types map to the shared plain dtypes.
    pub fn dtype(self) -> DType {
        match self {
            GgmlType::F32 => DType::F32,
            GgmlType::F16 => DType::F16,
            GgmlType::BF16 => DType::BF16,
            GgmlType::F64 => DType::F64,
            GgmlType::I8 => DType::I8,
            GgmlType::I16 => DType::I16,
            GgmlType::I32 => DType::I32,
            GgmlType::I64 => DType::I64,
            quantized => DType::Ggml(quantized),
        }
    }

    /// The ggml type that stores a dtype, if GGUF can hold it.
    pub fn from_dtype(dtype: DType) -> Option<GgmlType> {
        match dtype {
            DType::F32 => Some(GgmlType::F32),
            DType::F16 => Some(GgmlType::F16),
            DType::BF16 => Some(GgmlType::BF16),
            DType::F64 => Some(GgmlType::F64),
            DType::I8 => Some(GgmlType::I8),
            DType::I16 => Some(GgmlType::I16),
            DType::I32 => Some(GgmlType::I32),
            DType::I64 => Some(GgmlType::I64),
            DType::Ggml(g) => Some(g),
            _ => None,
        }
    }

    /// Whether this type stores elements in blocks (quantized) rather than one by one.
    pub fn is_quantized(self) -> bool {
        matches!(self.dtype(), DType::Ggml(_))
    }
}

/// The byte size of tensor `name`, or the error naming it (shared by every reader and writer).
pub(crate) fn expected_size(name: &str, dtype: DType, shape: &[u64]) -> Result<u64, ErrorKind> {
    dtype.byte_size(shape).map_err(|e| match e {
        SizeError::Overflow => ErrorKind::ShapeOverflow { tensor: name.to_string(), shape: shape.to_vec() },
        SizeError::NotWholeBytes { bits } => {
            let elements: u64 = shape.iter().product();
            ErrorKind::NotWholeBytes { tensor: name.to_string(), elements_desc: format!("{elements} elements"), bits }
        }
        SizeError::NotWholeBlocks { block } => ErrorKind::NotWholeBlocks {
            tensor: name.to_string(),
            dtype: dtype.name(),
            inner: shape.last().copied().unwrap_or(1),
            block,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_round_trip() {
        for d in DType::plain() {
            assert_eq!(DType::from_safetensors_name(d.name()), Some(d));
            assert_eq!(DType::parse(&d.name().to_lowercase()), Some(d));
        }
        assert_eq!(DType::from_safetensors_name("Q4_0"), None);
    }

    #[test]
    fn ggml_ids_and_names_round_trip() {
        for &g in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(g.id()), Some(g));
            assert_eq!(GgmlType::from_name(g.name()), Some(g));
            assert_eq!(GgmlType::from_dtype(g.dtype()), Some(g));
        }
        for retired in [4, 5, 31, 32, 33, 36, 37, 38, 42, u32::MAX] {
            assert_eq!(GgmlType::from_id(retired), None);
        }
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(DType::BF16.byte_size(&[3, 5]), Ok(30));
        assert_eq!(DType::F32.byte_size(&[]), Ok(4));
        assert_eq!(DType::F32.byte_size(&[0, 7]), Ok(0));
        assert_eq!(DType::F4.byte_size(&[3]), Err(SizeError::NotWholeBytes { bits: 4 }));
        assert_eq!(DType::F4.byte_size(&[4]), Ok(2));
        assert_eq!(DType::F6E2M3.byte_size(&[4]), Ok(3));
        assert_eq!(DType::U8.byte_size(&[u64::MAX, 2]), Err(SizeError::Overflow));
        assert_eq!(DType::U64.byte_size(&[u64::MAX / 4]), Err(SizeError::Overflow));
        let q4k = DType::Ggml(GgmlType::Q4_K);
        assert_eq!(q4k.byte_size(&[2, 512]), Ok(4 * 144));
        assert_eq!(q4k.byte_size(&[2, 100]), Err(SizeError::NotWholeBlocks { block: 256 }));
    }
}
