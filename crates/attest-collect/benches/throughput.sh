#!/usr/bin/env bash
# Throughput of continuous evaluation with the test harness binary (tool-name
# evaluator, 3 assertions per trace), release build:
#   - embedded: `collect --jsonl` evaluating N traces in process;
#   - NATS: `collect --jsonl --nats` publishing N traces, 1 then 2 workers,
#     measured until the results sink has written every result.
# usage: [WORKER_CONCURRENCY=8] crates/attest-collect/benches/throughput.sh [N]   (needs nats-server)
set -euo pipefail
cd "$(dirname "$0")/../../.."
n=${1:-20000}
concurrency=${WORKER_CONCURRENCY:-8}
cargo build --release -p attest-collect --bin attest-collect-testbin --locked -q
bin="$PWD/target/release/attest-collect-testbin"
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cat > "$work/rules.yaml" <<'RULES'
rules:
  - name: refund-tools
    match: {agent_id: refund-agent}
    assertions:
      - {assertion_id: uses-lookup, type: trace, spec: {check: required_tools, tools: [lookup_order]}}
      - {assertion_id: says-refund, type: content, spec: {check: contains, value: refund}}
      - {assertion_id: escalates, type: trace, spec: {check: required_tools, tools: [escalate]}}
RULES
python3 - "$n" > "$work/traces.jsonl" <<'PY'
import json, sys
for i in range(int(sys.argv[1])):
    print(json.dumps({"schema_version": 1, "trace_id": f"trc_{i:08d}", "agent_id": "refund-agent",
        "input": {"user_message": "Where is my order?"},
        "steps": [{"type": "llm_call", "name": "chat", "args": {"model": "m"}, "result": {"completion": "looking"}},
                  {"type": "tool_call", "name": "lookup_order", "args": {"order_id": i}, "result": {"status": "delivered"}},
                  {"type": "llm_call", "name": "chat", "args": {"model": "m"}, "result": {"completion": "refund sent"}}],
        "output": {"message": "refund sent"}}))
PY
now() { date +%s.%N; }
rate() { python3 -c "print(f'{$1/($3-$2):.0f}')"; }

t0=$(now)
"$bin" collect --rules "$work/rules.yaml" --jsonl "$work/traces.jsonl" --results-jsonl "$work/embedded.jsonl" 2>/dev/null
t1=$(now)
echo "embedded: $n traces in $(python3 -c "print(f'{$t1-$t0:.2f}')") s = $(rate "$n" "$t0" "$t1") traces/s"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
for workers in 1 2; do
  rm -rf "$work/js" "$work/nats.jsonl"
  nats-server -js -a 127.0.0.1 -p "$port" -sd "$work/js" 2>"$work/nats.log" & nats_pid=$!
  until grep -q "Server is ready" "$work/nats.log"; do sleep 0.1; done
  url="nats://127.0.0.1:$port"
  "$bin" worker --role sink --nats "$url" --results-jsonl "$work/nats.jsonl" 2>/dev/null & pids=($!)
  for _ in $(seq "$workers"); do
    "$bin" worker --rules "$work/rules.yaml" --nats "$url" --concurrency "$concurrency" 2>/dev/null & pids+=($!)
  done
  sleep 1
  t0=$(now)
  "$bin" collect --rules "$work/rules.yaml" --jsonl "$work/traces.jsonl" --nats "$url" 2>/dev/null
  t1=$(now)
  until [ "$(wc -l < "$work/nats.jsonl" 2>/dev/null || echo 0)" -ge $((n * 3)) ]; do sleep 0.1; done
  t2=$(now)
  echo "nats, $workers worker(s): published $n in $(python3 -c "print(f'{$t1-$t0:.2f}')") s; all results stored after $(python3 -c "print(f'{$t2-$t0:.2f}')") s = $(rate "$n" "$t0" "$t2") traces/s end to end"
  kill -TERM "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
  kill -TERM "$nats_pid"; wait "$nats_pid" 2>/dev/null || true
done
