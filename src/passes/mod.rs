//! Tape-to-schedule transformations run before lowering.

pub mod layout;
pub mod loops;
