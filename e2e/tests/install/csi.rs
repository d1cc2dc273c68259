//! rekindle with the real Secrets Store CSI driver (`e2e::csi`): the chart installed with
//! `rekindle.enableCSIIntegration=true`, workloads mounting SecretProviderClasses of the test provider,
//! and secrets rotated the way the driver really rotates them (the kubelet republishes the volume, the
//! driver asks the provider again and updates each pod's SecretProviderClassPodStatus). The scenarios
//! are those of Stakater Reloader's CSI end-to-end specs, plus what the driver's write pattern makes
//! risky: a rollout's new pods create new status objects, which must not reload anything.
//!
//! A workload's reloads are counted by its `metadata.generation`, which only a spec write moves, and
//! these workloads are written by nobody else.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use e2e::csi::{SecretsStoreCsi, DRIVER, PROVIDER};
use e2e::node::{client, wait_rolled_out, RELEASE_NS, WORKLOAD_IMAGE};
use e2e::{wait_for, TestNamespace, TIMEOUT};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use rekindle::core::envname::env_var_name;
use rekindle::core::hash::spcps_hash;
use rekindle::core::ResourceKind;
use serde_json::{json, Value};

use super::change_configmap;

/// A rotation reaches a pod at its next kubelet sync (every 10 s on the node) after the driver's poll
/// interval: a reload is waited for this long.
const ROTATION_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a negative check waits for a reload that must not come. rekindle acts on a watch event in
/// milliseconds; this covers a busy machine.
const SETTLE: Duration = Duration::from_secs(3);

/// One namespace's view: its SecretProviderClass and the secret directory the provider mounts for it.
struct Scene<'a> {
    client: &'a Client,
    csi: &'a SecretsStoreCsi,
    ns: TestNamespace,
    spc: String,
    /// The secret's first (id, version).
    first: (String, String),
}

