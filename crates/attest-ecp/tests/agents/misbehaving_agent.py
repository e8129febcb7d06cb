"""Agents that break the ECP contract in one specific way, for the runtime's
failure tests. The mode is the first argument:

- hang: answers agent/initialize, then never answers agent/step; it also
  starts three child processes, one in its group, one in a process group of
  its own (setpgid) and one in a session of its own (setsid), so the test can
  see that everything it started is stopped;
- crash: answers the first step, then dies on the second with a traceback;
- noisy: prints a log line on stdout (which carries protocol only) before answering;
- chatty: writes 200 KB to stderr on every step, then answers;
- mute: never answers agent/initialize, and ignores the end of its stdin.

Every process writes its pid to $ECP_TEST_PID_FILE when set.
"""
import os
import subprocess
import sys
import time

from ecp import Result, agent, on_step, serve

MODE = sys.argv[1] if len(sys.argv) > 1 else "hang"


def note_pid(pid):
    path = os.environ.get("ECP_TEST_PID_FILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{pid}\n")


@agent(name=f"Misbehaving-{MODE}")
class Misbehaving:
    def __init__(self):
        self.steps = 0

    @on_step
    def step(self, text: str):
        self.steps += 1
        if MODE == "hang":
            for own in ({}, {"process_group": 0}, {"start_new_session": True}):
                child = subprocess.Popen(["sleep", "300"], **own)
                note_pid(child.pid)
            time.sleep(3600)
        if MODE == "crash" and self.steps == 2:
            print("Traceback (most recent call last):\n  RuntimeError: the model server went away", file=sys.stderr, flush=True)
            os._exit(3)
        if MODE == "chatty":
            for i in range(2000):
                print(f"debug {i:05d} " + "x" * 90, file=sys.stderr)
            sys.stderr.flush()
        if MODE == "noisy":
            print("Loading model weights... done", flush=True)
        return Result(public_output=f"Echo: {text}")


if __name__ == "__main__":
    note_pid(os.getpid())
    if MODE == "mute":
        # Not even the end of stdin stops it: only a signal does.
        sys.stdin.readline()
        time.sleep(3600)
    serve(Misbehaving())
