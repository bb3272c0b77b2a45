"""The core stands alone: every module under ``airflow_provider_torchx.core`` imports in a
fresh interpreter where ``airflow`` cannot be imported, and pulls in no module of the Airflow
layer (arrows only point down)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

_PROBE = textwrap.dedent(
    """
    import importlib
    import importlib.abc
    import json
    import pkgutil
    import sys
    import traceback


    class BlockAirflow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "airflow" or name.startswith("airflow."):
                raise ImportError(f"airflow is unimportable in this test: {name}")
            return None


    sys.meta_path.insert(0, BlockAirflow())
    try:
        import airflow  # noqa: F401
        blocked = False
    except ImportError:
        blocked = True

    failed = {}


    def record(name):
        failed[name] = traceback.format_exc()


    import airflow_provider_torchx.core as core

    names = [core.__name__]
    for info in pkgutil.walk_packages(core.__path__, core.__name__ + ".", onerror=record):
        names.append(info.name)
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            record(name)

    print(json.dumps({
        "blocked": blocked,
        "modules": names,
        "failed": failed,
        "loaded": sorted(sys.modules),
    }))
    """
)


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    """Run the import probe once in a fresh interpreter and return what it saw."""
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_airflow_is_really_blocked(probe: dict[str, Any]) -> None:
    assert probe["blocked"] is True


def test_every_core_module_imports_without_airflow(probe: dict[str, Any]) -> None:
    assert probe["failed"] == {}, "\n".join(f"{name}:\n{tb}" for name, tb in probe["failed"].items())
    modules = set(probe["modules"])
    # The walk really found the core (not an empty or wrong package).
    for expected in ("specs", "runopts", "errors", "runner", "schedulers", "schedulers.api"):
        assert f"airflow_provider_torchx.core.{expected}" in modules
    assert set(probe["modules"]) <= set(probe["loaded"])


def test_no_airflow_module_was_loaded(probe: dict[str, Any]) -> None:
    assert [m for m in probe["loaded"] if m == "airflow" or m.startswith("airflow.")] == []


def test_core_imports_no_module_of_the_airflow_layer(probe: dict[str, Any]) -> None:
    upper = [
        m
        for m in probe["loaded"]
        if m.startswith("airflow_provider_torchx.") and not m.startswith("airflow_provider_torchx.core")
    ]
    assert upper == []
    for layer in ("hooks", "operators", "sensors", "triggers", "links", "provider_info"):
        assert f"airflow_provider_torchx.{layer}" not in probe["loaded"]
