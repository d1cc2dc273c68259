# rekindle's tasks. `just --list` shows them.

set shell := ["bash", "-euo", "pipefail", "-c"]

default:
    @just --list

# Build the binaries (debug).
build:
    cargo build --workspace --bins

# Unit tests, the chart's tests, the end-to-end tests against a real control plane (the reload tests
# under exactly the chart's RBAC with the release binary, the others with the debug build), then the
# install tests: the image on the real node, installed with helm. What CI runs.
test: unit e2e-rest e2e-chart e2e-install

# The e2e test files `e2e-chart` runs (`just test` runs each file once: these there, the rest in `e2e-rest`).
chart_tests := "serve features kinds pod_restarts used_keys"

# The release build the image ships (the Dockerfile runs this same command; `just lint` checks it).
release:
    cargo build --release --locked -p rekindle -p certs-gen --bins
    ln -sf rekindle target/release/kubectl-rekindle

# Unit tests of every crate (no cluster needed).
unit:
    cargo test --workspace --exclude e2e

# fmt, clippy, hadolint and helm lint, as CI enforces them.
lint: lint-code
    e2e/scripts/helm.sh lint --strict charts/rekindle

# The linters that need no Go build: fmt, clippy, hadolint.
lint-code:
    cargo fmt --all --check
    cargo clippy --workspace --all-targets --all-features -- -D warnings
    scripts/check-dockerfile.sh

# Compile everything `just test` runs, without running it (CI does this while the Go builds run).
test-build: release
    cargo build --workspace --bins
    cargo test --workspace --exclude e2e --no-run
    cargo test -p e2e --no-run
    cargo test -p e2e --features real-node --test image --test install --test chaos --no-run

# Render webhook-config/ (plain manifests for `kubectl apply`) from the chart; a test checks they match.
webhook-config:
    e2e/scripts/render-webhook-config.sh webhook-config

# Every end-to-end test (and the chart's tests) with the debug build; brings the control plane up when needed.
e2e *ARGS: cluster-up companions
    scripts/install-python-tools.sh >/dev/null
    cargo build --workspace --bins
    cargo test -p e2e -- --test-threads=4 {{ARGS}} || { e2e/scripts/cluster.sh keep-logs; exit 101; }

# The end-to-end tests `e2e-chart` does not run, with the debug build.
e2e-rest: cluster-up companions
    scripts/install-python-tools.sh >/dev/null
    cargo build --workspace --bins
    cargo test -p e2e --lib --bins $(e2e/scripts/test-targets.py {{chart_tests}}) -- --test-threads=4 \
      || { e2e/scripts/cluster.sh keep-logs; exit 101; }

# Under the chart's ServiceAccount RBAC (installed into rekindle-system, every optional rule on), so each
# also proves the chart grants enough: the reload tests, with the release binary.
e2e-chart: cluster-up release
    cargo build --workspace --bins
    kc="$(cargo run -q -p e2e --bin chart_identity -- rekindle-system)"; \
      REKINDLE_BIN=target/release/rekindle REKINDLE_E2E_KUBECONFIG="$kc" REKINDLE_E2E_POD_NAMESPACE=rekindle-system \
      cargo test -p e2e $(printf -- '--test %s ' {{chart_tests}}) -- --test-threads=4 \
      || { e2e/scripts/cluster.sh keep-logs; exit 101; }

# Build (or reuse) the control-plane binaries from their Go modules.
e2e-binaries:
    e2e/scripts/build-binaries.sh all

# Start etcd, kube-apiserver, controller-manager, scheduler and kwok on 127.0.0.1 (state in target/e2e).
cluster-up:
    e2e/scripts/cluster.sh up

# Stop every control-plane and node process (by pid) and remove their state.
cluster-down:
    e2e/scripts/node.sh down
    e2e/scripts/cluster.sh down

# rekindle's image as an OCI archive, target/image/rekindle.tar, named as the chart's default image
# (assembled from the Dockerfile's runtime stage and the release binaries; see scripts/build-image.py).
image: release
    scripts/build-image.py

# The real node beside the kwok cluster: its own control plane, containerd, kubelet, kube-proxy and
# CoreDNS in the network namespace rekindle-node, with the pause image and rekindle's image imported.
# `e2e/scripts/node.sh exec -- CMD` runs CMD there (KUBECONFIG set): kubectl, helm, tests.
node-up: image
    e2e/scripts/node.sh up

