"""TorchX finds ``aws_batch`` in this distribution, its CLI shows our run options, its dry run
renders the request ``airflow-torchx dryrun`` renders, and nothing of ours imports TorchX unless
TorchX loads the plugin. Run in TorchX's venv, which holds no Airflow."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from torchx import plugins
from torchx.schedulers import DEFAULT_SCHEDULER_MODULES, get_default_scheduler_name, get_scheduler_factories

from airflow_provider_torchx.core.schedulers.aws_batch.run_options import run_opts
from airflow_provider_torchx.torchx_plugin.scheduler import BatchPluginScheduler

BIN = Path(sys.executable).parent
MODULE = "torchx_plugins.schedulers.airflow_provider_torchx_aws_batch"
REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path | None = None) -> str:
    """Run a console script of this venv; its stdout (a failure shows its stderr)."""
    proc = subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=60, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_this_venv_has_no_airflow() -> None:
    assert importlib.util.find_spec("airflow") is None


def test_registry_lists_aws_batch_from_this_package() -> None:
    registry = plugins.registry()
    factory = registry.get(plugins.PluginType.SCHEDULER)["aws_batch"]
    assert factory.__module__ == MODULE
    assert registry.load_errors(plugins.PluginType.SCHEDULER) == []
    assert get_scheduler_factories()["aws_batch"] is factory
    sched = factory("s")
    assert isinstance(sched, BatchPluginScheduler) and (sched.backend, sched.session_name) == ("aws_batch", "s")


def test_installing_the_plugin_leaves_torchx_default_scheduler_alone() -> None:
    """TorchX makes the first registered plugin its default (``torchx run`` and ``torchx list``
    without ``-s``): with this package installed it is what it is without any plugin."""
    probe = "from torchx.schedulers import get_default_scheduler_name as d; print(d())"
    without_plugins = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env={"TORCHX_PLUGINS_SOURCE": "0"}
    )
    assert without_plugins.returncode == 0, without_plugins.stderr
    default = without_plugins.stdout.strip()
    assert default != "aws_batch" and get_default_scheduler_name() == default
    factories = get_scheduler_factories()
    assert list(factories)[:2] == [default, "aws_batch"]
    assert type(factories[default]("s")).__module__ == DEFAULT_SCHEDULER_MODULES[default]  # TorchX's own


def test_the_namespace_package_stays_a_namespace_package() -> None:
    """An ``__init__.py`` in ``torchx_plugins/`` would hide every other distribution's plugins."""
    assert not (REPO / "torchx_plugins" / "__init__.py").exists()
    assert not (REPO / "torchx_plugins" / "schedulers" / "__init__.py").exists()


def test_the_torchx_extra_pins_the_build_this_venv_tests() -> None:
    pinned = f"torchx-nightly=={metadata.version('torchx-nightly')}"
    assert f'{pinned}; extra == "torchx"' in (metadata.requires("airflow-provider-torchx") or [])
    assert pinned in (REPO / "scripts" / "torchx-venv.sh").read_text()


def test_runopts_cli_prints_every_option_of_ours(tmp_path: Path) -> None:
    out = cli("torchx", "runopts", "aws_batch", cwd=tmp_path)
    for key, opt in run_opts():
        shown = opt.opt_type.__name__  # TorchX shows list[str] as list
        assert re.search(rf"^\s+{key}={key.upper()} \({shown}[,)]", out, re.M), key
        assert opt.help in out
    assert "required arguments:\n        queue=QUEUE (str)" in out


_IMPORT_PROBE = textwrap.dedent(
    """
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("torchx", "torchx_plugins", "airflow"):
                raise ImportError(name + " is blocked")

    sys.meta_path.insert(0, Block())
    import airflow_provider_torchx
    from airflow_provider_torchx.core import cli
    from airflow_provider_torchx.core.runner import get_runner
    from airflow_provider_torchx.core.schedulers.aws_batch import scheduler

    with get_runner("probe") as runner:
        assert "aws_batch" in runner.scheduler_backends()
        runner.scheduler_run_opts("aws_batch")
    assert cli.main(["runopts", "aws_batch"]) == 0
    print(sorted(m for m in sys.modules if m.split(".")[0] in ("torchx", "torchx_plugins")))
    """
)


def test_our_package_and_cli_work_without_torchx_and_never_import_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def _request(output: str) -> dict[str, Any]:
    """The JSON scheduler request of a dry run's output, with what differs by design made equal:
    the job name's random suffix and the session id TorchX's runner adds to every role."""
    text = output.split("=== SCHEDULER REQUEST ===", 1)[1]
    request = json.loads(text[text.index("{") : text.rindex("}") + 1])
    name = request["submit_job"]["jobName"]
    blob = json.dumps(request).replace(name, "JOB")
    blob = re.sub(r'\{"name": "TORCHX_INTERNAL_SESSION_ID", "value": "[^"]*"\}(, )?', "", blob)
    return json.loads(blob)


@pytest.mark.parametrize("replicas", ["1", "2"])
def test_a_dry_run_renders_the_request_airflow_torchx_renders(tmp_path: Path, replicas: str) -> None:
    cfg = "queue=q,privileged=True,ulimits=nofile:1024:4096,attempt_timeout=120,shm_size=0,user=alice"
    component = ["utils.echo", "--msg", "hi $USER", "--image", "busybox:local", "--num_replicas", replicas]
    theirs = cli("torchx", "run", "--dryrun", "-s", "aws_batch", "-cfg", cfg, *component, cwd=tmp_path)
    mine = cli("airflow-torchx", "dryrun", "-s", "aws_batch", "-cfg", cfg, *component, cwd=tmp_path)
    assert "TORCHX_INTERNAL_SESSION_ID" in theirs  # TorchX's runner adds it; ours does not
    request = _request(theirs)
    assert request == _request(mine)
    assert request["job_definition"]["type"] == ("container" if replicas == "1" else "multinode")
    assert request["submit_job"]["timeout"] == {"attemptDurationSeconds": 120}
