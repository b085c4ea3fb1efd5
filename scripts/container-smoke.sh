#!/usr/bin/env bash
# The built image (IMAGE, default localhost/ratelimit-server:dev) run as Kubernetes would, with
# decisions asked from the host by the project's own client (`ratelimit-server query`, RATELIMIT_BIN,
# default target/debug/ratelimit-server) — scripts/container-image.sh smoke runs this:
#   1. read-only root, user 65532:65532, every capability dropped, no new privileges, reached only
#      through its published ports: ShouldRateLimit from the shipped config/, /healthcheck,
#      /readyz, /metrics; the image's user, entrypoint, labels and size from `podman image inspect`.
#   2. BACKEND_TYPE=redis against a redis-server on the host (reached at 10.0.2.2, the host's
#      loopback through slirp4netns): decides, and the counters are keys in that Redis.
#   3. `podman kube play` of the rendered base (KUBECTL renders it; podman runs its Deployment with
#      the ConfigMap mounted, and skips what it has no part for: Services, PodDisruptionBudget,
#      NetworkPolicy) with this image: the ConfigMap's rules decide; a changed ConfigMap replayed
#      with --replace makes a new pod that decides by the new rules (a memory store starts empty).
# Envoy Gateway's /bin/ratelimit over xDS in the image: tests/it/container_image.rs (it needs the
# test's mTLS ADS server). Prints one "ok" line per check; exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/ratelimit-server:dev}
BIN=${RATELIMIT_BIN:-target/debug/ratelimit-server}
KUBECTL=${KUBECTL:-kubectl}
work=$(mktemp -d)
containers=()
cleanup() {
  for c in "${containers[@]}"; do podman rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  [ -f "$work/kube.yaml" ] && podman kube down "$work/kube.yaml" >/dev/null 2>&1 || true
  if [ -f "$work/redis.pid" ]; then
    local pid
    pid=$(cat "$work/redis.pid")
    kill "$pid" 2>/dev/null || true
    # Gone before its directory is (it writes its log there until it exits).
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  fi
  rm -rf "$work" || true
}
trap cleanup EXIT

