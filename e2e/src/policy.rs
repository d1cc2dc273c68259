//! Admission policies the tests install to make the cluster refuse something on cue.

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::{apply_value, dynamic_api, wait_for, TIMEOUT};

/// A cluster-wide admission policy, bound to one namespace, removed when the test is done with it.
pub struct Policy(String);

impl Policy {
    pub async fn remove(self, client: &Client) -> Result<()> {
        for kind in [
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
        ] {
            dynamic_api(client, "admissionregistration.k8s.io/v1", kind, None)
                .await?
                .delete(&self.0, &DeleteParams::default())
                .await?;
        }
        Ok(())
    }
}

/// Refuses, in `ns`, new pods labelled `app` in `apps` whose marker env var `marker_env` is not
/// `stamped`: a rollout (or a pod restart) of another configuration cannot start.
pub async fn refuse_new_pods(
    client: &Client,
    ns: &str,
    apps: &[&str],
    marker_env: &str,
    stamped: &str,
) -> Result<Policy> {
    let app = apps[0];
    let name = format!("refuse-{app}-{ns}");
    let listed = apps
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let allowed = format!(
        "!has(object.metadata.labels) || !(object.metadata.labels[?'app'].orValue('') in [{listed}]) || \
         (has(object.spec.containers[0].env) && object.spec.containers[0].env.exists(e, e.name == '{marker_env}' && has(e.value) && e.value == '{stamped}'))"
    );
    apply_value(
        client,
        None,
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["pods"]}]},
                "validations": [{"expression": allowed, "message": "the new configuration is refused"}],
            },
        }),
    )
    .await?;
    apply_value(
        client,
        None,
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
            },
        }),
    )
    .await?;
    // The apiserver loads policies asynchronously: a pod with another configuration, created as a
    // dry run, is refused once the policy is in force. (Were it not, the new pod could be admitted,
    // and a halt written at a slow rollout's deadline would end when the pod came up.)
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {"generateName": "probe-", "labels": {"app": app}},
        "spec": {"containers": [{"name": "app", "image": "app",
            "env": [{"name": marker_env, "value": "another"}]}]},
    }))?;
    wait_for("the policy to refuse the new pods", TIMEOUT, || async {
        match pods
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &probe,
            )
            .await
        {
            Ok(_) => Ok(None),
            Err(kube::Error::Api(e)) if e.message.contains("the new configuration is refused") => {
                Ok(Some(()))
            }
            Err(e) => Err(e.into()),
        }
    })
    .await?;
    Ok(Policy(name))
}
