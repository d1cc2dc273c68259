# rekindle's tasks. `just --list` shows them.

set shell := ["bash", "-euo", "pipefail", "-c"]

default:
    @just --list

# Build the binaries (debug).
build:
    cargo build --workspace --bins

# Unit tests, then the end-to-end tests against a real control plane. What CI runs.
test: unit e2e

# Unit tests of every crate (no cluster needed).
unit:
    cargo test --workspace --exclude e2e

# fmt and clippy, as CI enforces them.
lint:
    cargo fmt --all --check
    cargo clippy --workspace --all-targets -- -D warnings

# End-to-end tests; brings the control plane up when needed.
e2e *ARGS: cluster-up
    cargo build --workspace --bins
    cargo test -p e2e -- --test-threads=4 {{ARGS}}

# Build (or reuse) the control-plane binaries from their Go modules.
e2e-binaries:
    e2e/scripts/build-binaries.sh all

# Start etcd, kube-apiserver, controller-manager, scheduler and kwok on 127.0.0.1 (state in target/e2e).
cluster-up:
    e2e/scripts/cluster.sh up

# Stop every control-plane process and remove its state.
cluster-down:
    e2e/scripts/cluster.sh down

# Say what runs.
cluster-status:
    e2e/scripts/cluster.sh status

# Criterion micro-benchmarks, then the load scenarios against the local control plane
# (report in bench/results/report.{json,md}; sizes via REKINDLE_BENCH_* variables, see e2e/src/bin/load.rs).
bench: cluster-up
    cargo bench --bench core
    cargo build --release --bin rekindle
    REKINDLE_BIN=target/release/rekindle cargo run --release -p e2e --bin load

# Run rekindle in the foreground against the local control plane (extra FLAGS are passed on).
serve-local *FLAGS: cluster-up
    e2e/scripts/serve-local.sh {{FLAGS}}

# Control plane, rekindle and a Deployment that reloads when its ConfigMap changes.
demo:
    e2e/scripts/demo.sh

# Stop the demo's rekindle (the control plane keeps running).
demo-stop:
    -kill $(cat target/e2e/pids/rekindle-demo.pid) && rm -f target/e2e/pids/rekindle-demo.pid
