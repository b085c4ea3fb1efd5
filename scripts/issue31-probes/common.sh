# Shared by issue 31's probes (findings 3, 6, 9): free ports, start/stop the server, its RSS.
# shellcheck shell=bash
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rss_mb() { awk '/VmRSS/{printf "%d", $2/1024}' "/proc/$1/status" 2>/dev/null; }
hwm_mb() { awk '/VmHWM/{printf "%d", $2/1024}' "/proc/$1/status" 2>/dev/null; }
ms() { date +%s%3N; }
# start BIN LOG CONFIG_DIR [NAME=value...]: serves on free ports in the background; sets PID,
# GRPC and HTTP.
start() {
  local bin=$1 log=$2 dir=$3; shift 3
  GRPC=$(free_port); HTTP=$(free_port)
  # Address space capped (MEM_CAP_MB, default 3000) so a "before" run cannot take the machine.
  ( ulimit -v $(( ${MEM_CAP_MB:-3000} * 1024 ))
    exec env SHUTDOWN_DELAY=0s LOG_LEVEL=info "$@" "$bin" serve --config "$dir" \
      --grpc-addr "127.0.0.1:$GRPC" --http-addr "127.0.0.1:$HTTP" ) >"$log" 2>&1 &
  PID=$!
}
# wait_healthy: until /healthcheck answers 200 (at most 120 s).
wait_healthy() {
  for _ in $(seq 1200); do
    curl -sf -m 1 "127.0.0.1:$HTTP/healthcheck" >/dev/null && return 0
    kill -0 "$PID" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
stop() { kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; }
