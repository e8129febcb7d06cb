"""An application with no OpenTelemetry code of its own, for
`opentelemetry-instrument` (zero-code instrumentation) with its default
settings: OTLP over gRPC, traces, metrics and logs exporters all on. The
`openai` client talks to the scripted fake LLM server (fake_llm.py).

usage: opentelemetry-instrument python zero_code.py
"""

import fake_llm
import openai

server, base_url = fake_llm.start()
fake_llm.script("zero", [{"call": "lookup_order", "args": {"order_id": "ORD-7"}}, {"say": "Your refund is processed."}])
client = openai.OpenAI(base_url=base_url, api_key="test-key")
messages = [{"role": "user", "content": "Please refund order ORD-7. [run zero]"}]
first = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
call = first.choices[0].message.tool_calls[0]
messages.append({"role": "assistant", "tool_calls": [call.model_dump()]})
messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"status": "delivered"}'})
client.chat.completions.create(model="gpt-4o-mini", messages=messages)
server.shutdown()