impl<'a> Scene<'a> {
    /// A namespace with a SecretProviderClass `spc` of the test provider, whose secret `token` holds
    /// `v1`; `secret_objects` is the class's `secretObjects` (the driver's sync to a Secret).
    async fn new(
        client: &'a Client,
        csi: &'a SecretsStoreCsi,
        prefix: &str,
        secret_objects: Value,
    ) -> Result<Self> {
        let ns = TestNamespace::new(client, prefix).await?;
        let first = csi.write_secret(&ns.name, "token", "v1")?;
        let scene = Self {
            client,
            csi,
            ns,
            spc: "spc".to_string(),
            first,
        };
        let mut spec = json!({"provider": PROVIDER, "parameters": {"directory": scene.ns.name}});
        if !secret_objects.is_null() {
            spec["secretObjects"] = secret_objects;
        }
        scene
            .classes()
            .await?
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "secrets-store.csi.x-k8s.io/v1", "kind": "SecretProviderClass",
                    "metadata": {"name": scene.spc}, "spec": spec,
                }))?,
            )
            .await?;
        Ok(scene)
    }

    fn name(&self) -> &str {
        &self.ns.name
    }

    /// Writes the secret's new value at the provider; its (object id, version).
    fn rotate(&self, value: &str) -> Result<(String, String)> {
        self.csi.write_secret(&self.ns.name, "token", value)
    }

    /// The hash rekindle stamps for the class when its pods mount `(id, version)`.
    fn class_hash(&self, object: &(String, String)) -> String {
        spcps_hash(&self.spc, [(object.0.as_str(), object.1.as_str())])
    }

    async fn classes(&self) -> Result<Api<DynamicObject>> {
        e2e::dynamic_api(
            self.client,
            "secrets-store.csi.x-k8s.io/v1",
            "SecretProviderClass",
            Some(&self.ns.name),
        )
        .await
    }

    async fn statuses(&self) -> Result<Api<DynamicObject>> {
        e2e::dynamic_api(
            self.client,
            "secrets-store.csi.x-k8s.io/v1",
            "SecretProviderClassPodStatus",
            Some(&self.ns.name),
        )
        .await
    }

    fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), &self.ns.name)
    }

    async fn create_deployment(&self, name: &str, annotations: Value, pod: Value) -> Result<()> {
        let d = json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": pod},
            },
        });
        self.deployments()
            .create(&PostParams::default(), &serde_json::from_value(d)?)
            .await?;
        Ok(())
    }

    async fn generation(&self, name: &str) -> Result<i64> {
        Ok(self
            .deployments()
            .get(name)
            .await?
            .metadata
            .generation
            .unwrap_or_default())
    }

    /// The marker of `kind`/`resource` in the Deployment's first container.
    async fn marker(
        &self,
        name: &str,
        resource: &str,
        kind: ResourceKind,
    ) -> Result<Option<String>> {
        let d = self.deployments().get(name).await?;
        let env_name = env_var_name(resource, kind);
        Ok(d.spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.containers.into_iter().next())
            .and_then(|c| c.env)
            .and_then(|env| env.into_iter().find(|e| e.name == env_name))
            .and_then(|e| e.value))
    }

    /// Waits until the Deployment has rolled out: every replica updated and available, no old pod.
    async fn rolled_out(&self, name: &str) -> Result<()> {
        wait_for(
            &format!("{}/{name} rolled out", self.name()),
            TIMEOUT,
            || async {
                let d = self.deployments().get(name).await?;
                let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let s = d.status.unwrap_or_default();
                let done = s.observed_generation == d.metadata.generation
                    && s.replicas == Some(want)
                    && s.updated_replicas == Some(want)
                    && s.available_replicas == Some(want);
                Ok(done.then_some(()))
            },
        )
        .await
    }

    /// Waits until every running pod of `app` has a status object showing `object` mounted (after a
    /// rollout: the new pods' own statuses); their names.
    async fn statuses_show(&self, app: &str, object: &(String, String)) -> Result<Vec<String>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns.name);
        let statuses = self.statuses().await?;
        wait_for(
            &format!(
                "{}: every pod of {app} to have a status with {object:?}",
                self.name()
            ),
            ROTATION_TIMEOUT,
            || async {
                let running: Vec<String> = pods
                    .list(&ListParams::default().labels(&format!("app={app}")))
                    .await?
                    .items
                    .into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .map(|p| p.name_any())
                    .collect();
                let shown: BTreeMap<String, String> = statuses
                    .list(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .filter_map(|s| {
                        let pod = s.data.pointer("/status/podName")?.as_str()?.to_string();
                        let version = s
                            .data
                            .pointer("/status/objects")?
                            .as_array()?
                            .iter()
                            .find(|o| o["id"] == object.0.as_str())?["version"]
                            .as_str()?
                            .to_string();
                        Some((pod, version))
                    })
                    .collect();
                let all =
                    !running.is_empty() && running.iter().all(|p| shown.get(p) == Some(&object.1));
                Ok(all.then(|| {
                    running
                        .iter()
                        .map(|p| format!("{p}-{}-{}", self.ns.name, self.spc))
                        .collect()
                }))
            },
        )
        .await
    }

    /// Waits for the Deployment's reload to `generation` (failing at once on more); how long after
    /// `since` it was seen.
    async fn reloaded_to(&self, name: &str, generation: i64, since: Instant) -> Result<Duration> {
        wait_for(
            &format!("{}/{name} reloaded to generation {generation}", self.name()),
            ROTATION_TIMEOUT,
            || async {
                let g = self.generation(name).await?;
                ensure!(
                    g <= generation,
                    "{}/{name}: generation {g}, more reloads than changes",
                    self.name()
                );
                Ok((g == generation).then(|| since.elapsed()))
            },
        )
        .await
    }

    /// After SETTLE, the Deployment is still at `generation`: nothing reloaded it.
    async fn not_reloaded(&self, name: &str, generation: i64, after: &str) -> Result<()> {
        tokio::time::sleep(SETTLE).await;
        let g = self.generation(name).await?;
        ensure!(
            g == generation,
            "{}/{name} was reloaded after {after} (generation {g}, expected {generation})",
            self.name()
        );
        Ok(())
    }
}

