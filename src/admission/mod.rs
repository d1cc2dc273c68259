//! The mutating admission webhook: records a workload's references in the index and stamps the current
//! config hashes into it (behaviour §8). Pure given the index: no client, no network. A resource the index
//! does not know yet is read by [`lookup`] between two passes of a review (see `http`).
//!
//! It never denies. A malformed request is a 400 (the apiserver never sends one); anything else that
//! goes wrong allows the object unchanged with a warning.

pub mod http;
pub mod lookup;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use base64::Engine as _;
use json_patch::PatchOperation;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::{DynamicObject, GroupVersionKind};
use serde_json::Value;

use crate::config::scope::ScopeFilter;
use crate::core::keys::{KeyDigests, Owed};
use crate::core::patch::{self, MarkerChange, Place};
use crate::core::plan::{self, marker_place, Change, Event, PlanConfig};
use crate::core::pod_groups;
use crate::core::policy::WorkloadPolicy;
use crate::core::refs::{self, ResourceRef};
use crate::core::WorkloadKind;
use crate::index::{Index, ResourceEntry, ResourceKey, WorkloadEntry, WorkloadKey};
use crate::metrics::{AdmissionLabels, ErrorKind, Metrics};
use lookup::Looked;

/// The most annotation bytes an object may carry (the apiserver's limit).
const ANNOTATIONS_LIMIT: usize = 256 * 1024;

type Request = AdmissionRequest<DynamicObject>;

/// What stamping produced.
enum Stamp {
    Ops(Vec<PatchOperation>),
    Lookup(Vec<ResourceKey>),
}

/// What the webhook decided, for the response and the metrics.
#[derive(Debug, Default)]
pub struct Outcome {
    pub ops: Vec<PatchOperation>,
    pub warnings: Vec<String>,
    pub result: &'static str,
    /// Resources to read before the review can be answered (first pass only).
    pub lookups: Vec<ResourceKey>,
}

/// One pass of a review: the answer, or the resources to read first.
#[derive(Debug)]
pub enum Reviewed {
    Done(Value),
    Lookup(Vec<ResourceKey>),
}

pub struct Admission {
    pub plan: PlanConfig,
    pub scope: Arc<ScopeFilter>,
    pub index: Arc<Index>,
    pub metrics: Arc<Metrics>,
    /// rekindle's own identity; its requests pass unchanged.
    pub self_username: Option<String>,
    /// `--webhook-url` mode: nothing is stamped or recorded.
    pub notify_only: bool,
    pub kinds: Vec<WorkloadKind>,
    /// Reads resources the index misses (absent: never; tests and benchmarks).
    pub lookup: Option<Arc<lookup::Lookup>>,
}

/// The kind of a request, when it is a workload kind rekindle handles.
fn workload_kind(gvk: &GroupVersionKind, enabled: &[WorkloadKind]) -> Option<WorkloadKind> {
    let kind: WorkloadKind = gvk.kind.parse().ok()?;
    let api_version = if gvk.group.is_empty() {
        gvk.version.clone()
    } else {
        format!("{}/{}", gvk.group, gvk.version)
    };
    (kind.api_version() == api_version && enabled.contains(&kind)).then_some(kind)
}

impl Admission {
    /// Handles one AdmissionReview body without reading anything. `Err` is a reason for a 400.
    pub fn review(&self, body: &[u8]) -> Result<Value, String> {
        match self.review_pass(body, Some(&HashMap::new()))? {
            Reviewed::Done(v) => Ok(v),
            Reviewed::Lookup(_) => Err("a final pass asked for a lookup".into()),
        }
    }

