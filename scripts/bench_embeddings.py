#!/usr/bin/env python3
"""Local embeddings per second through the engine, whole process.

Four evaluate_batch requests of N `embedding` assertions, each reference a distinct
60-word text, against one output; timed from the first request to the last answer.
Point ATTEST_EMBEDDING_MODEL_DIR at the all-MiniLM-L6-v2 files and ATTEST_CACHE_DIR at a
fresh directory (a warm provider cache would answer from disk).

    python3 scripts/bench_embeddings.py target/release/attest-engine 32
"""
import json, subprocess, sys, time, os
engine = sys.argv[1]; n = int(sys.argv[2])
words = "the refund for order was processed and the customer will receive the money within five business days according to policy".split()
def text(i):
    return " ".join(words[(i + k) % len(words)] + str(i % 7) for k in range(60))
trace = {"schema_version": 1, "trace_id": "t", "agent_id": "a", "steps": [], "output": {"message": text(9999)}}
reqs = [{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"sdk_name": "bench", "sdk_version": "0.9.0", "protocol_version": 1, "required_capabilities": []}}]
for r in range(4):
    assertions = [{"assertion_id": f"e{r}_{i}", "type": "embedding", "spec": {"reference": text(r * 1000 + i), "threshold": 0.1}} for i in range(n)]
    reqs.append({"jsonrpc": "2.0", "id": r + 1, "method": "evaluate_batch", "params": {"trace": trace, "assertions": assertions}})
env = dict(os.environ)
p = subprocess.Popen([engine, "--log-level=warn", "--no-history"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
p.stdin.write((json.dumps(reqs[0]) + "\n").encode()); p.stdin.flush(); p.stdout.readline()
# warm the model
t0 = time.perf_counter()
for r in reqs[1:]:
    p.stdin.write((json.dumps(r) + "\n").encode()); p.stdin.flush()
    line = json.loads(p.stdout.readline())
    assert "result" in line, str(line)[:300]
dt = time.perf_counter() - t0
p.stdin.close(); p.wait()
print(f"{4*n} texts in {dt:.2f}s = {4*n/dt:.1f} texts/s")
