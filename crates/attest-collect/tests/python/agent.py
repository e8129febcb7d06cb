"""A small tool-using agent, traced by a real OpenTelemetry pipeline.

The `openai` client talks to a fake OpenAI-compatible server on loopback
(stdlib http.server); the instrumentation library under test wraps the client
and the OpenTelemetry SDK exports spans with the OTLP/HTTP protobuf exporter.
The agent and tool spans are written the way agent frameworks write them,
with the convention's own attribute names.

usage: agent.py {genai|openinference} OTLP_ENDPOINT RUNS [console]

AGENT_OTLP_PROTOCOL=grpc exports with the OTLP/gRPC exporters (ENDPOINT is
then host:port) instead of OTLP/HTTP. With AGENT_LOG_EVENTS=1 the GenAI
instrumentation also gets a logger provider exporting OTLP logs, for its
message content sent as log events
(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=event_only).
"""

import os

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONVENTION, ENDPOINT, RUNS = sys.argv[1], sys.argv[2], int(sys.argv[3])
CONSOLE = len(sys.argv) > 4 and sys.argv[4] == "console"


class FakeOpenAI(BaseHTTPRequestHandler):
    """Answers chat completions: first a tool call, then a final answer."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        has_tool_result = any(m.get("role") == "tool" for m in body["messages"])
        if has_tool_result:
            message = {"role": "assistant", "content": "Your order ORD-7 was delivered; refund sent."}
            finish = "stop"
        else:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": json.dumps({"order_id": "ORD-7"})},
                    }
                ],
            }
            finish = "tool_calls"
        answer = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52},
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
threading.Thread(target=server.serve_forever, daemon=True).start()

from opentelemetry import trace  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor  # noqa: E402

GRPC = os.environ.get("AGENT_OTLP_PROTOCOL") == "grpc"
resource = Resource.create({"service.name": "refund-service", "deployment.environment": "test"})
provider = TracerProvider(resource=resource)
if CONSOLE:
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
elif GRPC:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

    provider.add_span_processor(BatchSpanProcessor(GrpcSpanExporter(endpoint=ENDPOINT, insecure=True)))
else:
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=ENDPOINT + "/v1/traces")))
trace.set_tracer_provider(provider)
logger_provider = None
if os.environ.get("AGENT_LOG_EVENTS") == "1":
    from opentelemetry._logs import set_logger_provider
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

    if GRPC:
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

        log_exporter = OTLPLogExporter(endpoint=ENDPOINT, insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

        log_exporter = OTLPLogExporter(endpoint=ENDPOINT + "/v1/logs")
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
    set_logger_provider(logger_provider)
tracer = trace.get_tracer("refund-agent")

if CONVENTION == "genai":
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=provider, logger_provider=logger_provider)
else:
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes

    OpenAIInstrumentor().instrument(tracer_provider=provider)

import openai  # noqa: E402

client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key="test-key")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Look up an order",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    }
]


def lookup_order(order_id):
    return {"order_id": order_id, "status": "delivered"}


def run_tool(call):
    args = call.function.arguments
    if CONVENTION == "genai":
        with tracer.start_as_current_span("execute_tool lookup_order") as span:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", call.function.name)
            span.set_attribute("gen_ai.tool.call.id", call.id)
            span.set_attribute("gen_ai.tool.call.arguments", args)
            result = lookup_order(**json.loads(args))
            span.set_attribute("gen_ai.tool.call.result", json.dumps(result))
    else:
        with tracer.start_as_current_span("lookup_order") as span:
            span.set_attribute(SpanAttributes.OPENINFERENCE_SPAN_KIND, OpenInferenceSpanKindValues.TOOL.value)
            span.set_attribute(SpanAttributes.TOOL_NAME, call.function.name)
            span.set_attribute(SpanAttributes.INPUT_VALUE, args)
            result = lookup_order(**json.loads(args))
            span.set_attribute(SpanAttributes.OUTPUT_VALUE, json.dumps(result))
    return result


def agent(question):
    # OpenInference records a message sent as parts (a content array) as
    # message.contents.{k}; the GenAI run sends plain text.
    if CONVENTION == "genai":
        messages = [{"role": "user", "content": question}]
    else:
        messages = [{"role": "user", "content": [{"type": "text", "text": question}]}]
    first = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    result = run_tool(call)
    messages.append({"role": "assistant", "tool_calls": [call.model_dump()]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    second = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    return second.choices[0].message.content


for i in range(RUNS):
    question = f"Where is my order ORD-7? (run {i})"
    if CONVENTION == "genai":
        with tracer.start_as_current_span("invoke_agent refund-agent") as span:
            span.set_attribute("gen_ai.operation.name", "invoke_agent")
            span.set_attribute("gen_ai.agent.name", "refund-agent")
            span.set_attribute("gen_ai.provider.name", "openai")
            span.set_attribute("gen_ai.input.messages", json.dumps([{"role": "user", "parts": [{"type": "text", "content": question}]}]))
            answer = agent(question)
            span.set_attribute("gen_ai.output.messages", json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": answer}], "finish_reason": "stop"}]))
    else:
        with tracer.start_as_current_span("refund-agent") as span:
            span.set_attribute(SpanAttributes.OPENINFERENCE_SPAN_KIND, OpenInferenceSpanKindValues.AGENT.value)
            span.set_attribute("agent.name", "refund-agent")
            span.set_attribute(SpanAttributes.INPUT_VALUE, question)
            answer = agent(question)
            span.set_attribute(SpanAttributes.OUTPUT_VALUE, answer)

if logger_provider is not None:
    logger_provider.shutdown()
provider.shutdown()
server.shutdown()
