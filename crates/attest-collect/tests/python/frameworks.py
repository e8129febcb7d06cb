"""Real agent frameworks, instrumented as their own docs say, against the
scripted fake LLM server (fake_llm.py), exporting OTLP to the collector.

usage: frameworks.py FRAMEWORK ENDPOINT [http|grpc|console] [RECORD_PATH]

FRAMEWORK is one of: agents-responses, agents-chat, agents-stream,
agents-chat-stream, agents-workflow, langchain, langgraph, langgraph-custom,
llamaindex. Each runs every variant its framework supports (see VARIANTS)
and prints, per run, one JSON line on stdout: the truth the assembled
Attest trace must match, found by the run's tag in its user message.
With RECORD_PATH, every span is also written there as one OTLP
ExportTraceServiceRequest in protobuf: the golden fixture the collector's
tests read without the framework installed.
"""

import asyncio
import json
import os
import sys

import fake_llm

FRAMEWORK, ENDPOINT = sys.argv[1], sys.argv[2]
PROTOCOL = sys.argv[3] if len(sys.argv) > 3 else "http"
RECORD = sys.argv[4] if len(sys.argv) > 4 else None
RECORDED = []

ORDER = {"order_id": "ORD-7", "status": "delivered", "amount": 25}
REFUND = {"refund_id": "RF-7", "status": "processed"}
ANSWER = "Your refund of $25 for order ORD-7 is processed."

# Each variant: the scripted turns (see fake_llm.py) and the final answer.
VARIANTS = {
    "right": [
        {"call": "lookup_order", "args": {"order_id": "ORD-7"}},
        {"call": "process_refund", "args": {"order_id": "ORD-7", "amount": 25}},
        {"say": ANSWER},
    ],
    "missing_tool": [
        {"call": "lookup_order", "args": {"order_id": "ORD-7"}},
        {"say": ANSWER},
    ],
    "wrong_args": [
        {"call": "lookup_order", "args": {"order_id": "ORD-9"}},
        {"call": "process_refund", "args": {"order_id": "ORD-9", "amount": 25}},
        {"say": ANSWER},
    ],
    "wrong_answer": [
        {"call": "lookup_order", "args": {"order_id": "ORD-7"}},
        {"call": "process_refund", "args": {"order_id": "ORD-7", "amount": 25}},
        {"say": "Sorry, I cannot help with that."},
    ],
}
HANDOFF = [{"call": "transfer_to_refund_agent", "args": {}}] + VARIANTS["right"]


def lookup_order(order_id: str) -> dict:
    """Look up an order by its id."""
    return dict(ORDER, order_id=order_id)


def process_refund(order_id: str, amount: int) -> dict:
    """Refund an order."""
    return dict(REFUND, refund_id="RF-" + order_id.split("-")[-1])


def truth(tag, turns, agent_id, handoff_from=None):
    """What a person reading the run would write down as its Attest trace."""
    tools = []
    for t in turns:
        if "call" in t and not t["call"].startswith("transfer_to_"):
            fn = {"lookup_order": lookup_order, "process_refund": process_refund}[t["call"]]
            tools.append({"name": t["call"], "args": t["args"], "result": fn(**t["args"])})
    return {
        "tag": tag,
        "agent_id": agent_id,
        "handoff_from": handoff_from,
        "input": question(tag),
        "output": turns[-1]["say"],
        "tools": tools,
        "llm_calls": len(turns),
        "tokens": len(turns) * (fake_llm.PROMPT_TOKENS + fake_llm.COMPLETION_TOKENS),
    }


def question(tag):
    return f"Please refund order ORD-7, it arrived broken. [run {tag}]"


def tracer_provider():
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"{FRAMEWORK}-service"}))
    if PROTOCOL == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    elif PROTOCOL == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=ENDPOINT, insecure=True)))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=ENDPOINT + "/v1/traces")))
    if RECORD:
        from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

        class Recorder(SpanExporter):
            def export(self, spans):
                RECORDED.extend(spans)
                return SpanExportResult.SUCCESS

        provider.add_span_processor(SimpleSpanProcessor(Recorder()))
    trace.set_tracer_provider(provider)
    return provider


def write_record():
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    with open(RECORD, "wb") as f:
        f.write(encode_spans(RECORDED).SerializeToString())


# --- OpenAI Agents SDK -------------------------------------------------------


