//! rekindle: a mutating admission webhook and a watch loop over one pure core.
//!
//! - `core`: pure rules (references, hashes, policy, env-var names, patches); no I/O.
//! - `index`: what the cluster's workloads reference and the current hash of each resource.
//! - `admission`: the webhook: records each workload in the index and stamps the current hashes.
//! - `watch`: keeps the index current and hands triggered workloads to a sink.
//! - `reload`: the sink that reloads (queue, writer, pause, leader election).
//! - `outbound`: the HTTP calls rekindle makes (`--webhook-url` notify, alerts).
//! - `server`: TLS, the admin endpoints; `metrics`: Prometheus; `config`: flags and scope.
//! - `tools`: the offline commands (`hash`, `explain`, `migrate-values`, `healthcheck`).
//! - `app`: wiring.
pub mod admission;
pub mod app;
pub mod config;
pub mod core;
pub mod index;
pub mod metrics;
#[cfg(test)]
mod mock_api;
pub mod outbound;
pub mod reload;
pub mod retry;
pub mod server;
pub mod tools;
pub mod watch;
