//! The pure core shared by the admission webhook, the watch loop and the offline tools.
//!
//! Everything here is a function of its inputs: no client, no async, no clock (callers pass `now`).
//! Workloads are handled as JSON so that every kind (including CRDs such as Argo Rollouts) goes through
//! the same code and no field of a newer API version is ever dropped.

pub mod duration;
pub mod envname;
pub mod hash;
pub mod job;
pub mod keys;
pub mod kinds;
pub mod patch;
pub mod pause;
pub mod plan;
pub mod pod_groups;
pub mod policy;
pub mod refs;
pub mod release;
pub mod restart;
pub mod rollout;
pub mod skeleton;
pub mod window;

pub use kinds::{ResourceKind, WorkloadKind};

#[cfg(test)]
pub(crate) mod behaviour_doc;
