//! The annotation policy: should workload W reload for a change of resource R? (behaviour §4–§5)

use std::collections::{BTreeMap, BTreeSet};

use regex::Regex;
use serde::Serialize;
use serde_json::Value;

use super::refs;
use super::{ResourceKind, WorkloadKind};

/// Annotation keys, renamable by Reloader's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationKeys {
    pub auto: String,
    pub configmap_auto: String,
    pub secret_auto: String,
    pub spc_auto: String,
    pub configmap_reload: String,
    pub secret_reload: String,
    pub spc_reload: String,
    pub search: String,
    pub search_match: String,
    pub ignore: String,
    pub configmap_exclude: String,
    pub secret_exclude: String,
    pub spc_exclude: String,
    pub pause_period: String,
    pub paused_at: String,
    pub rollout_strategy: String,
}

pub const CONFIG_HASHES_ANNOTATION: &str = "rekindle.io/config-hashes";
pub const LAST_RELOADED_FROM_ANNOTATION: &str = "reloader.stakater.com/last-reloaded-from";

impl Default for AnnotationKeys {
    fn default() -> Self {
        Self {
            auto: "reloader.stakater.com/auto".into(),
            configmap_auto: "configmap.reloader.stakater.com/auto".into(),
            secret_auto: "secret.reloader.stakater.com/auto".into(),
            spc_auto: "secretproviderclass.reloader.stakater.com/auto".into(),
            configmap_reload: "configmap.reloader.stakater.com/reload".into(),
            secret_reload: "secret.reloader.stakater.com/reload".into(),
            spc_reload: "secretproviderclass.reloader.stakater.com/reload".into(),
            search: "reloader.stakater.com/search".into(),
            search_match: "reloader.stakater.com/match".into(),
            ignore: "reloader.stakater.com/ignore".into(),
            configmap_exclude: "configmaps.exclude.reloader.stakater.com/reload".into(),
            secret_exclude: "secrets.exclude.reloader.stakater.com/reload".into(),
            spc_exclude: "secretproviderclasses.exclude.reloader.stakater.com/reload".into(),
            pause_period: "deployment.reloader.stakater.com/pause-period".into(),
            paused_at: "deployment.reloader.stakater.com/paused-at".into(),
            rollout_strategy: "reloader.stakater.com/rollout-strategy".into(),
        }
    }
}

impl AnnotationKeys {
    pub fn typed_auto(&self, kind: ResourceKind) -> &str {
        match kind {
            ResourceKind::ConfigMap => &self.configmap_auto,
            ResourceKind::Secret => &self.secret_auto,
            ResourceKind::SecretProviderClass => &self.spc_auto,
        }
    }
    pub fn reload(&self, kind: ResourceKind) -> &str {
        match kind {
            ResourceKind::ConfigMap => &self.configmap_reload,
            ResourceKind::Secret => &self.secret_reload,
            ResourceKind::SecretProviderClass => &self.spc_reload,
        }
    }
    pub fn exclude(&self, kind: ResourceKind) -> &str {
        match kind {
            ResourceKind::ConfigMap => &self.configmap_exclude,
            ResourceKind::Secret => &self.secret_exclude,
            ResourceKind::SecretProviderClass => &self.spc_exclude,
        }
    }

    /// Every workload annotation the policy reads.
    /// Whether `key` is one of the workload annotations the policy reads.
    pub fn is_workload_key(&self, key: &str) -> bool {
        self.workload_keys().any(|k| k == key)
    }

    fn workload_keys(&self) -> impl Iterator<Item = &str> {
        ResourceKind::ALL
            .into_iter()
            .flat_map(|k| [self.typed_auto(k), self.reload(k), self.exclude(k)])
            .chain([
                self.auto.as_str(),
                self.search.as_str(),
                self.pause_period.as_str(),
                self.rollout_strategy.as_str(),
            ])
    }
}

