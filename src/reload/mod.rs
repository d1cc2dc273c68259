//! Reloading: the queue that coalesces changes per workload and the writer that patches workloads.

pub mod catch_up;
pub mod error;
pub mod lease;
pub mod pause;
pub mod queue;
pub mod recreate;
pub mod rollouts;
pub mod triggers;
pub mod warm;
pub mod writer;
