//! The workloads the tests create, built in one place: a Deployment of one `busybox` container
//! named `app`, selected by `app: <name>`, with whatever a test adds.

use anyhow::Result;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::DynamicObject;
use kube::Client;
use serde_json::{json, Value};

/// A Deployment named `name`, to be completed with the builder's methods.
pub fn deployment(name: &str) -> DeploymentBuilder {
    DeploymentBuilder {
        name: name.to_string(),
        annotations: json!({}),
        labels: json!({}),
        template_annotations: json!({}),
        pod_spec: json!({"containers": [{"name": "app", "image": "busybox"}]}),
    }
}

#[derive(Debug, Clone)]
pub struct DeploymentBuilder {
    name: String,
    annotations: Value,
    labels: Value,
    template_annotations: Value,
    pod_spec: Value,
}

impl DeploymentBuilder {
    /// The Deployment's own annotations (where the reload annotations go).
    pub fn annotations(mut self, annotations: Value) -> Self {
        self.annotations = annotations;
        self
    }

    /// `reloader.stakater.com/auto: "true"`.
    pub fn auto(self) -> Self {
        self.annotations(json!({"reloader.stakater.com/auto": "true"}))
    }

    pub fn labels(mut self, labels: Value) -> Self {
        self.labels = labels;
        self
    }

    /// Annotations of the pod template.
    pub fn template_annotations(mut self, annotations: Value) -> Self {
        self.template_annotations = annotations;
        self
    }

    /// The `app` container's `envFrom` (an array of sources).
    pub fn env_from(mut self, sources: Value) -> Self {
        self.pod_spec["containers"][0]["envFrom"] = sources;
        self
    }

    /// The `app` container takes its environment from ConfigMap `name`.
    pub fn uses_configmap(self, name: &str) -> Self {
        self.env_from(json!([{"configMapRef": {"name": name}}]))
    }

    /// The pod's containers, replacing the `app` container.
    pub fn containers(mut self, containers: Value) -> Self {
        self.pod_spec = json!({ "containers": containers });
        self
    }

    /// The whole pod spec.
    pub fn pod_spec(mut self, pod_spec: Value) -> Self {
        self.pod_spec = pod_spec;
        self
    }

    pub fn build(&self) -> Value {
        let mut template_meta = json!({"labels": {"app": self.name}});
        if self.template_annotations != json!({}) {
            template_meta["annotations"] = self.template_annotations.clone();
        }
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": self.name, "labels": self.labels, "annotations": self.annotations},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": self.name}},
                "template": {"metadata": template_meta, "spec": self.pod_spec},
            },
        })
    }

    /// As a manifest for `apply_yaml` (JSON is YAML).
    pub fn manifest(&self) -> String {
        self.build().to_string()
    }

    pub fn typed(&self) -> Result<Deployment> {
        Ok(serde_json::from_value(self.build())?)
    }

    /// Server-side applies it in `namespace` (as `crate::apply_value`).
    pub async fn apply(&self, client: &Client, namespace: &str) -> Result<DynamicObject> {
        crate::apply_value(client, Some(namespace), self.build()).await
    }
}

/// Template writes since creation plus one: every write of the spec bumps `metadata.generation`,
/// and nothing but rekindle writes the spec in these tests, so it counts rollouts exactly
/// (unlike ReplicaSets, which the controller-manager creates some time later).
pub fn generation(d: &Value) -> u64 {
    d.pointer("/metadata/generation")
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// The value of env var `name` on a workload's first container.
pub fn env_value(d: &Value, name: &str) -> Option<String> {
    d.pointer("/spec/template/spec/containers/0/env")?
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_has_what_the_builder_was_given() {
        let d = deployment("web").auto().uses_configmap("cfg").build();
        assert_eq!(
            d["metadata"]["annotations"]["reloader.stakater.com/auto"],
            "true"
        );
        assert_eq!(d["spec"]["selector"]["matchLabels"]["app"], "web");
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"],
            "cfg"
        );
        assert!(d["spec"]["template"]["metadata"]
            .get("annotations")
            .is_none());
        let typed = deployment("web")
            .template_annotations(json!({"a": "b"}))
            .typed()
            .unwrap();
        let template = typed.spec.unwrap().template.metadata.unwrap();
        assert_eq!(template.annotations.unwrap()["a"], "b");
    }
}
