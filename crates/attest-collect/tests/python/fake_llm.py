"""A scripted OpenAI-compatible server on loopback, for the framework tests.

It speaks the two APIs agent frameworks call, each plain and streamed:
chat completions (`/v1/chat/completions`) and the Responses API
(`/v1/responses`). What it answers is scripted per run: the run's tag (a
`[run …]` marker in the user's message) picks the script, and the number of
tool results already in the conversation picks the turn. A turn is either a
tool call `{"call": name, "args": {...}}` or a final answer `{"say": text}`.
Every answer reports 40 prompt and 12 completion tokens, so the truth of a run
is known before it starts.
"""

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROMPT_TOKENS = 40
COMPLETION_TOKENS = 12

SCRIPTS = {}
TAG = re.compile(r"\[run ([A-Za-z0-9_.-]+)\]")
_lock = threading.Lock()
CALLS = {}


def script(tag, turns):
    SCRIPTS[tag] = turns


def _texts(value):
    """Every string inside a request body, to find the run's tag."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _texts(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _texts(v)


def _turn(body, tool_results):
    tag = None
    for text in _texts(body.get("messages") or body.get("input") or []):
        m = TAG.search(text)
        if m:
            tag = m.group(1)
            break
    turns = SCRIPTS.get(tag) or [{"say": "no script for this run"}]
    with _lock:
        CALLS[tag] = CALLS.get(tag, 0) + 1
    return turns[min(tool_results, len(turns) - 1)], tag, tool_results


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.endswith("/chat/completions"):
            results = sum(1 for m in body["messages"] if m.get("role") == "tool")
            turn, tag, n = _turn(body, results)
            if body.get("stream"):
                self._sse([f"data: {json.dumps(c)}\n\n" for c in chat_chunks(body, turn, tag, n)] + ["data: [DONE]\n\n"])
            else:
                self._json(chat_answer(body, turn, tag, n))
        elif self.path.endswith("/responses"):
            items = body["input"] if isinstance(body["input"], list) else []
            results = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output")
            turn, tag, n = _turn(body, results)
            response = responses_answer(body, turn, tag, n)
            if body.get("stream"):
                self._sse(responses_events(response))
            else:
                self._json(response)
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def _json(self, answer):
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, events):
        data = "".join(events).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _usage():
    return {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS, "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS}


def _call_id(tag, n):
    return f"call_{tag}_{n}".replace(".", "_")


def chat_answer(body, turn, tag, n):
    if "call" in turn:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": _call_id(tag, n), "type": "function", "function": {"name": turn["call"], "arguments": json.dumps(turn["args"])}}
            ],
        }
        finish = "tool_calls"
    else:
        message = {"role": "assistant", "content": turn["say"]}
        finish = "stop"
    return {
        "id": f"chatcmpl-{tag}-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": _usage(),
    }


def chat_chunks(body, turn, tag, n):
    base = {"id": f"chatcmpl-{tag}-{n}", "object": "chat.completion.chunk", "created": int(time.time()), "model": body["model"]}
    if "call" in turn:
        delta = {
            "role": "assistant",
            "tool_calls": [
                {"index": 0, "id": _call_id(tag, n), "type": "function", "function": {"name": turn["call"], "arguments": json.dumps(turn["args"])}}
            ],
        }
        finish = "tool_calls"
        chunks = [dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": None}])]
    else:
        text = turn["say"]
        half = len(text) // 2
        chunks = [
            dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": text[:half]}, "finish_reason": None}]),
            dict(base, choices=[{"index": 0, "delta": {"content": text[half:]}, "finish_reason": None}]),
        ]
        finish = "stop"
    chunks.append(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": finish}]))
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append(dict(base, choices=[], usage=_usage()))
    return chunks


def responses_answer(body, turn, tag, n):
    if "call" in turn:
        item = {
            "type": "function_call",
            "id": f"fc_{tag}_{n}",
            "call_id": _call_id(tag, n),
            "name": turn["call"],
            "arguments": json.dumps(turn["args"]),
            "status": "completed",
        }
    else:
        item = {
            "type": "message",
            "id": f"msg_{tag}_{n}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": turn["say"], "annotations": []}],
        }
    return {
        "id": f"resp_{tag}_{n}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": body["model"],
        "output": [item],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": PROMPT_TOKENS,
            "output_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def responses_events(response):
    seq = iter(range(1000))
    pending = dict(response, status="in_progress", output=[], usage=None)
    events = [{"type": "response.created", "response": pending}]
    for i, item in enumerate(response["output"]):
        events.append({"type": "response.output_item.added", "output_index": i, "item": dict(item, status="in_progress")})
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append(
                {"type": "response.output_text.delta", "item_id": item["id"], "output_index": i, "content_index": 0, "delta": text, "logprobs": []}
            )
        events.append({"type": "response.output_item.done", "output_index": i, "item": item})
    events.append({"type": "response.completed", "response": response})
    out = []
    for e in events:
        e["sequence_number"] = next(seq)
        out.append(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n")
    return out


def start():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/v1"
