"""What a user of the built wheel gets, checked in the venv it was installed into
(``scripts/package-check.sh`` runs it from a scratch directory, so the source tree is not on
the path): ``package_smoke.py airflow`` in a venv with Airflow (the provider, its entry points,
its UI plugin, a local job through the CLI), ``package_smoke.py torchx`` in one with TorchX and
no Airflow (the ``aws_batch`` TorchX plugin). Exits non-zero naming the first check that fails."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from importlib import metadata
from pathlib import Path

DIST = "airflow-provider-torchx"
BIN = Path(sys.executable).parent
#: The entry point groups TorchX reads (they import TorchX: checked in TorchX's venv).
TORCHX_GROUP = "torchx."


def check(ok: object, what: str) -> None:
    if not ok:
        sys.exit(f"package smoke test: {what}")
    print(f"ok: {what}")


def run(*args: str) -> str:
    """A console script of this venv: its stdout and stderr (its exit status fails the check)."""
    proc = subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        sys.exit(f"package smoke test: `{' '.join(args)}` exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def check_distribution() -> None:
    """The package comes from the installed wheel, with its license and PEP 561 marker."""
    import airflow_provider_torchx

    package = Path(airflow_provider_torchx.__file__).parent
    check(package.is_relative_to(sys.prefix), f"the package is the installed one ({package}, not the source tree)")
    check((package / "py.typed").is_file(), "py.typed is installed")
    dist = metadata.distribution(DIST)
    check(dist.metadata["License-Expression"] == "Apache-2.0", "the metadata says License-Expression: Apache-2.0")
    check(any(Path(str(f)).name == "LICENSE" for f in dist.files or ()), "LICENSE is in the wheel")


def check_airflow() -> None:
    check_distribution()
    dist = metadata.distribution(DIST)
    for ep in dist.entry_points:
        if ep.group != "console_scripts" and not ep.group.startswith(TORCHX_GROUP):
            check(ep.load() is not None, f"entry point {ep.group}:{ep.name} loads")
    from airflow import plugins_manager
    from airflow.providers_manager import ProvidersManager

    check(DIST in ProvidersManager().providers, "Airflow's providers manager lists the provider")
    plugins_manager.ensure_plugins_loaded()
    names = [plugin.name for plugin in plugins_manager._get_plugins()[0]]
    check("torchx" in names, f"Airflow loads the UI plugin (plugins: {names})")
    check(not plugins_manager.get_import_errors(), f"no plugin import errors ({plugins_manager.get_import_errors()})")
    apps = plugins_manager.get_fastapi_plugins()[0]
    check(any(app["url_prefix"] == "/torchx" for app in apps), "the UI plugin mounts its app under /torchx")
    from airflow_provider_torchx import plugins

    check((Path(plugins.__file__).parent / "page.html").is_file(), "the UI's page template is installed")
    out = run("airflow-torchx", "run", "--log", "-s", "local_cwd", "utils.echo", "--msg", "hello-from-the-wheel")
    check("SUCCEEDED" in out and "hello-from-the-wheel" in out, "a local job through the airflow-torchx CLI succeeds")


def check_torchx() -> None:
    check(importlib.util.find_spec("airflow") is None, "this venv has no Airflow")
    check_distribution()
    from torchx import plugins

    registry = plugins.registry()
    factory = registry.get(plugins.PluginType.SCHEDULER).get("aws_batch")
    check(factory is not None, "TorchX's registry lists aws_batch")
    check(factory.__module__.startswith("torchx_plugins.schedulers."), f"from this package ({factory.__module__})")
    check(registry.load_errors(plugins.PluginType.SCHEDULER) == [], "TorchX loads the plugin without errors")
    check("queue=QUEUE (str)" in run("torchx", "runopts", "aws_batch"), "`torchx runopts aws_batch` lists the queue")
    out = run("torchx", "run", "--dryrun", "-s", "aws_batch", "-cfg", "queue=q,region=us-east-1", "utils.echo")
    check("=== SCHEDULER REQUEST ===" in out and '"jobQueue": "q"' in out, "a TorchX dry run renders a Batch request")
    for ep in metadata.distribution(DIST).entry_points:
        if ep.group.startswith(TORCHX_GROUP):
            check(ep.load() is not None, f"entry point {ep.group}:{ep.name} loads")


if __name__ == "__main__":
    {"airflow": check_airflow, "torchx": check_torchx}[sys.argv[1]]()