/// A pod spec whose container (or, with `init`, an init container that exits at once) mounts the
/// class, with `env_from` as the main container's envFrom.
fn pod_spec(spc: &str, init: bool, env_from: Value) -> Value {
    let mount = json!([{"name": "secrets", "mountPath": "/mnt/secrets", "readOnly": true}]);
    let mut main = json!({"name": "app", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never", "envFrom": env_from});
    let mut spec = json!({
        "terminationGracePeriodSeconds": 1,
        "volumes": [{"name": "secrets", "csi": {"driver": DRIVER, "readOnly": true,
            "volumeAttributes": {"secretProviderClass": spc}}}],
    });
    if init {
        spec["initContainers"] = json!([{"name": "init", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
            "args": ["exit"], "volumeMounts": mount}]);
    } else {
        main["volumeMounts"] = mount;
    }
    spec["containers"] = json!([main]);
    spec
}

const RELOAD_CLASS: &str = "secretproviderclass.reloader.stakater.com/reload";
const AUTO_CLASS: &str = "secretproviderclass.reloader.stakater.com/auto";
const AUTO: &str = "reloader.stakater.com/auto";

/// Reloader's "reload when the secret changes" and "multiple updates", for three rotations in a row:
/// each reloads the Deployment named by `secretproviderclass.reloader.stakater.com/reload` once,
/// stamped with the hash of what the pods mount, and the rollout's new pods, each creating its own
/// status object, reload nothing. Before that, a label-only change of a status object reloads nothing.
async fn rotations_reload_once_each(
    client: &Client,
    csi: &SecretsStoreCsi,
) -> Result<Vec<Duration>> {
    let s = Scene::new(client, csi, "csi-rotate", Value::Null).await?;
    s.create_deployment(
        "app",
        json!({RELOAD_CLASS: s.spc}),
        pod_spec(&s.spc, false, json!([])),
    )
    .await?;
    s.rolled_out("app").await?;
    let mut object = s.first.clone();
    let names = s.statuses_show("app", &object).await?;
    let mut generation = s.generation("app").await?;

    // A label-only change of a status object.
    s.statuses()
        .await?
        .patch(
            &names[0],
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await?;
    s.not_reloaded("app", generation, "a label-only change of a status object")
        .await?;

    let mut latencies = Vec::new();
    for value in ["v2", "v3", "v4"] {
        let rotated = Instant::now();
        object = s.rotate(value)?;
        generation += 1;
        latencies.push(s.reloaded_to("app", generation, rotated).await?);
        let stamped = s
            .marker("app", &s.spc, ResourceKind::SecretProviderClass)
            .await?;
        ensure!(
            stamped.as_deref() == Some(s.class_hash(&object).as_str()),
            "{}: the reload for {value} stamped {stamped:?}, not the hash of the mounted {object:?}",
            s.name()
        );
        s.rolled_out("app").await?;
        s.statuses_show("app", &object).await?;
        s.not_reloaded(
            "app",
            generation,
            &format!("the rollout for {value} (its new pods' statuses)"),
        )
        .await?;
    }
    s.ns.cleanup().await?;
    Ok(latencies)
}

/// Reloader's typed auto annotation: `secretproviderclass.reloader.stakater.com/auto` reloads on the
/// class and not on the ConfigMap the workload also reads.
async fn typed_auto_reloads_on_the_class_only(
    client: &Client,
    csi: &SecretsStoreCsi,
) -> Result<()> {
    let s = Scene::new(client, csi, "csi-typed-auto", Value::Null).await?;
    config_map(&s, "settings").await?;
    s.create_deployment(
        "app",
        json!({AUTO_CLASS: "true"}),
        pod_spec(
            &s.spc,
            false,
            json!([{"configMapRef": {"name": "settings"}}]),
        ),
    )
    .await?;
    s.rolled_out("app").await?;
    s.statuses_show("app", &s.first).await?;
    let generation = s.generation("app").await?;
    change_configmap(client, s.name(), "settings", "2").await?;
    s.not_reloaded("app", generation, "a ConfigMap change")
        .await?;
    let rotated = Instant::now();
    s.rotate("v2")?;
    s.reloaded_to("app", generation + 1, rotated).await?;
    s.ns.cleanup().await
}

/// Reloader's combined auto annotation: `reloader.stakater.com/auto` reloads on the ConfigMap and on
/// the class, once each.
async fn auto_reloads_on_configmap_and_class(client: &Client, csi: &SecretsStoreCsi) -> Result<()> {
    let s = Scene::new(client, csi, "csi-auto", Value::Null).await?;
    config_map(&s, "settings").await?;
    s.create_deployment(
        "app",
        json!({AUTO: "true"}),
        pod_spec(
            &s.spc,
            false,
            json!([{"configMapRef": {"name": "settings"}}]),
        ),
    )
    .await?;
    s.rolled_out("app").await?;
    s.statuses_show("app", &s.first).await?;
    let generation = s.generation("app").await?;
    change_configmap(client, s.name(), "settings", "2").await?;
    s.reloaded_to("app", generation + 1, Instant::now()).await?;
    s.rolled_out("app").await?;
    s.statuses_show("app", &s.first).await?;
    s.not_reloaded("app", generation + 1, "the ConfigMap reload's new pods")
        .await?;
    let rotated = Instant::now();
    let object = s.rotate("v2")?;
    s.reloaded_to("app", generation + 2, rotated).await?;
    s.rolled_out("app").await?;
    s.statuses_show("app", &object).await?;
    s.not_reloaded("app", generation + 2, "the rotation's new pods")
        .await?;
    s.ns.cleanup().await
}

/// Reloader's init-container case: only an init container mounts the class.
async fn init_container_mounting_the_class(client: &Client, csi: &SecretsStoreCsi) -> Result<()> {
    let s = Scene::new(client, csi, "csi-init", Value::Null).await?;
    s.create_deployment(
        "app",
        json!({RELOAD_CLASS: s.spc}),
        pod_spec(&s.spc, true, json!([])),
    )
    .await?;
    s.rolled_out("app").await?;
    s.statuses_show("app", &s.first).await?;
    let generation = s.generation("app").await?;
    let rotated = Instant::now();
    s.rotate("v2")?;
    s.reloaded_to("app", generation + 1, rotated).await?;
    s.ns.cleanup().await
}

/// Reloader's Job case: a Job mounting the class is re-created (a new UID under the same name) when its
/// secret rotates, once.
async fn job_using_the_class_is_recreated(client: &Client, csi: &SecretsStoreCsi) -> Result<()> {
    let s = Scene::new(client, csi, "csi-job", Value::Null).await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), s.name());
    let mut pod = pod_spec(&s.spc, false, json!([]));
    pod["restartPolicy"] = json!("Never");
    let job = jobs
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "task", "annotations": {RELOAD_CLASS: s.spc}},
                "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "task"}}, "spec": pod}},
            }))?,
        )
        .await?;
    let first_uid = job.metadata.uid.clone().unwrap_or_default();
    s.statuses_show("task", &s.first).await?;
    s.rotate("v2")?;
    let second_uid = wait_for(
        &format!("{}: the Job re-created", s.name()),
        ROTATION_TIMEOUT,
        || async {
            let uid = jobs.get_opt("task").await?.and_then(|j| j.metadata.uid);
            Ok(uid.filter(|u| *u != first_uid))
        },
    )
    .await?;
    tokio::time::sleep(SETTLE).await;
    let now = jobs.get_opt("task").await?.and_then(|j| j.metadata.uid);
    ensure!(
        now.as_deref() == Some(second_uid.as_str()),
        "{}: the Job was re-created again ({now:?} after {second_uid})",
        s.name()
    );
    s.ns.cleanup().await
}

