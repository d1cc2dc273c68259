//! Micro-benchmarks of the core: the hash next to plain SHA-1 over the same bytes (the physical limit),
//! reference extraction and the decision (from the object, and from the index's skeleton text).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rekindle::core::hash::{configmap_hash, sha1_hex};
use rekindle::core::plan::{plan, Change, Event, PlanConfig};
use rekindle::core::policy::ResourceFlags;
use rekindle::core::{refs, skeleton, ResourceKind, WorkloadKind};
use serde_json::{json, Value};

fn hash(c: &mut Criterion) {
    let mut g = c.benchmark_group("hash");
    let one_value = "x".repeat(1 << 20);
    let many: Vec<(String, String)> = (0..1000)
        .map(|i| (format!("key-{i:04}"), "y".repeat(1024)))
        .collect();
    let joined_many = {
        let mut v: Vec<String> = many.iter().map(|(k, v)| format!("{k}={v}")).collect();
        v.sort();
        v.join(";")
    };
    let joined_one = format!("k={one_value}");
    for (label, bytes) in [
        ("1MiB-one-value", joined_one.len()),
        ("1000x1KiB", joined_many.len()),
    ] {
        g.throughput(Throughput::Bytes(bytes as u64));
        if label == "1MiB-one-value" {
            g.bench_function(BenchmarkId::new("configmap", label), |b| {
                b.iter(|| configmap_hash([("k", one_value.as_str())], []))
            });
            g.bench_function(BenchmarkId::new("plain-sha1", label), |b| {
                b.iter(|| sha1_hex(black_box(joined_one.as_bytes())))
            });
        } else {
            g.bench_function(BenchmarkId::new("configmap", label), |b| {
                b.iter(|| configmap_hash(many.iter().map(|(k, v)| (k.as_str(), v.as_str())), []))
            });
            g.bench_function(BenchmarkId::new("plain-sha1", label), |b| {
                b.iter(|| sha1_hex(black_box(joined_many.as_bytes())))
            });
        }
    }
    for size in [1024usize, 100 * 1024] {
        let v = "z".repeat(size);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(
            BenchmarkId::new("configmap", format!("{}KiB", size / 1024)),
            |b| b.iter(|| configmap_hash([("k", v.as_str())], [])),
        );
    }
    g.finish();
}

fn deployment(containers: usize) -> Value {
    let cs: Vec<Value> = (0..containers)
        .map(|i| {
            json!({"name": format!("c{i}"), "image": "busybox",
                "envFrom": [{"configMapRef": {"name": format!("cm-{i}")}}],
                "env": (0..10).map(|j| json!({"name": format!("E{j}"), "value": "v"})).collect::<Vec<_>>(),
                "volumeMounts": [{"name": format!("v{i}"), "mountPath": "/x"}]})
        })
        .collect();
    let vols: Vec<Value> = (0..containers)
        .map(|i| json!({"name": format!("v{i}"), "secret": {"secretName": format!("s-{i}")}}))
        .collect();
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ns", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"template": {"spec": {"containers": cs, "volumes": vols}}}})
}

fn extraction_and_decision(c: &mut Criterion) {
    let cfg = PlanConfig::default();
    for n in [1usize, 20] {
        let obj = deployment(n);
        let spec = refs::pod_spec(&obj, WorkloadKind::Deployment)
            .unwrap()
            .clone();
        c.bench_function(&format!("refs/extract/{n}-containers"), |b| {
            b.iter(|| refs::references(black_box(&spec)))
        });
        let change = Change {
            kind: ResourceKind::ConfigMap,
            name: "cm-0",
            namespace: "ns",
            hash: "3c9a892aeaedc759abc3df9884a37b8be5680382",
            flags: ResourceFlags::default(),
            event: Event::Update,
            also_current: None,
        };
        c.bench_function(&format!("plan/decide/{n}-containers"), |b| {
            b.iter(|| plan(&cfg, black_box(&obj), WorkloadKind::Deployment, &change, 0))
        });
        // The index keeps each workload's skeleton as compact JSON text and parses it to plan: what
        // that parse adds to the decision above.
        let text = skeleton::skeleton(&cfg.policy.keys, &obj, WorkloadKind::Deployment).to_string();
        c.bench_function(&format!("plan/from-skeleton-text/{n}-containers"), |b| {
            b.iter(|| {
                let parsed: Value = serde_json::from_str(black_box(&text)).expect("skeleton");
                plan(&cfg, &parsed, WorkloadKind::Deployment, &change, 0)
            })
        });
    }
}

criterion_group!(benches, hash, extraction_and_decision);

/// A realistic Deployment of about `target` bytes of JSON (padding goes into labels and env).
fn deployment_json(target: usize) -> Value {
    let mut d = deployment(2);
    let mut i = 0;
    while serde_json::to_vec(&d).map(|v| v.len()).unwrap_or(0) < target {
        d["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array_mut()
            .expect("env")
            .push(json!({"name": format!("PADDING_{i}"), "value": "x".repeat(64)}));
        i += 1;
    }
    d
}

fn admission(c: &mut Criterion) {
    use rekindle::admission::Admission;
    use rekindle::config::scope::ScopeFilter;
    use rekindle::config::Scope;
    use rekindle::index::{Index, ResourceEntry, ResourceKey};
    use rekindle::metrics::Metrics;
    use std::sync::Arc;

    let mut registry = prometheus_client::registry::Registry::default();
    let index = Arc::new(Index::new());
    for name in ["cm-0", "cm-1"] {
        index.update_resource(
            &ResourceKey::new(ResourceKind::ConfigMap, "ns", name),
            ResourceEntry {
                hash: "3c9a892aeaedc759abc3df9884a37b8be5680382".into(),
                flags: ResourceFlags::default(),
            },
            None,
        );
    }
    let admission = Admission {
        plan: PlanConfig::default(),
        scope: Arc::new(ScopeFilter::new(&Scope::default())),
        index,
        metrics: Arc::new(Metrics::new(&mut registry, false)),
        self_username: None,
        notify_only: false,
        kinds: WorkloadKind::ALL.to_vec(),
        lookup: None,
    };
    for (label, size) in [("2KiB", 2 * 1024), ("50KiB", 50 * 1024)] {
        let obj = deployment_json(size);
        let body = serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "namespace": "ns", "name": "d", "operation": "CREATE", "userInfo": {"username": "alice"},
            "object": obj, "dryRun": true}}))
        .expect("json");
        c.bench_function(&format!("admission/create/{label}"), |b| {
            b.iter(|| admission.review(black_box(&body)).expect("review"))
        });
    }
}

criterion_group!(admission_benches, admission);
criterion_main!(benches, admission_benches);
