//! Calls rekindle makes to HTTP endpoints outside the cluster's API: `--webhook-url` notifications and
//! reload alerts.
pub mod alert;
pub mod http;
pub mod notify;
