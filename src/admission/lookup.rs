//! Reading a resource the index does not know yet, for the admission of a workload that uses it.
//!
//! `kubectl apply -f` of one file holding a ConfigMap and the Deployment that uses it creates them
//! milliseconds apart; the ConfigMap's watch event may not have arrived when the Deployment is
//! admitted. Once the watches have synced, such a miss is read from the API (each read bounded by
//! [`DEADLINE`], all of them together too) with the watch's own filters and hash, and the workload is
//! stamped as if the watch had been first. A resource that does not exist or that the filters exclude
//! is remembered for [`ABSENT_TTL`], so workloads naming an optional ConfigMap do not pay a read each.
//! The index is not updated: the watch stays its only writer, so no change is ever seen twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client, ResourceExt};

use crate::config::selector::Selector;
use crate::core::hash::StoredHash;
use crate::core::keys::KeyDigests;
use crate::core::policy::{AnnotationKeys, ResourceFlags};
use crate::core::ResourceKind;
use crate::index::{ResourceEntry, ResourceKey};
use crate::metrics::{Metrics, ResultLabels};
use crate::server::admin::Health;

/// The longest an admission waits for its reads (the apiserver's webhook timeout is 2 s by default).
pub const DEADLINE: Duration = Duration::from_millis(300);
/// How long a resource found absent (or filtered out) is not read again.
pub const ABSENT_TTL: Duration = Duration::from_secs(30);

pub struct Lookup {
    pub client: Client,
    /// Ready once every watch has synced: before that a miss is just the first list not done yet.
    pub health: Arc<Health>,
    pub keys: AnnotationKeys,
    /// `--resource-label-selector`, as the watches apply it.
    pub selector: Option<Selector>,
    /// The kinds that are watched (`--resources-to-ignore` drops one).
    pub kinds: Vec<ResourceKind>,
    pub metrics: Arc<Metrics>,
    absent: Mutex<HashMap<ResourceKey, Instant>>,
}

/// A resource read for an admission: the watch's entry and its value digests.
#[derive(Debug, Clone)]
pub struct Looked {
    pub entry: ResourceEntry,
    pub digests: Option<KeyDigests>,
}

enum Found {
    Entry(Looked),
    Absent,
    Filtered,
}

