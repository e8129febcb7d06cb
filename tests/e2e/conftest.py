"""Shared setup for the attest-engine end-to-end suite.

The suite drives the engine exclusively through the real ``attest-ai`` SDK:
its pytest plugin (entry point ``attest = attest.plugin``) provides the
``attest_engine`` (session) and ``attest`` (function) fixtures, which spawn
``$ATTEST_ENGINE_PATH --log-level=warn`` and talk JSON-RPC over stdio.

If no engine binary is available the whole suite is skipped with a clear
message instead of letting the SDK try to auto-download a release.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENGINE_ENV = "ATTEST_ENGINE_PATH"
_E2E_DIR = Path(__file__).resolve().parent

# Never let the SDK fall back to downloading an engine from the internet, and
# never let simulation mode fake "pass" results: this suite must exercise the
# real binary.
os.environ.setdefault("ATTEST_ENGINE_NO_DOWNLOAD", "1")
os.environ.pop("ATTEST_SIMULATION", None)

# The SDK spawns the path as given; make a relative path (the documented
# ``target/debug/attest-engine``) independent of later cwd changes.
_raw_path = os.environ.get(ENGINE_ENV)
if _raw_path and os.path.isfile(_raw_path):
    os.environ[ENGINE_ENV] = os.path.abspath(_raw_path)


def _engine_skip_reason() -> str | None:
    path = os.environ.get(ENGINE_ENV)
    if not path:
        return (
            f"{ENGINE_ENV} is not set: build the engine (cargo build) and run "
            f"`{ENGINE_ENV}=target/debug/attest-engine python -m pytest tests/e2e`"
        )
    if not os.path.isfile(path):
        return f"{ENGINE_ENV}={path!r} is not a file: build the engine first (cargo build)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if _E2E_DIR in Path(str(item.path)).resolve().parents]
    if not ours:
        return

    import attest.plugin

    if not config.pluginmanager.is_registered(attest.plugin):
        raise pytest.UsageError(
            "the attest-ai pytest plugin is not loaded (is PYTEST_DISABLE_PLUGIN_AUTOLOAD "
            "set?); run with `-p attest.plugin` or install attest-ai==0.9.0"
        )

    reason = _engine_skip_reason()
    if reason is None:
        return
    marker = pytest.mark.skip(reason=reason)
    for item in ours:
        item.add_marker(marker)


@pytest.fixture(autouse=True)
def _real_engine_only() -> None:
    """Guard against attest.config(simulation=True) leaking in from elsewhere."""
    from attest.config import is_simulation_mode

    assert not is_simulation_mode(), "attest simulation mode is on; e2e results would be fake"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the SDK plugin's "Attest Diagnostics" summary for real failures only.

    Many tests here *expect* soft_fail/hard_fail results; the plugin would list
    each of them as "FAILED <nodeid>" in its terminal summary although the
    pytest test passed. Drop those entries; failed tests keep their block.
    """
    if report.when != "call" or not report.passed:
        return
    import attest.plugin

    results = getattr(attest.plugin, "_session_results", None)
    if isinstance(results, dict):
        results.pop(report.nodeid, None)