def run_agents(base_url, variant_names):
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, RunConfig, Runner, function_tool
    from openai import AsyncOpenAI
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    provider = tracer_provider()
    OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)
    client = AsyncOpenAI(base_url=base_url, api_key="test-key")
    chat = FRAMEWORK in ("agents-chat", "agents-chat-stream")
    stream = FRAMEWORK in ("agents-stream", "agents-chat-stream")
    model_cls = OpenAIChatCompletionsModel if chat else OpenAIResponsesModel
    model = model_cls(model="gpt-4o-mini", openai_client=client)
    tools = [function_tool(lookup_order), function_tool(process_refund)]
    refund = Agent(name="refund-agent", instructions="You process refunds.", tools=tools, model=model)
    triage = Agent(name="triage-agent", instructions="Route the customer.", handoffs=[refund], model=model)
    run_config = RunConfig(workflow_name="Refund desk") if FRAMEWORK == "agents-workflow" else None

    async def one(agent, tag):
        if stream:
            result = Runner.run_streamed(agent, question(tag), run_config=run_config)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, question(tag), run_config=run_config)
        return result.final_output

    async def all_runs():
        # One event loop for every run: the async client is bound to it.
        out = []
        for name in variant_names:
            tag = f"{FRAMEWORK}-{name}"
            if name == "handoff":
                fake_llm.script(tag, HANDOFF)
                await one(triage, tag)
                out.append(truth(tag, HANDOFF, "refund-agent", handoff_from="triage-agent"))
            else:
                fake_llm.script(tag, VARIANTS[name])
                await one(refund, tag)
                out.append(truth(tag, VARIANTS[name], "refund-agent"))
        return out

    return provider, asyncio.run(all_runs())


# --- LangChain and LangGraph --------------------------------------------------


def run_langchain(base_url, variant_names):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from openinference.instrumentation.langchain import LangChainInstrumentor

    provider = tracer_provider()
    LangChainInstrumentor().instrument(tracer_provider=provider)
    llm = ChatOpenAI(model="gpt-4o-mini", base_url=base_url, api_key="test-key")
    tools = [tool(lookup_order), tool(process_refund)]
    if FRAMEWORK == "langchain":
        from langchain.agents import create_agent

        agent = create_agent(model=llm, tools=tools, system_prompt="You process refunds.", name="refund-agent")
    elif FRAMEWORK == "langgraph":
        from langgraph.prebuilt import create_react_agent

        agent = create_react_agent(llm, tools, prompt="You process refunds.", name="refund-agent")
    else:
        agent = custom_graph(llm, tools)

    out = []
    for name in variant_names:
        tag = f"{FRAMEWORK}-{name}"
        fake_llm.script(tag, VARIANTS[name])
        agent.invoke({"messages": [{"role": "user", "content": question(tag)}]})
        out.append(truth(tag, VARIANTS[name], "refund-agent"))
    return provider, out


def custom_graph(llm, tools):
    """A hand-built LangGraph: a model node and a tool node in a loop."""
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    bound = llm.bind_tools(tools)

    def call_model(state: MessagesState):
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph.compile(name="refund-agent")


# --- LlamaIndex ---------------------------------------------------------------


def run_llamaindex(base_url, variant_names):
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai import OpenAI
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

    provider = tracer_provider()
    LlamaIndexInstrumentor().instrument(tracer_provider=provider)
    llm = OpenAI(model="gpt-4o-mini", api_base=base_url, api_key="test-key")
    tools = [FunctionTool.from_defaults(fn=lookup_order), FunctionTool.from_defaults(fn=process_refund)]
    agent = FunctionAgent(name="refund-agent", description="Processes refunds.", tools=tools, llm=llm, system_prompt="You process refunds.")

    async def all_runs():
        out = []
        for name in variant_names:
            tag = f"{FRAMEWORK}-{name}"
            fake_llm.script(tag, VARIANTS[name])
            await agent.run(user_msg=question(tag))
            out.append(truth(tag, VARIANTS[name], "refund-agent"))
        return out

    return provider, asyncio.run(all_runs())


def main():
    server, base_url = fake_llm.start()
    variants = list(VARIANTS)
    if FRAMEWORK.startswith("agents"):
        provider, out = run_agents(base_url, variants + ["handoff"])
    elif FRAMEWORK.startswith("lang"):
        provider, out = run_langchain(base_url, variants)
    elif FRAMEWORK == "llamaindex":
        provider, out = run_llamaindex(base_url, variants)
    else:
        sys.exit(f"unknown framework {FRAMEWORK!r}")
    provider.force_flush()
    provider.shutdown()
    server.shutdown()
    if RECORD:
        write_record()
    for t in out:
        t["llm_requests"] = fake_llm.CALLS.get(t["tag"], 0)
        print(json.dumps(t))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
