//! Tape-to-schedule transformations run before lowering.

pub mod loops;
