//! Tape-to-schedule transformations run before lowering.

pub mod copies;
pub mod lanes;
pub mod layout;
pub mod loops;
pub mod nest;
