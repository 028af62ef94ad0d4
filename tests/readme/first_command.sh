#!/usr/bin/env bash
# Runs the README's first command as a newcomer would: the first line of the
# first ```sh block of README.md, from the repository root, exactly as
# written. Only the environment keeps it hermetic: SWITCHYARD_LISTEN asks for
# an ephemeral port and SWITCHYARD_DATABASE_URL a temporary SQLite file, so a
# developer's ./switchyard.db and a busy port 50051 are left alone. It waits
# for gRPC health to answer SERVING (grpcurl from the project venv), then
# stops the server with SIGINT and expects a clean exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PATH="$root/.venv/bin:$PATH"

first=$(awk '/^```sh$/ {inside = 1; next} inside {print; exit}' README.md | sed 's/[[:space:]]*#.*$//')
[[ "$first" == cargo\ run* ]] || { echo "first command: README.md does not start with a cargo run line: $first" >&2; exit 1; }

work=$(mktemp -d)
cleanup() {
  if [[ -n "${pid:-}" ]] && kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "first command: $first"
SWITCHYARD_LISTEN=127.0.0.1:0 SWITCHYARD_DATABASE_URL="sqlite://$work/switchyard.db" \
  setsid bash -c "exec $first" >"$work/stdout" 2>"$work/stderr" &
pid=$!
addr=""
# A cold `cargo run` may have to build first: wait for the address line (the
# server prints it once it listens) as long as cargo is alive, up to 10 min.
for _ in $(seq 1 6000); do
  addr=$(sed -n 's/^switchyard-server listening on //p' "$work/stdout")
  [[ -n "$addr" ]] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/stderr" >&2; echo "first command: exited before listening" >&2; exit 1; }
  sleep 0.1
done
[[ -n "$addr" ]] || { cat "$work/stderr" >&2; echo "first command: never listened" >&2; exit 1; }

health=""
for _ in $(seq 1 100); do
  health=$(grpcurl -plaintext -d '{}' "$addr" grpc.health.v1.Health/Check 2>/dev/null || true)
  [[ "$health" == *'"SERVING"'* ]] && break
  sleep 0.1
done
[[ "$health" == *'"SERVING"'* ]] || { cat "$work/stderr" >&2; echo "first command: health never SERVING: $health" >&2; exit 1; }

kill -INT -- "-$pid"
status=0
wait "$pid" || status=$?
[[ "$status" == 0 ]] || { cat "$work/stderr" >&2; echo "first command: exited with $status after SIGINT" >&2; exit 1; }
pid=""
echo "first command: listened on $addr, health SERVING, stopped cleanly"