# The components users pair rekindle with (Prometheus and promtool, cert-manager, the Argo Rollouts
# controller, the Secrets Store CSI driver), built from their Go modules and cached by version (the install tests run them; the node's
# namespace has no network to build them in).
companions:
    e2e/scripts/build-companions.sh all >/dev/null

# The install tests on the real node: the README's helm commands, through the chart's own webhook, and
# with real cert-manager, Prometheus, Argo Rollouts and the Secrets Store CSI driver.
e2e-install: node-up companions
    cargo build -p certs-gen
    cargo test -p e2e --features real-node --test image
    cargo test -p e2e --features real-node --test install --no-run
    e2e/scripts/node.sh exec -- cargo test --offline -p e2e --features real-node --test install -- --test-threads=1 \
      || { e2e/scripts/node.sh keep-logs; exit 101; }
    just chaos-run 3 target/chaos

# The chaos soak on the real node (MINUTES, default 30): rekindle installed by helm with two replicas,
# 52 workloads of every built-in kind, changes every 0.3-2 s, and at random intervals the leader pod
# deleted, replicas SIGKILLed, SIGSTOPped, cut off from the apiserver and evicted, the apiserver and etcd
# restarted. Fails on a lost or doubled reload or a write by a replica not leading (the apiserver's audit
# log); report and plot in REPORT (bench/results: chaos.md, chaos.json, chaos.png).
chaos MINUTES="30" REPORT="bench/results": node-up
    just chaos-run {{MINUTES}} {{REPORT}}

# The chaos soak on a node already up (what `chaos` and `e2e-install` run).
chaos-run MINUTES REPORT:
    cargo test -p e2e --features real-node --test chaos --no-run
    e2e/scripts/node.sh exec -- env REKINDLE_CHAOS_MINUTES={{MINUTES}} REKINDLE_CHAOS_REPORT={{REPORT}} \
      cargo test --offline -p e2e --features real-node --test chaos -- --nocapture \
      || { e2e/scripts/node.sh keep-logs; exit 101; }

# Say what runs.
cluster-status:
    e2e/scripts/cluster.sh status

# Criterion micro-benchmarks, then the load scenarios against the local control plane with the release
# build (report and PNG plots in bench/results/; sizes as flags or REKINDLE_BENCH_* variables, see
# `cargo run -p e2e --bin load -- --help`). `just bench --vs PATH` runs the comparable scenarios a second time against
# another rekindle-compatible binary (for example a previous commit's build) and reports both with ratios.
bench *ARGS: cluster-up release
    cargo bench --bench core
    REKINDLE_BIN=target/release/rekindle cargo run --release -p e2e --bin load -- {{ARGS}}

# The load scenarios only (no criterion), same arguments as `bench`.
bench-load *ARGS: cluster-up release
    REKINDLE_BIN=target/release/rekindle cargo run --release -p e2e --bin load -- {{ARGS}}

# Property tests at scale (CASES per property, default 1,000,000): arbitrary JSON and bytes into the
# AdmissionReview parser and handler (whose patches must apply and touch only markers), reference
# extraction, hashing, planning and annotation parsing. CI runs the same tests with the default counts.
fuzz CASES="1000000":
    PROPTEST_CASES={{CASES}} cargo test --release --lib admission::tests
    PROPTEST_CASES={{CASES}} cargo test --release --test no_panic

# A bounded soak (REKINDLE_SOAK_MINUTES, default 30) of mixed changes with the release build: RSS and open
# file descriptors sampled; results in bench/results/soak.{json,md}. Not part of `just test`.
soak: cluster-up release
    REKINDLE_BIN=target/release/rekindle cargo run --release -p e2e --bin soak

# Run rekindle in the foreground against the local control plane (extra FLAGS are passed on).
serve-local *FLAGS: cluster-up
    e2e/scripts/serve-local.sh {{FLAGS}}

# Control plane, rekindle and a Deployment that reloads when its ConfigMap changes.
demo:
    e2e/scripts/demo.sh

# The real node, rekindle's image, `helm install` as the README says, and a Deployment that reloads.
demo-install: node-up
    e2e/scripts/demo-install.sh

# Stop the demo's rekindle (the control plane keeps running).
demo-stop:
    -kill $(cat target/e2e/pids/rekindle-demo.pid) && rm -f target/e2e/pids/rekindle-demo.pid