    /// One pass. `looked_up` is `None` on the first pass, which may ask for resources to be read;
    /// the second pass gets what was read and always answers.
    pub fn review_pass(
        &self,
        body: &[u8],
        looked_up: Option<&HashMap<ResourceKey, Looked>>,
    ) -> Result<Reviewed, String> {
        let started = Instant::now();
        let review: AdmissionReview<DynamicObject> =
            serde_json::from_slice(body).map_err(|e| format!("malformed AdmissionReview: {e}"))?;
        let mut req: Request = review
            .try_into()
            .map_err(|_| "malformed AdmissionReview: no request")?;
        let outcome = self.decide(&mut req, looked_up);
        if !outcome.lookups.is_empty() {
            return Ok(Reviewed::Lookup(outcome.lookups));
        }
        self.metrics
            .admission_requests
            .get_or_create(&AdmissionLabels {
                operation: operation_label(&req.operation).into(),
                result: outcome.result.into(),
            })
            .inc();
        let mut response = AdmissionResponse::from(&req);
        if !outcome.warnings.is_empty() {
            response.warnings = Some(outcome.warnings);
        }
        let mut review = serde_json::to_value(response.into_review()).map_err(|e| e.to_string())?;
        if !outcome.ops.is_empty() {
            // Set here rather than with `AdmissionResponse::with_patch`, which serialises the patch as
            // an array of numbers (kube-rs/kube#1781): the API documents base64, four times shorter.
            let bytes = serde_json::to_vec(&outcome.ops).map_err(|e| e.to_string())?;
            review["response"]["patchType"] = "JSONPatch".into();
            review["response"]["patch"] = base64::engine::general_purpose::STANDARD
                .encode(bytes)
                .into();
        }
        self.metrics
            .admission_duration
            .observe(started.elapsed().as_secs_f64());
        Ok(Reviewed::Done(review))
    }

    /// Takes the object out of `req`: stamping works on it in place rather than on a copy.
    fn decide(
        &self,
        req: &mut Request,
        looked_up: Option<&HashMap<ResourceKey, Looked>>,
    ) -> Outcome {
        let pass = |result| Outcome {
            result,
            ..Default::default()
        };
        if self.notify_only {
            return pass("out-of-scope");
        }
        // A pod labelled for pod restarts is stamped at creation as the template of a workload.
        let pod = self.plan.pod_restarts && is_pod(&req.kind);
        let kind = match workload_kind(&req.kind, &self.kinds) {
            Some(kind) => kind,
            None if pod => pod_groups::PLANNED_AS,
            None => return pass("unknown-kind"),
        };
        let operations: &[Operation] = if pod {
            &[Operation::Create]
        } else {
            &[Operation::Create, Operation::Update]
        };
        if req.sub_resource.as_deref().is_some_and(|s| !s.is_empty())
            || !operations.contains(&req.operation)
        {
            return pass("out-of-scope");
        }
        if self.self_username.is_some() && req.user_info.username == self.self_username {
            return pass("self");
        }
        let Some(obj) = req
            .object
            .take()
            .and_then(|o| serde_json::to_value(o).ok())
            .filter(Value::is_object)
        else {
            return Outcome {
                result: "error",
                warnings: vec!["rekindle: request without an object; allowed unchanged".into()],
                ..Default::default()
            };
        };
        let namespace = req
            .namespace
            .clone()
            .or_else(|| {
                obj.pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .map(String::from)
            })
            .unwrap_or_default();
        let stamped = if pod {
            if !pod_groups::labelled(&obj) || !self.scope.namespace_in_scope(&namespace) {
                return pass("out-of-scope");
            }
            let plan = pod_groups::plan_config(&self.plan);
            self.stamp(
                &plan,
                req,
                kind,
                &namespace,
                pod_groups::as_workload(&obj),
                looked_up,
            )
            .map(|stamp| match stamp {
                Stamp::Ops(ops) => Stamp::Ops(onto_pod(ops)),
                lookup => lookup,
            })
        } else if !self.scope.covers(kind, &namespace) {
            return pass("out-of-scope");
        } else {
            self.stamp(&self.plan, req, kind, &namespace, obj, looked_up)
        };
        match stamped {
            Ok(Stamp::Lookup(lookups)) => Outcome {
                lookups,
                ..Default::default()
            },
            Ok(Stamp::Ops(ops)) => Outcome {
                result: if ops.is_empty() {
                    "unchanged"
                } else {
                    "patched"
                },
                ops,
                ..Default::default()
            },
            Err(e) => {
                self.metrics.error(ErrorKind::Admission);
                Outcome {
                    result: "error",
                    warnings: vec![format!(
                        "rekindle: could not stamp config hashes ({e}); allowed unchanged"
                    )],
                    ..Default::default()
                }
            }
        }
    }

