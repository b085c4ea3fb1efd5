#!/usr/bin/env python3
"""Validates rendered Kubernetes manifests (multi-document YAML files, one per render).

Every built-in object is checked strictly (unknown fields are errors) against the Kubernetes
schemas of KUBE_VERSION with kubernetes-validate; a built-in kind without a schema is an error,
not a warning. Custom resources (CRD_KINDS) go to .ci/crd-validate/validate.mjs, which checks
them against the schemas of their operators' APIs. Prints one line per object and exits 1 if any
object failed.

Usage: validate_manifests.py KUBE_VERSION RENDERED.yaml...
"""

import json
import pathlib
import subprocess
import sys

import kubernetes_validate
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("cert-manager.io/v1", "Certificate"),
}
NODE_VALIDATOR = pathlib.Path(__file__).parent / "crd-validate" / "validate.mjs"


def main() -> int:
    version, files = sys.argv[1], sys.argv[2:]
    if not files:
        print("usage: validate_manifests.py KUBE_VERSION RENDERED.yaml...", file=sys.stderr)
        return 2
    failed = False
    for path in files:
        with open(path, encoding="utf-8") as f:
            objects = [o for o in yaml.safe_load_all(f) if o]
        if not objects:
            print(f"ERROR {path}: no objects rendered")
            failed = True
        custom = []
        for o in objects:
            name = f"{o['kind'].lower()}/{o['metadata']['name']}"
            if (o["apiVersion"], o["kind"]) in CRD_KINDS:
                custom.append(o)
                continue
            try:
                checked = kubernetes_validate.validate(o, version, strict=True)
                print(f"INFO {path} {name} passed (Kubernetes {checked}, strict)")
            except ValidationError as e:
                where = ".".join(str(p) for p in e.path)
                print(f"ERROR {path} {name} did not validate (Kubernetes {e.version}, strict): "
                      f"{where}: {e.message}")
                failed = True
            except SchemaNotFoundError as e:
                print(f"ERROR {path} {name}: {e.message}")
                failed = True
        if custom:
            lines = "".join(json.dumps(o) + "\n" for o in custom)
            done = subprocess.run(["node", str(NODE_VALIDATOR)], input=lines, text=True,
                                  capture_output=True, check=False)
            for line in done.stdout.splitlines():
                print(f"{line.split(' ', 1)[0]} {path} {line.split(' ', 1)[1]}")
            if done.returncode != 0:
                sys.stderr.write(done.stderr)
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
