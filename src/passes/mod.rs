//! Tape-to-schedule transformations run before lowering.

pub mod lanes;
pub mod layout;
pub mod loops;
pub mod nest;