    /// The ops that stamp `obj`, which ends as the object they produce; or, on a first pass, the
    /// resources to read first.
    fn stamp(
        &self,
        plan: &PlanConfig,
        req: &Request,
        kind: WorkloadKind,
        namespace: &str,
        mut obj: Value,
        looked_up: Option<&HashMap<ResourceKey, Looked>>,
    ) -> Result<Stamp, String> {
        let name = Some(req.name.clone())
            .filter(|n| !n.is_empty())
            .or_else(|| {
                obj.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(String::from)
            })
            .unwrap_or_default();
        let (entry, policy) = WorkloadEntry::with_policy(plan, &obj, kind);
        // generateName: no name yet, so nothing to record; dry-run: no side effects.
        let record = !name.is_empty() && !req.dry_run && !is_pod(&req.kind);
        let key = WorkloadKey {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        };
        let mut hashes = self.index.admit(&key, &entry, record);
        // Value digests of the resources read key by key (behaviour §14), for the refs that may get a
        // marker: those the workload carries none of.
        let mut digests: HashMap<ResourceRef, KeyDigests> = HashMap::new();
        let mut needs_digests = Vec::new();
        if entry.reads_keys {
            for r in entry.refs.iter().filter(|r| entry.marker(r).is_none()) {
                if plan::keys_read(plan, &obj, kind, r).is_none() {
                    continue;
                }
                let rk = ResourceKey::new(r.kind, namespace, &r.name);
                match self.index.key_digests(&rk) {
                    Some(d) => {
                        digests.insert(r.clone(), d);
                    }
                    None if hashes.contains_key(r) => needs_digests.push(rk),
                    None => {}
                }
            }
        }
        match looked_up {
            Some(read) => {
                for r in entry.refs.iter() {
                    let rk = ResourceKey::new(r.kind, namespace, &r.name);
                    let Some(looked) = read.get(&rk) else {
                        continue;
                    };
                    hashes
                        .entry(r.clone())
                        .or_insert_with(|| looked.entry.clone());
                    if let Some(d) = &looked.digests {
                        self.index.fill_keys(&rk, d.clone());
                        digests.entry(r.clone()).or_insert_with(|| d.clone());
                    }
                }
            }
            None => {
                let mut lookups =
                    self.lookups_for((plan, kind), namespace, &obj, (&entry, &policy), &hashes);
                if let Some(lookup) = &self.lookup {
                    lookups.extend(needs_digests.into_iter().filter(|k| lookup.wanted(k)));
                }
                if !lookups.is_empty() {
                    return Ok(Stamp::Lookup(lookups));
                }
            }
        }

        let old = req
            .old_object
            .as_ref()
            .filter(|_| req.operation == Operation::Update)
            .and_then(|o| serde_json::to_value(o).ok());
        let old = old.as_ref();
        let mut ops = match old {
            Some(old) => plan::restore_markers(plan, kind, old, &obj)?,
            None => Vec::new(),
        };
        // The markers `entry` read are those of the incoming object; restored ones change that.
        let restored = !ops.is_empty();
        if restored {
            json_patch::patch(&mut obj, &ops).map_err(|e| e.to_string())?;
        }

        // A template that is not changing never gets a new marker: that would roll it for nothing.
        let may_add = match old {
            None => true,
            Some(old) => refs::pod_template(old, kind) != refs::pod_template(&obj, kind),
        };
        if may_add {
            let changes = self.new_markers(
                (plan, kind),
                namespace,
                &obj,
                (&entry, &policy),
                restored,
                (&hashes, &digests),
            );
            if !changes.is_empty() {
                ops.extend(
                    patch::render_onto(&mut obj, kind, &changes).map_err(|e| e.to_string())?,
                );
            }
        }
        if !ops.is_empty() && annotation_bytes(&obj, kind) > ANNOTATIONS_LIMIT {
            return Err("stamping would push the annotations past 256 KiB".into());
        }
        Ok(Stamp::Ops(ops))
    }

    /// Referenced resources the index does not know, that the workload would get a marker for and
    /// does not carry one of, and that [`lookup::Lookup::wanted`] says are worth a read.
    fn lookups_for(
        &self,
        (plan, kind): (&PlanConfig, WorkloadKind),
        namespace: &str,
        obj: &Value,
        (entry, policy): (&WorkloadEntry, &WorkloadPolicy),
        hashes: &HashMap<ResourceRef, ResourceEntry>,
    ) -> Vec<ResourceKey> {
        let Some(lookup) = &self.lookup else {
            return Vec::new();
        };
        // The absent cache first: it is one map read, where the policy is a plan per reference, and a
        // workload whose resources are missing is admitted again on every update.
        entry
            .refs
            .iter()
            .filter(|r| !hashes.contains_key(*r) && entry.marker(r).is_none())
            .map(|r| (r, ResourceKey::new(r.kind, namespace, &r.name)))
            .filter(|(_, key)| lookup.wanted(key))
            .filter(|(r, _)| {
                let change = Change {
                    kind: r.kind,
                    name: &r.name,
                    namespace,
                    hash: "",
                    flags: Default::default(),
                    event: Event::Update,
                    also_current: None,
                };
                plan::plan_with_policy(plan, obj, kind, policy, &change, 0)
                    .decision
                    .reload
            })
            .map(|(_, key)| key)
            .collect()
    }

