//! Micro-benchmarks of the core: the hash next to plain SHA-1 over the same bytes (the physical limit),
//! reference extraction and the decision.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rekindle::core::hash::{configmap_hash, sha1_hex};
use rekindle::core::plan::{plan, Change, Event, PlanConfig};
use rekindle::core::policy::ResourceFlags;
use rekindle::core::{refs, ResourceKind, WorkloadKind};
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
        };
        c.bench_function(&format!("plan/decide/{n}-containers"), |b| {
            b.iter(|| plan(&cfg, black_box(&obj), WorkloadKind::Deployment, &change, 0))
        });
    }
}

criterion_group!(benches, hash, extraction_and_decision);
criterion_main!(benches);
