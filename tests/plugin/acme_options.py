"""``acme``'s run options, in a module of their own: the plugin names it in the
``airflow_provider_torchx.run_options`` entry point group, so a DAG's literal ``cfg`` for
``acme`` is checked when the DAG is parsed without loading the scheduler."""

from __future__ import annotations

from airflow_provider_torchx.core.runopts import runopts


def run_opts() -> runopts:
    """The run options of ``acme``."""
    opts = runopts()
    opts.add("shell", str, "The shell that runs the job's command.", default="sh")
    return opts
