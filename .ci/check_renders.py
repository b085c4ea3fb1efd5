#!/usr/bin/env python3
"""Checks what deploy/kubernetes promises an operator, on the renders .ci/validate-deploy left in
RENDERS (target/kubernetes): every object carries the base's labels; the redis overlay leaves the
scale to its HPA (no `replicas`); no Service exposes the admin port and, by default, no
NetworkPolicy rule admits it (components/admin-access opens it), while the probes use it; the
metrics have a port of their own that the ServiceMonitor scrapes, labelled for
kube-prometheus-stack; the tls overlay pins the client's SAN and the Certificate names the
Services' `svc` DNS names. Prints one line per check; exits 1 on the first failure.

Usage: check_renders.py RENDERS
"""

import pathlib
import sys

import yaml

LABELS = {"app.kubernetes.io/name": "ratelimit-server", "app.kubernetes.io/part-of": "ratelimit-server"}


def load(path):
    with open(path, encoding="utf-8") as f:
        return [o for o in yaml.safe_load_all(f) if o]


def one(objects, kind, name="ratelimit-server"):
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"one {kind}/{name}, found {len(found)}"
    return found[0]


def container(objects):
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def admits_admin(policies):
    return any(
        p.get("port") == "admin"
        for policy in policies
        for rule in policy["spec"].get("ingress", [])
        for p in rule.get("ports", [])
    )


def check(what, ok):
    if not ok:
        print(f"FAIL {what}")
        sys.exit(1)
    print(f"ok   {what}")


def main():
    renders = pathlib.Path(sys.argv[1])
    names = ["base", "redis", "tls", "base+components", "redis+components", "tls+components"]
    docs = {n: load(renders / f"{n}.yaml") for n in names}
    for name, objects in docs.items():
        unlabelled = [f"{o['kind']}/{o['metadata']['name']}" for o in objects
                      if any(o["metadata"].get("labels", {}).get(k) != v for k, v in LABELS.items())]
        check(f"{name}: every object has the base's labels {unlabelled or ''}", not unlabelled)
    for name in ["redis", "redis+components"]:
        check(f"{name}: the Deployment leaves replicas to its HPA",
              "replicas" not in one(docs[name], "Deployment")["spec"])
        one(docs[name], "HorizontalPodAutoscaler")
    for name in ["base", "redis", "tls"]:
        objects = docs[name]
        ports = [p["name"] for s in objects if s["kind"] == "Service" for p in s["spec"]["ports"]]
        check(f"{name}: no Service exposes the admin port ({', '.join(ports)})", "admin" not in ports)
        policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
        check(f"{name}: a NetworkPolicy admits no pod to the admin port", policies and not admits_admin(policies))
        c = container(objects)
        probes = [c[p]["httpGet"]["port"] for p in ("startupProbe", "readinessProbe", "livenessProbe")]
        check(f"{name}: the probes use the admin port (kubelet, not filtered)", set(probes) == {"admin"})
        metrics = [p for p in c["ports"] if p["name"] == "metrics"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        check(f"{name}: the metrics on their own port {env.get('METRICS_ADDR')}",
              metrics and env.get("METRICS_ADDR", "").endswith(f":{metrics[0]['containerPort']}"))
    check("base+components: components/admin-access admits pods to the admin port",
          admits_admin([o for o in docs["base+components"] if o["kind"] == "NetworkPolicy"]))
    monitor = one(docs["base+components"], "ServiceMonitor")
    check("ServiceMonitor: scrapes the metrics port, labelled release: kube-prometheus-stack",
          monitor["spec"]["endpoints"][0]["port"] == "metrics"
          and monitor["metadata"]["labels"].get("release") == "kube-prometheus-stack")
    rule = one(docs["base+components"], "PrometheusRule")
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    check(f"PrometheusRule: {', '.join(alerts)}", len(alerts) >= 4)
    env = {e["name"]: e.get("value") for e in container(docs["tls"])["env"]}
    check(f"tls: the client's SAN is pinned (GRPC_CLIENT_TLS_SAN={env.get('GRPC_CLIENT_TLS_SAN')})",
          bool(env.get("GRPC_CLIENT_TLS_SAN")))
    names = one(docs["tls+components"], "Certificate")["spec"]["dnsNames"]
    check("tls: the Certificate names the Services' svc DNS names",
          "ratelimit-server.ratelimit.svc" in names and "ratelimit-server-headless.ratelimit.svc" in names)


if __name__ == "__main__":
    main()
