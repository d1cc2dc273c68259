//! The kinds of resources rekindle watches and of workloads it reloads.

use std::fmt;
use std::str::FromStr;

use kube::core::{ApiResource, GroupVersionKind};

/// A kind of configuration resource that can trigger a reload.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum ResourceKind {
    ConfigMap,
    Secret,
    SecretProviderClass,
}

impl ResourceKind {
    pub const ALL: [ResourceKind; 3] = [Self::ConfigMap, Self::Secret, Self::SecretProviderClass];

    /// Suffix of the env-var name and the `type` of `last-reloaded-from` (Reloader's constants).
    pub fn env_suffix(self) -> &'static str {
        match self {
            Self::ConfigMap => "CONFIGMAP",
            Self::Secret => "SECRET",
            Self::SecretProviderClass => "SECRETPROVIDERCLASS",
        }
    }

    /// Prefix of keys in `rekindle.io/config-hashes`.
    pub fn hash_key_prefix(self) -> &'static str {
        match self {
            Self::ConfigMap => "configmap",
            Self::Secret => "secret",
            Self::SecretProviderClass => "secretproviderclass",
        }
    }

    /// The Kubernetes kind name.
    pub fn kind_name(self) -> &'static str {
        match self {
            Self::ConfigMap => "ConfigMap",
            Self::Secret => "Secret",
            Self::SecretProviderClass => "SecretProviderClass",
        }
    }

    /// Plural resource name, as used in Reloader's metric labels and `--resources-to-ignore`.
    pub fn plural(self) -> &'static str {
        match self {
            Self::ConfigMap => "configmaps",
            Self::Secret => "secrets",
            Self::SecretProviderClass => "secretproviderclasses",
        }
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind_name())
    }
}

/// A kind of workload rekindle can reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    DaemonSet,
    CronJob,
    Job,
    Rollout,
    DeploymentConfig,
    /// The pods of one controller owner that rekindle does not write (an operator's), labelled
    /// `rekindle.io/restart: pods`: restarted by eviction, never by a write. Keyed by the owner,
    /// `<Kind>/<name>` ([`crate::core::pod_groups`]). Not watched as a kind: not in [`Self::ALL`].
    Pods,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 7] = [
        Self::Deployment,
        Self::StatefulSet,
        Self::DaemonSet,
        Self::CronJob,
        Self::Job,
        Self::Rollout,
        Self::DeploymentConfig,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Deployment => "Deployment",
            Self::StatefulSet => "StatefulSet",
            Self::DaemonSet => "DaemonSet",
            Self::CronJob => "CronJob",
            Self::Job => "Job",
            Self::Rollout => "Rollout",
            Self::DeploymentConfig => "DeploymentConfig",
            Self::Pods => "Pods",
        }
    }

    /// JSON pointer of the pod template (`metadata` + `spec`) inside the workload object.
    pub fn template_pointer(self) -> &'static str {
        match self {
            Self::CronJob => "/spec/jobTemplate/spec/template",
            _ => "/spec/template",
        }
    }

    /// `template` (a pod template) at [`Self::template_pointer`] of an otherwise empty object.
    pub fn under_template_path(self, template: serde_json::Value) -> serde_json::Value {
        // Moved into maps, not through `json!`, which would serialise the template again: this
        // runs for every workload listed.
        self.template_pointer()
            .rsplit('/')
            .take_while(|token| !token.is_empty())
            .fold(template, |node, token| {
                serde_json::Value::Object(serde_json::Map::from_iter([(token.to_string(), node)]))
            })
    }

    /// Whether the apiserver merges strategic-merge patches for this kind (built-in kinds do; CRDs
    /// such as Rollouts and DeploymentConfigs do not). Jobs are re-created, never patched.
    pub fn strategic_merge(self) -> bool {
        matches!(
            self,
            Self::Deployment | Self::StatefulSet | Self::DaemonSet | Self::CronJob
        )
    }

    /// The plural resource name (fixed for these kinds, so no discovery is needed).
    pub fn plural(self) -> &'static str {
        match self {
            Self::Deployment => "deployments",
            Self::StatefulSet => "statefulsets",
            Self::DaemonSet => "daemonsets",
            Self::CronJob => "cronjobs",
            Self::Job => "jobs",
            Self::Rollout => "rollouts",
            Self::DeploymentConfig => "deploymentconfigs",
            Self::Pods => "pods",
        }
    }

    /// The kind's API resource, for dynamic clients.
    pub fn api_resource(self) -> ApiResource {
        let (group, version) = self
            .api_version()
            .split_once('/')
            .unwrap_or(("", self.api_version()));
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, self.name()),
            self.plural(),
        )
    }

    /// The API group/version the kind is served from.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::Deployment | Self::StatefulSet | Self::DaemonSet => "apps/v1",
            Self::CronJob | Self::Job => "batch/v1",
            Self::Rollout => "argoproj.io/v1alpha1",
            Self::DeploymentConfig => "apps.openshift.io/v1",
            Self::Pods => "v1",
        }
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The Secrets Store CSI driver's API: SecretProviderClasses carry the reload annotations, and their
/// pod statuses the versions a pod mounted (which make the class's hash).
pub mod csi {
    use kube::core::{ApiResource, GroupVersionKind};

    const GROUP: &str = "secrets-store.csi.x-k8s.io";

    pub fn secret_provider_classes() -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, "v1", "SecretProviderClass"),
            "secretproviderclasses",
        )
    }

    pub fn pod_statuses() -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, "v1", "SecretProviderClassPodStatus"),
            "secretproviderclasspodstatuses",
        )
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown workload kind {0:?}")]
pub struct UnknownKind(pub String);

impl FromStr for WorkloadKind {
    type Err = UnknownKind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownKind(s.to_string()))
    }
}
