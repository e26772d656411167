//! Tape-to-schedule transformations run before lowering.

pub mod copies;
pub mod lane_order;
pub mod layout;
pub mod loops;
pub mod nest;
pub mod schedule;
