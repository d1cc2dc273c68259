#!/usr/bin/env python3
"""Captures the protobuf fixtures beside this script from a running e2e cluster (`just cluster-up`).

The objects of objects.json are created in a new namespace; once their controllers have settled,
each kind is captured twice, at one resourceVersion: as the JSON list (`<kind>.json`) and as the
first state of a protobuf watch, frames as the apiserver sent them (`<kind>.pb`). The tests decode
both and compare what rekindle makes of them.
"""
import json, os, ssl, sys, time, http.client, urllib.parse

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.abspath(os.path.join(here, "../../../.."))
state = os.environ.get("REKINDLE_E2E_STATE", os.path.join(root, "target/e2e"))
server = next(l.split()[1] for l in open(os.path.join(state, "kubeconfig")) if "server:" in l)
host = urllib.parse.urlparse(server).netloc
ctx = ssl.create_default_context(cafile=os.path.join(state, "pki/ca.crt"))
ctx.load_cert_chain(os.path.join(state, "pki/admin.crt"), os.path.join(state, "pki/admin.key"))
NS = "pbfix-" + str(int(time.time()))


def call(method, path, body=None, accept="application/json"):
    conn = http.client.HTTPSConnection(host, context=ctx, timeout=30)
    headers = {"Accept": accept, "Content-Type": "application/json"}
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = conn.getresponse()
    data = r.read()
    if r.status >= 300:
        sys.exit(f"{method} {path}: {r.status} {data[:300]!r}")
    return data


objects = json.load(open(os.path.join(here, "objects.json")))
call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
collections = {
    "deployments": f"/apis/apps/v1/namespaces/{NS}/deployments",
    "statefulsets": f"/apis/apps/v1/namespaces/{NS}/statefulsets",
    "daemonsets": f"/apis/apps/v1/namespaces/{NS}/daemonsets",
    "configmaps": f"/api/v1/namespaces/{NS}/configmaps",
}
for kind, path in collections.items():
    for obj in objects[kind]:
        call("POST", path, obj)

# Let the controllers (and kwok's pods) bring the workloads' status to rest.
def settled(kind, i):
    status, spec = i.get("status", {}), i["spec"]
    if spec.get("paused"):
        return True
    if status.get("observedGeneration") != i["metadata"]["generation"]:
        return False
    if kind == "daemonsets":
        return status.get("numberAvailable", 0) == status.get("desiredNumberScheduled", -1)
    return status.get("availableReplicas", 0) == spec.get("replicas", 1)


for _ in range(90):
    if all(settled(kind, i)
           for kind in ("deployments", "statefulsets", "daemonsets")
           for i in json.loads(call("GET", collections[kind]))["items"]):
        break
    time.sleep(1)
else:
    sys.exit("the workloads did not settle in 90 s")
time.sleep(3)

for kind, path in collections.items():
    listed = json.loads(call("GET", path))
    watch = call("GET", path + "?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
                 "&allowWatchBookmarks=true&timeoutSeconds=2",
                 accept="application/vnd.kubernetes.protobuf;stream=watch")
    versions = {i["metadata"]["resourceVersion"] for i in listed["items"]}
    for i in listed["items"]:
        i["metadata"]["namespace"]  # every item names its namespace
    open(os.path.join(here, f"{kind}.json"), "w").write(json.dumps(listed, indent=1) + "\n")
    open(os.path.join(here, f"{kind}.pb"), "wb").write(watch)
    print(f"{kind}: {len(listed['items'])} objects, {len(watch)} bytes of protobuf, versions {sorted(versions)}")
call("DELETE", f"/api/v1/namespaces/{NS}")
