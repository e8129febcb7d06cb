"""A trivial ECP agent (ecp-sdk) for scripts/bench_ecp.py: echoes its input.

After every step it writes its own CPU seconds so far (user + system) to the
file named by its first argument, so the bench can subtract the agent's own
time from the runtime's time per step.
"""
import sys
import time

from ecp import Result, agent, on_step, serve

CPU_FILE = sys.argv[1]


@agent(name="EchoAgent", capabilities={})
class EchoAgent:
    @on_step
    def step(self, text: str):
        with open(CPU_FILE, "w") as f:
            f.write(repr(time.process_time()))
        return Result(public_output=f"Echo: {text}")


if __name__ == "__main__":
    serve(EchoAgent())