/// The class synced to a Secret (`secretObjects`), and a workload reading that Secret as well as
/// mounting the class, with `reloader.stakater.com/auto`: a rotation changes the class's statuses and
/// the Secret the driver writes from them, and reloads the workload once, not twice.
async fn synced_secret_and_class_reload_once(client: &Client, csi: &SecretsStoreCsi) -> Result<()> {
    let s = Scene::new(
        client,
        csi,
        "csi-sync",
        json!([{"secretName": "synced", "type": "Opaque", "data": [{"objectName": "token", "key": "token"}]}]),
    )
    .await?;
    s.create_deployment(
        "app",
        json!({AUTO: "true"}),
        pod_spec(&s.spc, false, json!([{"secretRef": {"name": "synced"}}])),
    )
    .await?;
    s.rolled_out("app").await?;
    s.statuses_show("app", &s.first).await?;
    let generation = s.generation("app").await?;
    let rotated = Instant::now();
    let object = s.rotate("v2")?;
    s.reloaded_to("app", generation + 1, rotated).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), s.name());
    wait_for(
        &format!("{}: the synced Secret to hold v2", s.name()),
        TIMEOUT,
        || async {
            let data = secrets.get("synced").await?.data.unwrap_or_default();
            Ok((data.get("token").map(|b| b.0.as_slice()) == Some(b"v2".as_slice())).then_some(()))
        },
    )
    .await?;
    s.rolled_out("app").await?;
    s.statuses_show("app", &object).await?;
    s.not_reloaded(
        "app",
        generation + 1,
        "the rotation (class and Secret changed together)",
    )
    .await?;
    let stamped = s.marker("app", "synced", ResourceKind::Secret).await?;
    ensure!(
        stamped.is_some(),
        "{}: the synced Secret is not stamped",
        s.name()
    );
    s.ns.cleanup().await
}

