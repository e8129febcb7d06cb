"""A refund-desk agent that speaks ECP over stdio with the standard library
only, so `attest-engine ecp run` can be tried without installing anything.
Real agents use an ECP SDK (`pip install ecp-sdk`, see docs/ecp.md).

It reads one JSON-RPC request per line and answers agent/initialize,
agent/step and agent/reset; stdout carries protocol messages only."""
import json
import re
import sys

history = []


def step(text):
    history.append(text)
    order = re.search(r"ORD-\d+", text)
    if "refund" in text.lower() and order:
        calls = [
            {"name": "lookup_order", "arguments": {"order_id": order.group(0)}},
            {"name": "process_refund", "arguments": {"order_id": order.group(0), "amount": 89.99}},
        ]
        reply = f"Your refund for {order.group(0)} of $89.99 has been processed."
    else:
        calls = []
        reply = "I can help with refunds: tell me your order number (ORD-...)."
    return {
        "status": "done",
        "public_output": reply,
        "evaluation_context": f"Turn {len(history)}: {len(calls)} tool call(s).",
        "tool_calls": calls,
    }


def answer(request):
    method, params = request.get("method"), request.get("params") or {}
    if method == "agent/initialize":
        return {"name": "RefundDesk", "protocol_version": "1.0", "capabilities": {"tool_calls": {}, "evaluation_context": {}, "reset": {}}}
    if method == "agent/step":
        return step(str(params.get("input", "")))
    if method == "agent/reset":
        history.clear()
        return True
    raise LookupError(method)


for line in sys.stdin:
    if not line.strip():
        continue
    request = json.loads(line)
    try:
        reply = {"jsonrpc": "2.0", "id": request.get("id"), "result": answer(request)}
    except LookupError as e:
        reply = {"jsonrpc": "2.0", "id": request.get("id"), "error": {"code": -32601, "message": f"method not found: {e}"}}
    if "id" in request:
        print(json.dumps(reply), flush=True)