    /// Markers for every referenced resource the policy says should trigger the workload, and that the
    /// object does not carry yet. A marker the object carries is never changed. `restored`: markers were
    /// put back onto `obj` after `entry` read it, so they are read again.
    fn new_markers(
        &self,
        (plan, kind): (&PlanConfig, WorkloadKind),
        namespace: &str,
        obj: &Value,
        (entry, policy): (&WorkloadEntry, &WorkloadPolicy),
        restored: bool,
        (hashes, digests): (
            &HashMap<ResourceRef, ResourceEntry>,
            &HashMap<ResourceRef, KeyDigests>,
        ),
    ) -> Vec<MarkerChange> {
        let spec = refs::pod_spec(obj, kind);
        let place = marker_place(plan, obj, kind);
        let mut out = Vec::new();
        for r in &entry.refs {
            let Some(res) = hashes.get(r) else { continue };
            let has_marker = if restored {
                let container = spec.and_then(|s| refs::choose_container(s, r.kind, &r.name, true));
                plan::current_marker(plan, obj, kind, r.kind, &r.name, container.as_ref()).is_some()
            } else {
                entry.marker(r).is_some()
            };
            if has_marker {
                continue;
            }
            // Without the digests of a resource read key by key (it could not be read in time), the
            // whole object's hash: it counts as current until the resource changes.
            let hash = res.hash.to_string();
            let owed = plan::owed(plan, obj, kind, r, &hash, digests.get(r))
                .unwrap_or_else(|| Owed::whole(&hash));
            let change = Change {
                kind: r.kind,
                name: &r.name,
                namespace,
                hash: &owed.write,
                flags: res.flags,
                event: Event::Update,
                also_current: owed.also_current.as_deref(),
            };
            let p = plan::plan_with_policy(plan, obj, kind, policy, &change, 0);
            out.extend(p.changes.into_iter().filter(|c| match c {
                MarkerChange::SetEnv { .. } => place == Place::Template,
                MarkerChange::SetConfigHash { place: p, .. } => *p == place,
                _ => false,
            }));
        }
        out
    }
}

fn is_pod(gvk: &GroupVersionKind) -> bool {
    gvk.group.is_empty() && gvk.version == "v1" && gvk.kind == "Pod"
}

/// Stamping ops made on a pod planned as a template, moved onto the pod's own metadata.
fn onto_pod(ops: Vec<PatchOperation>) -> Vec<PatchOperation> {
    let moved = |path: &json_patch::jsonptr::PointerBuf| {
        pod_groups::onto_pod(path.as_str())
            .and_then(|p| json_patch::jsonptr::PointerBuf::parse(p).ok())
    };
    ops.into_iter()
        .filter_map(|mut op| {
            let path = match &mut op {
                PatchOperation::Add(o) => &mut o.path,
                PatchOperation::Replace(o) => &mut o.path,
                PatchOperation::Remove(o) => &mut o.path,
                PatchOperation::Test(o) => &mut o.path,
                _ => return None,
            };
            *path = moved(path)?;
            Some(op)
        })
        .collect()
}

/// The `operation` label of `rekindle_admission_requests_total`.
fn operation_label(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "create",
        Operation::Update => "update",
        Operation::Delete => "delete",
        Operation::Connect => "connect",
    }
}

fn annotation_bytes(obj: &Value, kind: WorkloadKind) -> usize {
    let size = |v: Option<&Value>| {
        v.and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
                    .sum()
            })
            .unwrap_or(0)
    };
    let template = refs::pod_template(obj, kind).and_then(|t| t.pointer("/metadata/annotations"));
    size(obj.pointer("/metadata/annotations")).max(size(template))
}

#[cfg(test)]
mod tests;