ok() { echo "ok   $*"; }
fail() {
  echo "FAIL $*" >&2
  for c in "${containers[@]}"; do echo "--- log of $c" >&2; podman logs "$c" 2>&1 | tail -20 >&2 || true; done
  exit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Waits until URL answers 200 (the image has no shell, so no in-container probe); gives up after
# 30 s, far above the normal time (a bound for a stuck container, not a timing check).
wait_200() { # URL
  for _ in $(seq 1 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$1" 2>/dev/null)" = 200 ] && return 0
    sleep 0.1
  done
  return 1
}
query() { "$BIN" query "$@"; }
# Runs the image hardened as the base Deployment's securityContext says; prints the container id.
run_hardened() { # NAME GRPC_PORT HTTP_PORT [podman run options...]
  local name=$1 grpc=$2 http=$3
  shift 3
  containers+=("$name")
  podman run -d --name "$name" --read-only --user 65532:65532 --cap-drop ALL \
    --security-opt no-new-privileges -p "127.0.0.1:$grpc:8081" -p "127.0.0.1:$http:8080" "$@" \
    "$IMAGE" >/dev/null
}

[ -x "$BIN" ] || fail "no host client at $BIN (cargo build first, or set RATELIMIT_BIN)"
podman image exists "$IMAGE" || fail "no image $IMAGE (scripts/container-image.sh build)"

echo "== the image"
podman image inspect "$IMAGE" --format 'size {{.Size}} bytes; user {{.Config.User}}; entrypoint {{json .Config.Entrypoint}}; workdir {{.Config.WorkingDir}}; ports {{json .Config.ExposedPorts}}'
podman image inspect "$IMAGE" --format '{{range $k, $v := .Config.Labels}}label {{$k}}={{$v}}{{"\n"}}{{end}}' >"$work/labels"
grep opencontainers "$work/labels" || echo "(no org.opencontainers labels)"
[ "$(podman image inspect "$IMAGE" --format '{{.Config.User}}')" = 65532:65532 ] || fail "image user"
size=$(podman image inspect "$IMAGE" --format '{{.Size}}')
[ "$size" -le "${MAX_IMAGE_BYTES:-50000000}" ] || fail "image is $size bytes, over 50 MB (the goal)"
ok "image $IMAGE: $((size / 1000)) kB, user 65532:65532"

echo "== 1. read-only, 65532, no capabilities, only published ports; the shipped rules"
g=$(free_port) h=$(free_port)
run_hardened rl-smoke "$g" "$h"
wait_200 "http://127.0.0.1:$h/readyz" || fail "/readyz never answered 200"
for path in /healthcheck /readyz /metrics; do
  code=$(curl -s -o "$work/page" -w '%{http_code}' "http://127.0.0.1:$h$path")
  [ "$code" = 200 ] || fail "$path answered $code"
  ok "GET $path: 200"
done
grep -q '^ratelimit_build_info{' "$work/page" || fail "/metrics has no ratelimit_build_info"
ok "/metrics: $(grep '^ratelimit_build_info{' "$work/page")"
[ "$(podman inspect rl-smoke --format '{{.HostConfig.ReadonlyRootfs}}')" = true ] || fail "root not read-only"
pid=$(podman inspect rl-smoke --format '{{.State.Pid}}')
uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status") capeff=$(awk '/^CapEff:/ {print $2}' "/proc/$pid/status")
[ "$uid" = 65532 ] && [ "$capeff" = 0000000000000000 ] || fail "uid $uid, CapEff $capeff"
ok "process: uid $uid, CapEff $capeff, read-only root"
query --server "http://127.0.0.1:$g" --domain edge --repeat 2 api_key=k1 >"$work/q1"
[ "$(grep -c '^overall: OK' "$work/q1")" = 2 ] || fail "api_key=k1: $(cat "$work/q1")"
ok "ShouldRateLimit api_key=k1 twice: OK, OK ($(grep -o 'remaining [0-9]*' "$work/q1" | paste -sd, -))"
query --server "http://127.0.0.1:$g" --domain edge --hits 1001 api_key=k2 >"$work/q2"
grep -q '^overall: OVER_LIMIT' "$work/q2" || fail "1001 hits on a 1000/min limit: $(cat "$work/q2")"
ok "ShouldRateLimit api_key=k2 with 1001 hits (limit 1000 per minute): OVER_LIMIT"
query --server "http://127.0.0.1:$g" --domain other k=v >"$work/q3"
grep -q '^overall: OK' "$work/q3" || fail "unknown domain: $(cat "$work/q3")"
ok "ShouldRateLimit of a domain without rules: OK"

echo "== 2. BACKEND_TYPE=redis against the host's redis-server"
r=$(free_port)
redis-server --port "$r" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --pidfile "$work/redis.pid" --logfile "$work/redis.log" >/dev/null
for _ in $(seq 1 50); do redis-cli -p "$r" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
g=$(free_port) h=$(free_port)
run_hardened rl-smoke-redis "$g" "$h" --network slirp4netns:allow_host_loopback=true \
  -e BACKEND_TYPE=redis -e REDIS_URL="10.0.2.2:$r" -e CACHE_KEY_PREFIX=rl:
wait_200 "http://127.0.0.1:$h/readyz" || fail "/readyz never answered 200 (redis)"
query --server "http://127.0.0.1:$g" --domain edge --repeat 3 api_key=k1 >"$work/q4"
[ "$(grep -c '^overall: OK' "$work/q4")" = 3 ] || fail "redis: $(cat "$work/q4")"
keys=$(redis-cli -p "$r" --scan --pattern 'rl:*' | paste -sd' ' -)
[ -n "$keys" ] || fail "no rl:* key in the host's Redis"
ok "decided on Redis three times: OK; keys in the host's Redis: $keys"

echo "== 3. podman kube play of deploy/kubernetes/base with this image"
"$KUBECTL" kustomize deploy/kubernetes/base >"$work/base.yaml"
# The image pinned to the built one (as an `images:` entry would), the rest as rendered but for
# what podman 4.3's kube play does differently from a cluster: it publishes every containerPort
# on the host (0.0.0.0) and starts `replicas` pods there, so the smoke runs one replica and gives
# each port a free loopback hostPort (the only way in, as in part 1).
g=$(free_port) h=$(free_port) m=$(free_port)
python3 - "$work/base.yaml" "$work/kube.yaml" "$IMAGE" "$g" "$h" "$m" <<'EOF'
import sys, yaml
src, dst, image, grpc, admin, metrics = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(src)) if d]
host = {"grpc": int(grpc), "admin": int(admin), "metrics": int(metrics)}
for d in docs:
    if d["kind"] == "Deployment":
        d["spec"]["replicas"] = 1
        for c in d["spec"]["template"]["spec"]["containers"]:
            c["image"] = image
            for p in c.get("ports", []):
                p["hostIP"], p["hostPort"] = "127.0.0.1", host[p["name"]]
