"""An OTLP logs receiver built on the opentelemetry-proto package: OTLP/HTTP
(POST /v1/logs, protobuf) and OTLP/gRPC (LogsService/Export), as a backend
that joins logs to traces would take `--export-otlp`'s events.

usage: otlp_logs_receiver.py OUT.jsonl

Prints `http PORT grpc PORT` once both listen, then writes every log record
it receives as a JSON line: event name, trace and span ids (hex),
attributes, and the resource's attributes.
"""

import json
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc

OUT = open(sys.argv[1], "a", buffering=1)
LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def store(request, transport):
    with LOCK:
        for rl in request.resource_logs:
            resource = {a.key: value(a.value) for a in rl.resource.attributes}
            for sl in rl.scope_logs:
                for r in sl.log_records:
                    OUT.write(json.dumps({
                        "transport": transport,
                        "event_name": r.event_name,
                        "trace_id": r.trace_id.hex(),
                        "span_id": r.span_id.hex(),
                        "severity_number": r.severity_number,
                        "time_unix_nano": r.time_unix_nano,
                        "scope": sl.scope.name,
                        "attributes": {a.key: value(a.value) for a in r.attributes},
                        "resource": resource,
                    }) + "\n")


class Http(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/v1/logs" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(404)
            self.end_headers()
            return
        request = logs_service_pb2.ExportLogsServiceRequest()
        request.ParseFromString(body)
        store(request, "http")
        answer = logs_service_pb2.ExportLogsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


class Logs(logs_service_pb2_grpc.LogsServiceServicer):
    def Export(self, request, context):
        store(request, "grpc")
        return logs_service_pb2.ExportLogsServiceResponse()


http = ThreadingHTTPServer(("127.0.0.1", 0), Http)
threading.Thread(target=http.serve_forever, daemon=True).start()
server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
grpc_port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(f"http {http.server_address[1]} grpc {grpc_port}", flush=True)
server.wait_for_termination()