/// The decision-relevant configuration (a subset of the command line).
#[derive(Debug, Clone, Default)]
pub struct PolicyConfig {
    pub keys: AnnotationKeys,
    pub auto_reload_all: bool,
    pub ignored_workload_types: BTreeSet<WorkloadKind>,
}

/// The annotations of one workload that the policy reads, from metadata and from the pod template.
/// This is what the index keeps per workload instead of the object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadPolicy {
    pub metadata: BTreeMap<String, String>,
    pub template: BTreeMap<String, String>,
}

fn string_map(v: Option<&Value>) -> impl Iterator<Item = (&String, &str)> {
    v.and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| v.as_str().map(|s| (k, s)))
}

impl WorkloadPolicy {
    pub fn from_workload(keys: &AnnotationKeys, obj: &Value, kind: WorkloadKind) -> Self {
        let pick = |v: Option<&Value>| {
            string_map(v)
                .filter(|(k, _)| keys.workload_keys().any(|w| w == k.as_str()))
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect()
        };
        let template =
            refs::pod_template(obj, kind).and_then(|t| refs::at(t, "/metadata/annotations"));
        Self {
            metadata: pick(refs::at(obj, "/metadata/annotations")),
            template: pick(template),
        }
    }

    /// True when any reload annotation is present, so the workload can be affected at all.
    pub fn has_any(&self) -> bool {
        !self.metadata.is_empty() || !self.template.is_empty()
    }

    /// Reload patterns of any type: workloads with these can be triggered by unreferenced resources.
    pub fn has_patterns(&self, keys: &AnnotationKeys) -> bool {
        ResourceKind::ALL.into_iter().any(|k| {
            self.metadata.contains_key(keys.reload(k)) || self.template.contains_key(keys.reload(k))
        })
    }
}

/// Flags a resource carries (from its annotations).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceFlags {
    pub ignore: bool,
    pub search_match: bool,
}

impl ResourceFlags {
    pub fn from_annotations<'a>(
        keys: &AnnotationKeys,
        annotations: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Self {
        let mut flags = Self::default();
        for (k, v) in annotations {
            if *k == keys.ignore && v == "true" {
                flags.ignore = true;
            }
            if *k == keys.search_match && v == "true" {
                flags.search_match = true;
            }
        }
        flags
    }
}

/// Why a decision came out the way it did; the machine words `rekindle explain` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    Named,
    Auto,
    Search,
    Excluded,
    Ignored,
    NotReferenced,
    NoAnnotation,
    WorkloadTypeIgnored,
    InvalidAnnotation,
    AlreadyCurrent,
    /// `used-keys`: the workload's marker is current for the keys it reads; only others changed.
    UnusedKeys,
    NoContainer,
    NoPodTemplate,
    EventDisabled,
    Suspended,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Named => "named",
            Self::Auto => "auto",
            Self::Search => "search",
            Self::Excluded => "excluded",
            Self::Ignored => "ignored",
            Self::NotReferenced => "not-referenced",
            Self::NoAnnotation => "no-annotation",
            Self::WorkloadTypeIgnored => "workload-type-ignored",
            Self::InvalidAnnotation => "invalid-annotation",
            Self::AlreadyCurrent => "already-current",
            Self::UnusedKeys => "unused-keys",
            Self::NoContainer => "no-container",
            Self::NoPodTemplate => "no-pod-template",
            Self::EventDisabled => "event-disabled",
            Self::Suspended => "suspended",
        }
    }
}

/// A reload pattern that the regex engine refused, with the annotation it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidPattern {
    pub annotation: String,
    pub pattern: String,
    pub error: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub reload: bool,
    pub reason: Reason,
    /// Auto and search decisions need a real reference; named ones fall back to the first container.
    pub auto: bool,
    pub invalid_patterns: Vec<InvalidPattern>,
}

impl Decision {
    fn no(reason: Reason) -> Self {
        Self {
            reload: false,
            reason,
            auto: false,
            invalid_patterns: Vec::new(),
        }
    }
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Compiles one reload pattern exactly as Reloader does: `^` + element + `$`, no grouping.
pub fn compile_pattern(element: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!("^{element}$"))
}