yaml.safe_dump_all(docs, open(dst, "w"), sort_keys=False)
EOF
grep -q "image: $IMAGE" "$work/kube.yaml" || fail "no image line in the render"
podman kube play "$work/kube.yaml" >"$work/play.log" 2>&1 || { cat "$work/play.log" >&2; fail "kube play"; }
wait_200 "http://127.0.0.1:$h/readyz" || { podman ps -a >&2; fail "the pod's /readyz never answered 200"; }
played() { podman ps --format '{{.ID}} {{.Names}}' | awk '/-ratelimit-server$/ {print $1; exit}'; }
first=$(played)
[ -n "$first" ] || fail "no ratelimit-server container from kube play"
pid=$(podman inspect "$first" --format '{{.State.Pid}}')
uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status") capeff=$(awk '/^CapEff:/ {print $2}' "/proc/$pid/status")
[ "$uid" = 65532 ] && [ "$capeff" = 0000000000000000 ] &&
  [ "$(podman inspect "$first" --format '{{.HostConfig.ReadonlyRootfs}}')" = true ] ||
  fail "kube play: uid $uid, CapEff $capeff (the Deployment's securityContext)"
ok "pod up: container $first, the Deployment's securityContext applied (uid 65532, no capabilities, read-only root)"
query --server "http://127.0.0.1:$g" --domain edge --hits 1001 api_key=k3 >"$work/q5"
grep -q '^overall: OVER_LIMIT' "$work/q5" || fail "kube play: $(cat "$work/q5")"
query --server "http://127.0.0.1:$g" --domain edge --repeat 4 api_key=k4 >"$work/q6"
[ "$(grep -c '^overall: OK' "$work/q6")" = 4 ] || fail "kube play: $(cat "$work/q6")"
ok "the ConfigMap's rules decide: api_key=k4 4 x OK, api_key=k3 1001 hits OVER_LIMIT (1000 per minute)"
# A changed ConfigMap: api_key now 3 per hour. `kube play --replace` recreates the pod with it.
python3 - "$work/kube.yaml" <<'EOF'
import sys, yaml
path = sys.argv[1]
docs = [d for d in yaml.safe_load_all(open(path)) if d]
old = "      unit: minute\n      requests_per_unit: 1000\n"
rules = [d for d in docs if d["kind"] == "ConfigMap"][0]["data"]
assert rules["edge.yaml"].count(old) == 1, "the api_key limit of the ConfigMap"
rules["edge.yaml"] = rules["edge.yaml"].replace(old, "      unit: hour\n      requests_per_unit: 3\n")
yaml.safe_dump_all(docs, open(path, "w"), sort_keys=False)
EOF
podman kube play --replace "$work/kube.yaml" >"$work/play.log" 2>&1 || { cat "$work/play.log" >&2; fail "kube play --replace"; }
wait_200 "http://127.0.0.1:$h/readyz" || fail "the replaced pod's /readyz never answered 200"
second=$(played)
[ -n "$second" ] && [ "$second" != "$first" ] || fail "kube play --replace kept container $first"
query --server "http://127.0.0.1:$g" --domain edge --repeat 4 api_key=k4 >"$work/q7"
[ "$(grep -c '^overall: OK' "$work/q7")" = 3 ] && [ "$(grep -c '^overall: OVER_LIMIT' "$work/q7")" = 1 ] ||
  fail "changed ConfigMap: $(cat "$work/q7")"
ok "changed ConfigMap (api_key 3 per hour) after kube play --replace: new container $second, api_key=k4 OK, OK, OK, OVER_LIMIT"
echo "container smoke: all checks passed"
