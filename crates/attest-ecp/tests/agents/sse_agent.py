"""A Streamable HTTP agent that answers every request as a server-sent event
stream (the SDK's server answers with plain JSON), to exercise the runtime's
SSE handling. Protocol-level on purpose: standard library only.

Usage: sse_agent.py PORT
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path != "/ecp":
            self.send_response(404)
            self.end_headers()
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        if "id" not in body:
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        method = body.get("method")
        if method == "agent/initialize":
            result = {"name": "SseAgent", "protocol_version": "1.0", "capabilities": {"reset": {}}}
        elif method == "agent/step":
            text = body["params"]["input"]
            result = {"status": "done", "public_output": f"SSE echo: {text}", "tool_calls": [{"name": "stream", "arguments": {"n": 1}}]}
        elif method == "agent/reset":
            result = True
        else:
            result = None
        progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 0.5}}
        response = {"jsonrpc": "2.0", "id": body["id"], "result": result}
        payload = f"event: message\ndata: {json.dumps(progress)}\n\nevent: message\ndata: {json.dumps(response)}\n\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        self.send_response(405)
        self.send_header("Allow", "POST")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