/// The elements of a comma list annotation, trimmed, empty ones dropped.
pub fn list_elements(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// behaviour §5. `pod_spec` is the workload's pod spec (for the reference check of auto outcomes).
pub fn decide(
    cfg: &PolicyConfig,
    kind: WorkloadKind,
    policy: &WorkloadPolicy,
    pod_spec: Option<&Value>,
    resource_kind: ResourceKind,
    resource_name: &str,
    resource: ResourceFlags,
) -> Decision {
    let referenced =
        || pod_spec.is_some_and(|s| refs::is_referenced(s, resource_kind, resource_name));
    decide_with(
        cfg,
        kind,
        policy,
        referenced,
        resource_kind,
        resource_name,
        resource,
    )
}

/// [`decide`] with the reference check given as a function: the index knows references without the
/// object.
pub fn decide_with(
    cfg: &PolicyConfig,
    kind: WorkloadKind,
    policy: &WorkloadPolicy,
    referenced: impl Fn() -> bool,
    resource_kind: ResourceKind,
    resource_name: &str,
    resource: ResourceFlags,
) -> Decision {
    let keys = &cfg.keys;
    if cfg.ignored_workload_types.contains(&kind) {
        return Decision::no(Reason::WorkloadTypeIgnored);
    }
    if resource.ignore {
        return Decision::no(Reason::Ignored);
    }
    let source = annotations_read(keys, policy, resource_kind);
    let get = |k: &str| source.get(k).map(String::as_str);
    if excludes(keys, policy, resource_kind, resource_name) {
        return Decision::no(Reason::Excluded);
    }

    let reload_key = keys.reload(resource_kind);
    let (named, invalid_patterns) = match_reload_list(get(reload_key), reload_key, resource_name);
    if named {
        return Decision {
            reload: true,
            reason: Reason::Named,
            auto: false,
            invalid_patterns,
        };
    }

    let auto_outcome = |reason, invalid_patterns| {
        if referenced() {
            Decision {
                reload: true,
                reason,
                auto: true,
                invalid_patterns,
            }
        } else {
            Decision {
                reload: false,
                reason: Reason::NotReferenced,
                auto: true,
                invalid_patterns,
            }
        }
    };

    if get(&keys.search) == Some("true") && resource.search_match {
        return auto_outcome(Reason::Search, invalid_patterns);
    }
    let auto = get(&keys.auto);
    let typed = get(keys.typed_auto(resource_kind));
    let is_true = |v: Option<&str>| v.and_then(parse_go_bool).unwrap_or(false);
    let absent = |v: Option<&str>| v.is_none_or(str::is_empty);
    if is_true(auto) || is_true(typed) || (cfg.auto_reload_all && absent(auto) && absent(typed)) {
        return auto_outcome(Reason::Auto, invalid_patterns);
    }
    let reason = if invalid_patterns.is_empty() {
        Reason::NoAnnotation
    } else {
        Reason::InvalidAnnotation
    };
    Decision {
        reload: false,
        reason,
        auto: false,
        invalid_patterns,
    }
}

/// The annotations the reload decision reads: the workload's own metadata when it has any of the
/// reload, auto or search keys for this kind of resource, else the pod template's.
fn annotations_read<'a>(
    keys: &AnnotationKeys,
    policy: &'a WorkloadPolicy,
    resource_kind: ResourceKind,
) -> &'a BTreeMap<String, String> {
    let source_keys = [
        keys.reload(resource_kind),
        keys.auto.as_str(),
        keys.typed_auto(resource_kind),
        keys.search.as_str(),
    ];
    if source_keys.iter().any(|k| policy.metadata.contains_key(*k)) {
        &policy.metadata
    } else {
        &policy.template
    }
}

/// Whether the exclude annotation (in the metadata or the template) names the resource.
fn excludes(
    keys: &AnnotationKeys,
    policy: &WorkloadPolicy,
    resource_kind: ResourceKind,
    resource_name: &str,
) -> bool {
    let exclude_key = keys.exclude(resource_kind);
    [&policy.metadata, &policy.template]
        .into_iter()
        .filter_map(|m| m.get(exclude_key))
        .any(|v| list_elements(v).any(|n| n == resource_name))
}

