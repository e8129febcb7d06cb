"""A deterministic support agent for the ECP runtime tests (ecp-sdk).

Behaviour by input:
- "refund ORD-n": looks up and refunds the order (two tool calls);
- "lookup ORD-n": one lookup call; "refund it": refunds the last order looked up;
- "pause ...": answers with status paused (waiting for approval);
- "env NAME": reports whether NAME is visible in its environment;
- "ancestors NAME": whether NAME is readable in the environment of any of its
  three nearest ancestors (the runtime's own, say) through /proc;
- "two lines": two lines of output, ending with a newline;
- "legacy": answers with the deprecated private_thought field only;
- anything else: an echo.
Run with --http PORT to serve Streamable HTTP on 127.0.0.1:PORT/ecp.
"""
import os
import sys

from ecp import Result, agent, on_reset, on_step, serve, serve_http


def in_ancestors(name):
    """Whether `name` can be read from an ancestor's /proc/<pid>/environ."""
    pid = os.getppid()
    for _ in range(3):
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if any(entry.split(b"=", 1)[0] == name.encode() for entry in f.read().split(b"\0")):
                    return True
        except OSError:
            pass
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return False


@agent(name="SupportAgent", capabilities={"tool_calls": {}, "evaluation_context": {}, "usage": {}})
class SupportAgent:
    def __init__(self):
        self.last_order = None
        self.turns = 0

    @on_step
    def step(self, text: str):
        self.turns += 1
        usage = {"input_tokens": len(text), "output_tokens": 7}
        words = text.split()
        if words[:1] == ["refund"] and len(words) > 1 and words[1].startswith("ORD-"):
            order = words[1]
            return Result(
                public_output=f"Your refund for {order} of $89.99 has been processed.",
                evaluation_context=f"Order {order} was delivered and eligible; policy allows refunds within 30 days.",
                tool_calls=[
                    {"name": "lookup_order", "arguments": {"order_id": order}},
                    {"name": "process_refund", "arguments": {"order_id": order, "amount": 89.99, "notify": True, "tags": ["refund", 1]}},
                ],
                usage=usage,
            )
        if words[:1] == ["lookup"] and len(words) > 1:
            self.last_order = words[1]
            return Result(
                public_output=f"Order {words[1]} was delivered on Monday.",
                evaluation_context="Looked the order up before acting.",
                tool_calls=[{"name": "lookup_order", "arguments": {"order_id": words[1]}}],
                usage=usage,
            )
        if text == "refund it":
            return Result(
                public_output=f"Refunded {self.last_order}.",
                evaluation_context="Refunded the order from the previous turn.",
                tool_calls=[{"name": "process_refund", "arguments": {"order_id": self.last_order, "amount": 10}}],
            )
        if words[:1] == ["pause"]:
            return Result(status="paused", public_output="Waiting for a manager to approve.", evaluation_context="Needs approval.")
        if words[:1] == ["env"] and len(words) > 1:
            return Result(public_output=f"{words[1]}={os.environ.get(words[1], '<unset>')}")
        if words[:1] == ["ancestors"] and len(words) > 1:
            return Result(public_output=f"{words[1]} in ancestors: {'yes' if in_ancestors(words[1]) else 'no'}")
        if text == "legacy":
            return Result(public_output="Legacy answer", private_thought="thought via the deprecated field")
        if text == "two lines":
            return Result(public_output="first line\nlast line\n")
        if text == "empty":
            return Result(public_output="")
        return Result(public_output=f"Echo: {text}", evaluation_context=f"Turn {self.turns}: echoed the input.")

    @on_reset
    def reset(self):
        self.last_order = None
        self.turns = 0


if __name__ == "__main__":
    pid_file = os.environ.get("ECP_TEST_PID_FILE")
    if pid_file:
        with open(pid_file, "a") as f:
            f.write(f"{os.getpid()}\n")
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        serve_http(SupportAgent(), port=int(sys.argv[2]))
    else:
        serve(SupportAgent())
