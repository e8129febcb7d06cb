"""What a developer reads when a test fails through the real attest-ai 0.9.0 SDK.

Each case writes a small test file as a user would, runs it with pytest (the SDK's
own plugin spawns the engine) in a process of its own, and checks pytest's printed
output: the SDK prints the engine's error ``message`` and nothing of ``data``, so
what to do and the valid choices must be in the message itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

USER_TEST = """
from attest import TraceBuilder, expect

TRACE = (
    TraceBuilder(agent_id="refund-agent")
    .set_trace_id("trc_msg")
    .set_input(user_message="refund my order")
    .set_output(message="Your refund is on its way.")
    .build()
)


def test_it(attest):
    attest.evaluate(expect(TRACE).passes_judge("is it polite?", rubric=%(rubric)r))
"""


def run_user_test(tmp_path: Path, rubric: str, env: dict[str, str]) -> str:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TEST % {"rubric": rubric}))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0, f"the user's test was meant to fail:\n{out.stdout}"
    return out.stdout + out.stderr


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTEST_JUDGE", "ATTEST_OPENAI", "ATTEST_ANTHROPIC", "ATTEST_EMBEDDING"))}
    env["ATTEST_CACHE_DIR"] = str(tmp_path / "cache")
    return env


def test_an_unknown_rubric_prints_the_valid_ones(tmp_path: Path) -> None:
    printed = run_user_test(tmp_path, "politeness", clean_env(tmp_path))
    assert "politeness" in printed, printed
    for rubric in ("faithfulness", "helpfulness", "safety", "conciseness", "tone"):
        assert rubric in printed, f"{rubric} not among the choices printed:\n{printed}"


def test_a_missing_judge_prints_how_to_configure_one(tmp_path: Path) -> None:
    printed = run_user_test(tmp_path, "helpfulness", clean_env(tmp_path))
    assert "no LLM judge provider is configured" in printed, printed
    assert "ATTEST_JUDGE_BASE_URL" in printed, f"the fix is not printed:\n{printed}"


@pytest.fixture(autouse=True)
def _needs_engine() -> None:
    if not os.path.isfile(os.environ.get("ATTEST_ENGINE_PATH", "")):
        pytest.skip("ATTEST_ENGINE_PATH is not set to an engine binary")