impl Lookup {
    pub fn new(
        client: Client,
        health: Arc<Health>,
        keys: AnnotationKeys,
        selector: Option<Selector>,
        kinds: Vec<ResourceKind>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            client,
            health,
            keys,
            selector,
            kinds,
            metrics,
            absent: Mutex::default(),
        }
    }

    /// Whether a miss of this resource is worth a read now.
    pub fn wanted(&self, key: &ResourceKey) -> bool {
        if !self.health.is_ready() || !self.kinds.contains(&key.kind) {
            return false;
        }
        let mut absent = self.absent.lock().unwrap_or_else(|e| e.into_inner());
        match absent.get(key) {
            Some(at) if at.elapsed() < ABSENT_TTL => false,
            Some(_) => {
                absent.remove(key);
                true
            }
            None => true,
        }
    }

    fn count(&self, result: &str) {
        self.metrics
            .admission_lookups
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Reads the resources, concurrently, each bounded by [`DEADLINE`] (so all of them are too);
    /// what is found, with the watch's hash and flags. A slow read loses only its own resource.
    pub async fn fetch(&self, keys: Vec<ResourceKey>) -> HashMap<ResourceKey, Looked> {
        let reads = keys.into_iter().map(|key| async move {
            let found = tokio::time::timeout(DEADLINE, self.read(&key)).await;
            (key, found)
        });
        let results = futures::future::join_all(reads).await;
        let mut out = HashMap::new();
        for (key, found) in results {
            match found {
                Ok(Ok(Found::Entry(entry))) => {
                    self.count("found");
                    out.insert(key, entry);
                }
                Ok(Ok(Found::Absent)) => {
                    self.count("absent");
                    self.remember_absent(key);
                }
                Ok(Ok(Found::Filtered)) => {
                    self.count("filtered");
                    self.remember_absent(key);
                }
                Ok(Err(e)) => {
                    self.count("error");
                    tracing::debug!(resource = %key.name, error = %e, "admission lookup failed");
                }
                Err(_) => self.count("timeout"),
            }
        }
        out
    }

    fn remember_absent(&self, key: ResourceKey) {
        let mut absent = self.absent.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: expired records go first, and the map never outgrows the cluster's misses.
        if absent.len() > 10_000 {
            absent.retain(|_, at| at.elapsed() < ABSENT_TTL);
        }
        absent.insert(key, Instant::now());
    }

    fn selected(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.selector.as_ref().is_none_or(|s| s.matches(labels))
    }

    async fn read(&self, key: &ResourceKey) -> Result<Found, kube::Error> {
        let entry = |digests: KeyDigests,
                     annotations: &std::collections::BTreeMap<String, String>| {
            Found::Entry(Looked {
                entry: ResourceEntry {
                    hash: StoredHash::new(&digests.of),
                    flags: ResourceFlags::from_annotations(&self.keys, annotations),
                },
                digests: Some(digests),
            })
        };
        match key.kind {
            ResourceKind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &key.namespace);
                Ok(match api.get_opt(&key.name).await? {
                    None => Found::Absent,
                    Some(cm) if !self.selected(cm.labels()) => Found::Filtered,
                    Some(cm) => entry(KeyDigests::of_configmap(&cm), cm.annotations()),
                })
            }
            ResourceKind::Secret => {
                let api: Api<Secret> = Api::namespaced(self.client.clone(), &key.namespace);
                Ok(match api.get_opt(&key.name).await? {
                    None => Found::Absent,
                    // The watch leaves Helm's release Secrets out.
                    Some(s) if s.type_.as_deref() == Some("helm.sh/release.v1") => Found::Filtered,
                    Some(s) if !self.selected(s.labels()) => Found::Filtered,
                    Some(s) => entry(KeyDigests::of_secret(&s), s.annotations()),
                })
            }
            ResourceKind::SecretProviderClass => Ok(Found::Filtered),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;

    /// A client whose "apiserver" serves the ConfigMaps `app` and `ignored` (labelled; `ignored` carries
    /// the ignore annotation), answers 404 for anything else, and counts the requests.
    fn client(requests: Arc<std::sync::atomic::AtomicUsize>) -> Client {
        let svc = tower::service_fn(move |req: Request<Body>| {
            let requests = requests.clone();
            async move {
                requests.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let path = req.uri().path().to_string();
                let name = path.rsplit('/').next().unwrap_or_default().to_string();
                let (status, body) = if path.contains("/configmaps/")
                    && (name == "app" || name == "ignored")
                {
                    let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name, "namespace": "ns", "labels": {"reload": "yes"}},
                        "data": {"k": "v"}});
                    if name == "ignored" {
                        cm["metadata"]["annotations"] =
                            json!({"reloader.stakater.com/ignore": "true"});
                    }
                    (200, cm.to_string())
                } else {
                    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404, "message": "not found"});
                    (404, status.to_string())
                };
                Ok::<_, std::convert::Infallible>(
                    Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(Body::from(body.into_bytes()))
                        .unwrap(),
                )
            }
        });
        Client::new(svc, "default")
    }

    fn lookup(selector: Option<&str>) -> (Lookup, Arc<std::sync::atomic::AtomicUsize>) {
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let health = Arc::new(Health::default());
        health.set_ready(true);
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(Metrics::new(&mut registry, false));
        let lookup = Lookup::new(
            client(requests.clone()),
            health,
            AnnotationKeys::default(),
            selector.map(|s| Selector::parse_legacy(&[s]).unwrap()),
            vec![ResourceKind::ConfigMap, ResourceKind::Secret],
            metrics,
        );
        (lookup, requests)
    }

    fn cm(name: &str) -> ResourceKey {
        ResourceKey::new(ResourceKind::ConfigMap, "ns", name)
    }

    #[tokio::test]
    async fn a_found_resource_gets_the_watchs_hash_and_flags_and_an_absent_one_is_remembered() {
        let (lookup, requests) = lookup(Some("reload=yes"));
        let read = lookup
            .fetch(vec![cm("app"), cm("ignored"), cm("missing")])
            .await;
        let want: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "app"},
            "data": {"k": "v"}}))
        .unwrap();
        assert_eq!(
            read[&cm("app")].entry.hash.to_string(),
            crate::core::hash::configmap_hash_typed(&want)
        );
        assert_eq!(
            read[&cm("app")].digests.as_ref().map(|d| d.of.to_string()),
            Some(read[&cm("app")].entry.hash.to_string())
        );
        assert!(!read[&cm("app")].entry.flags.ignore);
        assert!(
            read[&cm("ignored")].entry.flags.ignore,
            "flags from the annotations"
        );
        assert!(!read.contains_key(&cm("missing")));
        assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert!(
            !lookup.wanted(&cm("missing")),
            "absent: not read again soon"
        );
        assert!(lookup.wanted(&cm("app")));
    }

    #[tokio::test]
    async fn filtered_out_unwatched_or_unsynced_is_never_stamped() {
        let (lookup, _) = lookup(Some("team=other"));
        assert!(
            lookup.fetch(vec![cm("app")]).await.is_empty(),
            "label selector"
        );
        assert!(!lookup.wanted(&cm("app")), "filtered: remembered");
        let (mut lookup, _) = self::lookup(None);
        assert!(!lookup.wanted(&ResourceKey::new(
            ResourceKind::SecretProviderClass,
            "ns",
            "x"
        )));
        lookup.kinds = vec![ResourceKind::Secret];
        assert!(
            !lookup.wanted(&cm("app")),
            "--resources-to-ignore=configMaps"
        );
        lookup.health.set_ready(false);
        assert!(!lookup.wanted(&ResourceKey::new(ResourceKind::Secret, "ns", "s")));
    }

    #[tokio::test]
    async fn a_workload_admitted_before_its_configmaps_watch_event_is_stamped_in_a_second_pass() {
        use crate::admission::{Admission, Reviewed};
        use crate::config::scope::ScopeFilter;
        use crate::config::Scope;
        use crate::core::WorkloadKind;
        use crate::index::Index;
        let (lookup, _) = lookup(None);
        let lookup = Arc::new(lookup);
        let admission = Admission {
            plan: Default::default(),
            scope: Arc::new(ScopeFilter::new(&Scope::default())),
            index: Arc::new(Index::new()),
            metrics: lookup.metrics.clone(),
            self_username: None,
            notify_only: false,
            kinds: WorkloadKind::ALL.to_vec(),
            lookup: Some(lookup.clone()),
        };
        let body = serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE",
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "namespace": "ns", "name": "web", "userInfo": {"username": "alice"},
            "object": {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "ns",
                    "annotations": {"reloader.stakater.com/auto": "true"}},
                "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i",
                    "envFrom": [{"configMapRef": {"name": "app"}}]}]}}}}}}))
        .unwrap();
        let Ok(Reviewed::Lookup(keys)) = admission.review_pass(&body, None) else {
            panic!("the first pass asks for the missing ConfigMap");
        };
        assert_eq!(keys, vec![cm("app")]);
        let read = lookup.fetch(keys).await;
        let Ok(Reviewed::Done(review)) = admission.review_pass(&body, Some(&read)) else {
            panic!("the second pass answers");
        };
        let patch = review["response"]["patch"].as_str().expect("stamped");
        let ops = String::from_utf8(
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, patch).unwrap(),
        )
        .unwrap();
        assert!(
            ops.contains(&read[&cm("app")].entry.hash.to_string()),
            "{ops}"
        );
        assert!(ops.contains("STAKATER_APP_CONFIGMAP"), "{ops}");
        // Without a lookup (the index has no entry), the review answers at once, unstamped.
        let plain = Admission {
            lookup: None,
            ..admission
        };
        assert!(plain.review(&body).unwrap()["response"]["patch"].is_null());
    }
}
