#!/usr/bin/env python3
"""Writes a CustomResourceDefinition for OpenShift's DeploymentConfig (apps.openshift.io/v1) from the
OpenAPI v2 definitions in `openapi/openapi.json` of the github.com/openshift/api module.

openshift-apiserver, which really serves DeploymentConfigs, cannot run here; a CRD with the type's real
schema is the closest stand-in: the apiserver then validates, prunes and defaults objects the way the
schema says, and serves the status and scale subresources. What it cannot do: the defaulting that
openshift-apiserver does in code rather than in the schema, its validation beyond the schema, and the
controller that turns a template change into a ReplicationController (nothing rolls out).

The conversion to a structural schema: every $ref inlined; Time becomes a date-time string, IntOrString
and Quantity int-or-string, RawExtension an object that keeps unknown fields; descriptions and the
strategic-merge hints (x-kubernetes-patch-*) left out, as CRDs do not use them; scalar defaults kept
(object defaults such as `{}` on list items are not valid CRD defaults, nor an enum's zero value "" that
the enum does not list). The top-level metadata is left
to the apiserver, the pod template's metadata keeps ObjectMeta's schema (labels and annotations).

Usage: deploymentconfig-crd.py OPENAPI_JSON > crd.yaml (JSON, which is YAML)
"""
import json
import sys

KIND = "com.github.openshift.api.apps.v1.DeploymentConfig"
SPECIAL = {
    "io.k8s.apimachinery.pkg.apis.meta.v1.Time": {"type": "string", "format": "date-time"},
    "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime": {"type": "string", "format": "date-time"},
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"x-kubernetes-int-or-string": True},
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
    },
    "io.k8s.apimachinery.pkg.runtime.RawExtension": {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    },
}
KEPT = ("type", "format", "enum", "required", "minimum", "maximum", "pattern")


def convert(schema, definitions, stack):
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name in SPECIAL:
            out = dict(SPECIAL[name])
        elif name in stack:
            # A recursive type: its inner levels keep whatever they hold.
            out = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        else:
            out = convert(definitions[name], definitions, stack + [name])
        scalar_default(schema, out)
        return out
    out = {k: schema[k] for k in KEPT if k in schema}
    scalar_default(schema, out)
    if "properties" in schema:
        out["type"] = "object"
        out["properties"] = {
            k: convert(v, definitions, stack) for k, v in schema["properties"].items()
        }
    if isinstance(schema.get("additionalProperties"), dict):
        out["type"] = "object"
        out["additionalProperties"] = convert(schema["additionalProperties"], definitions, stack)
    if "items" in schema:
        out["items"] = convert(schema["items"], definitions, stack)
    if "type" not in out and not out.get("x-kubernetes-int-or-string"):
        out["type"] = "object"
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def scalar_default(schema, out):
    default = schema.get("default")
    if default is None or isinstance(default, (dict, list)):
        return
    # The generator marks some enums' zero value ("") as their default, which the enum refuses.
    if "enum" in out and default not in out["enum"]:
        return
    out["default"] = default


def main():
    definitions = json.load(open(sys.argv[1]))["definitions"]
    root = convert(definitions[KIND], definitions, [KIND])
    root["properties"]["metadata"] = {"type": "object"}
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "deploymentconfigs.apps.openshift.io"},
        "spec": {
            "group": "apps.openshift.io",
            "names": {
                "kind": "DeploymentConfig",
                "listKind": "DeploymentConfigList",
                "plural": "deploymentconfigs",
                "singular": "deploymentconfig",
                "shortNames": ["dc"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                        },
                    },
                }
            ],
        },
    }
    json.dump(crd, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
