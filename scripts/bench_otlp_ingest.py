"""OTLP/gRPC against OTLP/HTTP ingest into `attest-engine collect`, in spans per second.

usage: python scripts/bench_otlp_ingest.py ENGINE_BIN [ROUNDS]

Run with the collector tests' venv (target/collect-venv: opentelemetry-proto,
grpcio). Each round starts a fresh collector serving both protocols, sends the
same pre-encoded batches (50 requests of 100 three-span agent traces, 15,000
spans) from 4 client threads over one protocol (refusals retried after 20 ms, as
exporters retry), and times from the first send
until `attest_collect_spans_received_total` counts every span; then the same
over the other protocol. Protocols alternate first place from round to round.
No rule matches, so the figure is receive + decode + assemble + convert:
ingest, not evaluation. Prints one line per run and the medians.
"""

import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

ENGINE = sys.argv[1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
REQUESTS, TRACES_PER_REQUEST, THREADS = 50, 100, 4
RULES = "rules:\n  - name: none\n    match: {agent_id: no-such-agent}\n    assertions:\n      - {assertion_id: a, type: trace, spec: {check: required_tools, tools: [x]}}\n"


def kv(key, value):
    return KeyValue(key=key, value=AnyValue(string_value=value))


def batch(rng):
    spans = []
    now = time.time_ns()
    for _ in range(TRACES_PER_REQUEST):
        trace_id = rng.randbytes(16)
        root, llm, tool = rng.randbytes(8), rng.randbytes(8), rng.randbytes(8)
        spans.append(Span(trace_id=trace_id, span_id=root, name="invoke_agent refund-agent", start_time_unix_nano=now, end_time_unix_nano=now + 9_000_000,
                          attributes=[kv("gen_ai.operation.name", "invoke_agent"), kv("gen_ai.agent.name", "refund-agent")]))
        spans.append(Span(trace_id=trace_id, span_id=llm, parent_span_id=root, name="chat gpt-4o-mini", start_time_unix_nano=now + 1_000_000, end_time_unix_nano=now + 4_000_000,
                          attributes=[kv("gen_ai.operation.name", "chat"), kv("gen_ai.request.model", "gpt-4o-mini"),
                                      kv("gen_ai.input.messages", '[{"role":"user","parts":[{"type":"text","content":"Where is my order ORD-7?"}]}]')]))
        spans.append(Span(trace_id=trace_id, span_id=tool, parent_span_id=root, name="execute_tool lookup_order", start_time_unix_nano=now + 5_000_000, end_time_unix_nano=now + 6_000_000,
                          attributes=[kv("gen_ai.operation.name", "execute_tool"), kv("gen_ai.tool.name", "lookup_order"),
                                      kv("gen_ai.tool.call.arguments", '{"order_id":"ORD-7"}'), kv("gen_ai.tool.call.result", '{"status":"delivered"}')]))
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(resource=Resource(attributes=[kv("service.name", "bench")]),
                                                                      scope_spans=[ScopeSpans(scope=InstrumentationScope(name="bench"), spans=spans)])])
    return request.SerializeToString(), len(spans)


def start_collector(workdir):
    rules = os.path.join(workdir, "rules.yaml")
    with open(rules, "w") as f:
        f.write(RULES)
    proc = subprocess.Popen(
        [ENGINE, "--log-level=info", "collect", "--rules", rules, "--otlp-http", "127.0.0.1:0", "--otlp-grpc", "127.0.0.1:0",
         "--settle-ms", "200", "--max-open-traces", "100000", "--queue-capacity", "100000"],
        stderr=subprocess.PIPE, text=True, env=dict(os.environ, ATTEST_CACHE_DIR=os.path.join(workdir, "cache")),
    )
    http_addr = grpc_addr = None
    while http_addr is None or grpc_addr is None:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit(f"the collector exited: {proc.wait()}")
        try:
            logged = json.loads(line)
        except ValueError:
            continue
        if logged.get("msg", "").startswith("listening for OTLP/HTTP"):
            http_addr = logged["url"].removeprefix("http://").split("/")[0]
        if logged.get("msg", "").startswith("listening for OTLP/gRPC"):
            grpc_addr = logged["address"]
    threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
    return proc, http_addr, grpc_addr


def received(http_addr):
    c = http.client.HTTPConnection(http_addr, timeout=5)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    m = re.search(r"^attest_collect_spans_received_total (\d+)", text, re.M)
    return int(m.group(1)) if m else 0


def send_http(addr, bodies):
    c = http.client.HTTPConnection(addr, timeout=30)
    for body in bodies:
        # Refusals (429, 503) are retried, as exporters do.
        while True:
            c.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
            r = c.getresponse()
            r.read()
            if r.status == 200:
                break
            assert r.status in (429, 503), r.status
            time.sleep(0.02)


def send_grpc(addr, bodies):
    channel = grpc.insecure_channel(addr)
    export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                 request_serializer=lambda b: b, response_deserializer=lambda b: b)
    for body in bodies:
        while True:
            try:
                export(body, timeout=30)
                break
            except grpc.RpcError as e:
                assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED), e
                time.sleep(0.02)
    channel.close()


def run(protocol, bodies, total):
    with tempfile.TemporaryDirectory() as workdir:
        proc, http_addr, grpc_addr = start_collector(workdir)
        try:
            send, addr = (send_http, http_addr) if protocol == "http" else (send_grpc, grpc_addr)
            shares = [bodies[i::THREADS] for i in range(THREADS)]
            start = time.perf_counter()
            threads = [threading.Thread(target=send, args=(addr, share)) for share in shares]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            while received(http_addr) < total:
                time.sleep(0.005)
            return total / (time.perf_counter() - start)
        finally:
            proc.terminate()
            proc.wait()


def main():
    rng = random.Random(7)
    made = [batch(rng) for _ in range(REQUESTS)]
    bodies = [b for b, _ in made]
    total = sum(n for _, n in made)
    rates = {"http": [], "grpc": []}
    for r in range(ROUNDS):
        order = ["http", "grpc"] if r % 2 == 0 else ["grpc", "http"]
        for protocol in order:
            rate = run(protocol, bodies, total)
            rates[protocol].append(rate)
            print(f"round {r + 1} {protocol:4}: {rate:,.0f} spans/s")
    h, g = statistics.median(rates["http"]), statistics.median(rates["grpc"])
    print(f"median OTLP/HTTP: {h:,.0f} spans/s; OTLP/gRPC: {g:,.0f} spans/s; gRPC/HTTP {g / h:.2f}")


if __name__ == "__main__":
    main()
