#!/usr/bin/env python3
"""Peak RSS of attest-engine under the worst legal request mixes.

Usage: python3 scripts/bench_rss.py [--engine PATH] [--mix NAME ...]

Each mix starts a fresh engine (`--no-history`), sends its requests with
many in flight, reads every answer, and reports the process's VmHWM (peak
resident set) from /proc. Mixes:

  regexes   1,500 distinct large regex_match assertions (one per request)
  accepted  576 requests with a 270 KB trace and two accepted patterns
            that defeat the lazy DFA, new ones every 48 requests: 384 as
            regex_match, then 192 as schema `pattern`s
  combined  the compiled cache filled with such patterns, then 14 waves of
            63 regex requests on 270 KB traces and one 6.8 MB request of
            3.4 million zeros, all in flight together
  parse     16 requests of 9.5 MiB, each an array of 5 million zeros
  submits   2,000 submit_plugin_result calls carrying 16 KiB of metadata
            (the largest accepted), then 100 carrying 5 MiB

Answers are only counted, not checked: the integration tests check them.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time


def spawn(engine):
    return subprocess.Popen(
        [engine, "--log-level=error", "--no-history"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "ATTEST_CACHE_DIR": ""},
    )


def vm_hwm_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run_mix(engine, lines):
    p = spawn(engine)
    init = {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "sdk_name": "bench", "sdk_version": "0", "protocol_version": 1,
        "required_capabilities": ["layers_1_4"], "preferred_encoding": "json"}}
    p.stdin.write((json.dumps(init) + "\n").encode())
    p.stdin.flush()
    p.stdout.readline()
    answers = [0]

    def reader():
        for _ in p.stdout:
            answers[0] += 1

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t0 = time.time()
    for line in lines():
        p.stdin.write(line)
    p.stdin.write(b'{"jsonrpc":"2.0","id":"bye","method":"shutdown"}\n')
    p.stdin.flush()
    peak = 0.0
    while p.poll() is None:
        try:
            peak = max(peak, vm_hwm_mib(p.pid))
        except OSError:
            break
        time.sleep(0.05)
    t.join(timeout=5)
    return peak, answers[0], time.time() - t0


TRACE = {"schema_version": 1, "trace_id": "t", "output": {"message": "hello"}, "steps": []}


def regexes():
    for i in range(1500):
        a = [{"assertion_id": "r", "type": "content",
              "spec": {"target": "output.message", "check": "regex_match", "value": "\\w{200}\\d{50}N%d" % i}}]
        yield (json.dumps({"jsonrpc": "2.0", "id": i, "method": "evaluate_batch",
                           "params": {"trace": TRACE, "assertions": a}}) + "\n").encode()


def parse():
    zeros = ",".join(["0"] * 5_000_000)
    trace = ('{"schema_version":1,"trace_id":"z","output":{"message":"m"},"metadata":{"z":[%s]}}' % zeros)
    for i in range(16):
        yield ('{"jsonrpc":"2.0","id":%d,"method":"evaluate_batch","params":{"trace":%s,"assertions":[]}}\n'
               % (i, trace)).encode()


def submits():
    def req(i, blob):
        return (json.dumps({"jsonrpc": "2.0", "id": i, "method": "submit_plugin_result", "params": {
            "trace_id": "t%d" % i, "plugin_name": "p", "assertion_id": "a",
            "result": {"status": "pass", "score": 1.0, "explanation": "ok", "metadata": {"blob": blob}}}}) + "\n").encode()
    small = "x" * (16 * 1024 - 20)
    for i in range(2000):
        yield req(i, small)
    big = "x" * (5 * 1024 * 1024)
    for i in range(100):
        yield req(10_000 + i, big)


def accepted():
    rnd = __import__("random").Random(1)
    message = "".join(rnd.choice("ab") for _ in range(270_000))
    trace = {"schema_version": 1, "trace_id": "t", "output": {"message": message}}
    for i in range(576):
        wave = i // 48
        schema = wave >= 8
        patterns = ["(?-u)[ab]*a[ab]{13}c%d_%d" % (wave, k) for k in range(2)]
        if schema:
            a = [{"assertion_id": "s%d" % k, "type": "schema",
                  "spec": {"target": "output.message", "schema": {"type": "string", "pattern": p}}}
                 for k, p in enumerate(patterns)]
        else:
            a = [{"assertion_id": "r%d" % k, "type": "content",
                  "spec": {"target": "output.message", "check": "regex_match", "value": p}}
                 for k, p in enumerate(patterns)]
        yield (json.dumps({"jsonrpc": "2.0", "id": i, "method": "evaluate_batch",
                           "params": {"trace": trace, "assertions": a}}) + "\n").encode()


def combined():
    rnd = __import__("random").Random(1)

    def message(n):
        return "".join(rnd.choice("ab") for _ in range(n))

    def request(i, trace, patterns):
        a = [{"assertion_id": "r%d" % k, "type": "content",
              "spec": {"target": "output.message", "check": "regex_match", "value": p}}
             for k, p in enumerate(patterns)]
        return (json.dumps({"jsonrpc": "2.0", "id": i, "method": "evaluate_batch",
                            "params": {"trace": trace, "assertions": a}}) + "\n").encode()

    small = {"schema_version": 1, "trace_id": "t", "output": {"message": message(100_000)}}
    for k in range(30):
        yield request("f%d" % k, small, ["(?-u)[ab]*a[ab]{13}c_f%d_%d" % (k, j) for j in range(5)])
    big = {"schema_version": 1, "trace_id": "t", "output": {"message": message(270_000)}}
    zeros = ('{"jsonrpc":"2.0","id":"zeros","method":"evaluate_batch","params":{"trace":'
             '{"schema_version":1,"trace_id":"z","output":{"message":"m","structured":{"z":[%s]}}},'
             '"assertions":[]}}\n' % ",".join(["0"] * 3_400_000)).encode()
    for w in range(14):
        patterns = ["(?-u)[ab]*a[ab]{13}c%d_%d" % (w, j) for j in range(2)]
        for i in range(63):
            if i == 32:
                yield zeros
            yield request("w%d_%d" % (w, i), big, patterns)


MIXES = {"regexes": regexes, "accepted": accepted, "combined": combined, "parse": parse, "submits": submits}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="target/release/attest-engine")
    ap.add_argument("--mix", action="append", choices=sorted(MIXES))
    args = ap.parse_args()
    for name in args.mix or sorted(MIXES):
        peak, n, secs = run_mix(args.engine, MIXES[name])
        print(f"{name:8} peak RSS {peak:8.0f} MiB  answers {n:5d}  {secs:6.1f} s")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