/// Whether an element of the reload list `list` (annotation `annotation`) matches `name`, stopping at
/// the first that does; and the elements before it that are not valid patterns.
fn match_reload_list(
    list: Option<&str>,
    annotation: &str,
    name: &str,
) -> (bool, Vec<InvalidPattern>) {
    let mut invalid = Vec::new();
    for element in list.into_iter().flat_map(list_elements) {
        match compile_pattern(element) {
            Ok(re) if re.is_match(name) => return (true, invalid),
            Ok(_) => {}
            Err(e) => invalid.push(InvalidPattern {
                annotation: annotation.to_string(),
                pattern: element.to_string(),
                error: e.to_string(),
            }),
        }
    }
    (false, invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CM: ResourceKind = ResourceKind::ConfigMap;
    const SEC: ResourceKind = ResourceKind::Secret;

    fn deployment(meta: Value, template: Value) -> Value {
        json!({
            "metadata": {"name": "d", "annotations": meta},
            "spec": {"template": {"metadata": {"annotations": template}, "spec": {
                "containers": [{"name": "app", "envFrom": [{"configMapRef": {"name": "app-config"}},
                                                           {"secretRef": {"name": "app-secret"}}]}]}}}
        })
    }

    fn run(
        cfg: &PolicyConfig,
        obj: &Value,
        kind: ResourceKind,
        name: &str,
        flags: ResourceFlags,
    ) -> Decision {
        let policy = WorkloadPolicy::from_workload(&cfg.keys, obj, WorkloadKind::Deployment);
        let spec = refs::pod_spec(obj, WorkloadKind::Deployment);
        decide(
            cfg,
            WorkloadKind::Deployment,
            &policy,
            spec,
            kind,
            name,
            flags,
        )
    }

    fn reason(meta: Value, template: Value, kind: ResourceKind, name: &str) -> (bool, Reason) {
        let d = run(
            &PolicyConfig::default(),
            &deployment(meta, template),
            kind,
            name,
            ResourceFlags::default(),
        );
        (d.reload, d.reason)
    }

    #[test]
    fn rule_table() {
        use Reason::*;
        let t = json!({});
        type Case = (Value, Value, ResourceKind, &'static str, (bool, Reason));
        let cases: Vec<Case> = vec![
            (
                json!({}),
                t.clone(),
                CM,
                "app-config",
                (false, NoAnnotation),
            ),
            (
                json!({"reloader.stakater.com/auto": "true"}),
                t.clone(),
                CM,
                "app-config",
                (true, Auto),
            ),
            (
                json!({"reloader.stakater.com/auto": "True"}),
                t.clone(),
                SEC,
                "app-secret",
                (true, Auto),
            ),
            (
                json!({"reloader.stakater.com/auto": "1"}),
                t.clone(),
                CM,
                "app-config",
                (true, Auto),
            ),
            (
                json!({"reloader.stakater.com/auto": "yes"}),
                t.clone(),
                CM,
                "app-config",
                (false, NoAnnotation),
            ),
            (
                json!({"reloader.stakater.com/auto": "true"}),
                t.clone(),
                CM,
                "unused",
                (false, NotReferenced),
            ),
            (
                json!({"configmap.reloader.stakater.com/auto": "true"}),
                t.clone(),
                CM,
                "app-config",
                (true, Auto),
            ),
            (
                json!({"configmap.reloader.stakater.com/auto": "true"}),
                t.clone(),
                SEC,
                "app-secret",
                (false, NoAnnotation),
            ),
            (
                json!({"secret.reloader.stakater.com/auto": "true"}),
                t.clone(),
                SEC,
                "app-secret",
                (true, Auto),
            ),
            // Named: matches referenced or not, anchored.
            (
                json!({"configmap.reloader.stakater.com/reload": "unused"}),
                t.clone(),
                CM,
                "unused",
                (true, Named),
            ),
            (
                json!({"configmap.reloader.stakater.com/reload": "app"}),
                t.clone(),
                CM,
                "app-config",
                (false, NoAnnotation),
            ),
            (
                json!({"configmap.reloader.stakater.com/reload": "app-.*"}),
                t.clone(),
                CM,
                "app-config",
                (true, Named),
            ),
            (
                json!({"configmap.reloader.stakater.com/reload": " x , app-config "}),
                t.clone(),
                CM,
                "app-config",
                (true, Named),
            ),
            (
                json!({"secret.reloader.stakater.com/reload": "app-config"}),
                t.clone(),
                CM,
                "app-config",
                (false, NoAnnotation),
            ),
            // `a|b` is compiled as `^a|b$` verbatim: each alternative is anchored on one side only.
            (
                json!({"configmap.reloader.stakater.com/reload": "zz|config"}),
                t.clone(),
                CM,
                "app-config",
                (true, Named),
            ),
            (
                json!({"configmap.reloader.stakater.com/reload": "app|zz"}),
                t.clone(),
                CM,
                "app-config",
                (true, Named),
            ),
            // Invalid regex: skipped and reported; a valid element still matches.
            (
                json!({"configmap.reloader.stakater.com/reload": "(["}),
                t.clone(),
                CM,
                "app-config",
                (false, InvalidAnnotation),
            ),
            (
                json!({"configmap.reloader.stakater.com/reload": "([,app-config"}),
                t.clone(),
                CM,
                "app-config",
                (true, Named),
            ),
            // Exclude, metadata and template lists (union).
            (
                json!({"reloader.stakater.com/auto": "true", "configmaps.exclude.reloader.stakater.com/reload": "x, app-config"}),
                t.clone(),
                CM,
                "app-config",
                (false, Excluded),
            ),
            (
                json!({"reloader.stakater.com/auto": "true"}),
                json!({"configmaps.exclude.reloader.stakater.com/reload": "app-config"}),
                CM,
                "app-config",
                (false, Excluded),
            ),
            (
                json!({"reloader.stakater.com/auto": "true", "secrets.exclude.reloader.stakater.com/reload": "app-config"}),
                t.clone(),
                CM,
                "app-config",
                (true, Auto),
            ),
            // Template fallback only when none of the four is on metadata.
            (
                json!({}),
                json!({"reloader.stakater.com/auto": "true"}),
                CM,
                "app-config",
                (true, Auto),
            ),
            (
                json!({"reloader.stakater.com/auto": "false"}),
                json!({"reloader.stakater.com/auto": "true"}),
                CM,
                "app-config",
                (false, NoAnnotation),
            ),
            (
                json!({"secret.reloader.stakater.com/reload": "x"}),
                json!({"reloader.stakater.com/auto": "true"}),
                CM,
                "app-config",
                (true, Auto),
            ),
            (
                json!({"reloader.stakater.com/search": "true"}),
                json!({"reloader.stakater.com/auto": "true"}),
                CM,
                "app-config",
                (false, NoAnnotation),
            ),
        ];
        for (meta, template, kind, name, want) in cases {
            let got = reason(meta.clone(), template.clone(), kind, name);
            assert_eq!(got, want, "meta={meta} template={template} {kind}/{name}");
        }
    }

    #[test]
    fn invalid_patterns_are_reported() {
        let obj = deployment(
            json!({"configmap.reloader.stakater.com/reload": "([, ok"}),
            json!({}),
        );
        let d = run(
            &PolicyConfig::default(),
            &obj,
            CM,
            "app-config",
            ResourceFlags::default(),
        );
        assert_eq!(d.invalid_patterns.len(), 1);
        assert_eq!(d.invalid_patterns[0].pattern, "([");
        assert_eq!(
            d.invalid_patterns[0].annotation,
            "configmap.reloader.stakater.com/reload"
        );
    }

    #[test]
    fn search_and_match() {
        let obj = deployment(json!({"reloader.stakater.com/search": "true"}), json!({}));
        let cfg = PolicyConfig::default();
        let matched = ResourceFlags {
            search_match: true,
            ignore: false,
        };
        assert_eq!(
            run(&cfg, &obj, CM, "app-config", matched).reason,
            Reason::Search
        );
        assert!(!run(&cfg, &obj, CM, "app-config", ResourceFlags::default()).reload);
        assert_eq!(
            run(&cfg, &obj, CM, "unused", matched).reason,
            Reason::NotReferenced
        );
        // "True" is not exactly "true" for search.
        let obj = deployment(json!({"reloader.stakater.com/search": "True"}), json!({}));
        assert!(!run(&cfg, &obj, CM, "app-config", matched).reload);
    }

    #[test]
    fn ignore_wins() {
        let obj = deployment(
            json!({"configmap.reloader.stakater.com/reload": "app-config"}),
            json!({}),
        );
        let flags = ResourceFlags {
            ignore: true,
            search_match: false,
        };
        assert_eq!(
            run(&PolicyConfig::default(), &obj, CM, "app-config", flags).reason,
            Reason::Ignored
        );
    }

    #[test]
    fn ignore_and_match_flags_need_exactly_true() {
        let keys = AnnotationKeys::default();
        let ann: BTreeMap<String, String> = [
            (
                "reloader.stakater.com/ignore".to_string(),
                "True".to_string(),
            ),
            (
                "reloader.stakater.com/match".to_string(),
                "true".to_string(),
            ),
        ]
        .into();
        assert_eq!(
            ResourceFlags::from_annotations(&keys, &ann),
            ResourceFlags {
                ignore: false,
                search_match: true
            }
        );
    }

    #[test]
    fn auto_reload_all() {
        let cfg = PolicyConfig {
            auto_reload_all: true,
            ..Default::default()
        };
        let none = deployment(json!({}), json!({}));
        assert_eq!(
            run(&cfg, &none, CM, "app-config", ResourceFlags::default()).reason,
            Reason::Auto
        );
        assert_eq!(
            run(&cfg, &none, CM, "unused", ResourceFlags::default()).reason,
            Reason::NotReferenced
        );
        let opt_out = deployment(json!({"reloader.stakater.com/auto": "false"}), json!({}));
        assert!(!run(&cfg, &opt_out, CM, "app-config", ResourceFlags::default()).reload);
        let typed_opt_out = deployment(
            json!({"configmap.reloader.stakater.com/auto": "false"}),
            json!({}),
        );
        assert!(
            !run(
                &cfg,
                &typed_opt_out,
                CM,
                "app-config",
                ResourceFlags::default()
            )
            .reload
        );
        // Typed opt-out for configmaps leaves secrets to auto-reload-all? No: both are read per type.
        assert!(
            run(
                &cfg,
                &typed_opt_out,
                SEC,
                "app-secret",
                ResourceFlags::default()
            )
            .reload
        );
    }

    #[test]
    fn ignored_workload_type() {
        let cfg = PolicyConfig {
            ignored_workload_types: [WorkloadKind::Deployment].into(),
            ..Default::default()
        };
        let obj = deployment(json!({"reloader.stakater.com/auto": "true"}), json!({}));
        assert_eq!(
            run(&cfg, &obj, CM, "app-config", ResourceFlags::default()).reason,
            Reason::WorkloadTypeIgnored
        );
    }

    #[test]
    fn renamed_keys() {
        let mut cfg = PolicyConfig::default();
        cfg.keys.auto = "example.com/auto".into();
        let obj = deployment(json!({"example.com/auto": "true"}), json!({}));
        assert_eq!(
            run(&cfg, &obj, CM, "app-config", ResourceFlags::default()).reason,
            Reason::Auto
        );
        let old = deployment(json!({"reloader.stakater.com/auto": "true"}), json!({}));
        assert!(!run(&cfg, &old, CM, "app-config", ResourceFlags::default()).reload);
    }
}
