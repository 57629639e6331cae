//! Protocol types from the NVM Express Base Specification 2.0 and the NVM Command Set Specification: queue
//! entries, status codes, controller registers and the Identify data structures. Pure data: each type encodes to
//! and decodes from its little-endian byte layout, and decoding checks every value it interprets.
#![forbid(unsafe_code)]

mod bytes;
mod command;
mod identify;
mod regs;
mod status;

pub use command::{
    AdminCommand, AdminOpcode, FEATURE_NUMBER_OF_QUEUES, IoCommand, IoOpcode, SQE_BYTES, SubmissionEntry, parse_admin,
    parse_io,
};
pub use identify::{IDENTIFY_BYTES, IdentifyController, IdentifyNamespace, LbaFormat, cns};
pub use regs::{Aqa, Cap, Cc, Csts, DOORBELL_BASE, Version, cq_head_doorbell, reg, sq_tail_doorbell};
pub use status::{CQE_BYTES, CompletionEntry, Status, StatusCodeType};

/// The memory page size weightlift uses for PRPs and queues (CC.MPS = 0): 4 KiB.
pub const PAGE_SIZE: usize = 4096;