async fn config_map(s: &Scene<'_>, name: &str) -> Result<()> {
    Api::<ConfigMap>::namespaced(s.client.clone(), s.name())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": "1"}}))?,
        )
        .await?;
    Ok(())
}

/// The driver, rekindle installed by the chart with the CSI integration on, and every scenario, side by
/// side in namespaces of their own.
pub async fn secrets_store_csi_driver_body() -> Result<()> {
    let client = client().await?;
    let csi = SecretsStoreCsi::start().await?;
    let result = async {
        super::helm_install(&["certs.mode=certsGen", "rekindle.enableCSIIntegration=true"])?;
        wait_rolled_out(RELEASE_NS)?;
        let (rotations, typed, auto, init, job, synced) = tokio::join!(
            rotations_reload_once_each(&client, &csi),
            typed_auto_reloads_on_the_class_only(&client, &csi),
            auto_reloads_on_configmap_and_class(&client, &csi),
            init_container_mounting_the_class(&client, &csi),
            job_using_the_class_is_recreated(&client, &csi),
            synced_secret_and_class_reload_once(&client, &csi),
        );
        let mut failures = Vec::new();
        for (what, r) in [
            ("typed auto", typed),
            ("auto", auto),
            ("init container", init),
            ("job", job),
            ("secretObjects", synced),
        ] {
            if let Err(e) = r {
                failures.push(format!("{what}: {e:#}"));
            }
        }
        match rotations {
            Ok(latencies) => eprintln!("rotation to reload, three rotations: {latencies:?}"),
            Err(e) => failures.push(format!("rotations: {e:#}")),
        }
        ensure!(failures.is_empty(), "{}", failures.join("\n"));
        // The pods' volumes are unpublished by the driver: it stops only once this run's namespaces
        // (named with this process's id) are gone.
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ours = format!("-{}-", std::process::id() % 100_000);
        wait_for(
            "the test namespaces to be gone",
            Duration::from_secs(180),
            || async {
                let left = namespaces.list(&ListParams::default()).await?.items;
                let any = left
                    .iter()
                    .map(|n| n.name_any())
                    .any(|n| n.starts_with("csi-") && n.contains(&ours));
                Ok((!any).then_some(()))
            },
        )
        .await
    }
    .await;
    if result.is_err() {
        eprintln!("{}", csi.logs());
    }
    result.context("with the Secrets Store CSI driver")
}
