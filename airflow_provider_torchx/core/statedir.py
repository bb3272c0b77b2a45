"""Where this host keeps the project's state (the local job store, watchers' cursor files).

``os`` only, no ``pathlib``/``typing``: the local supervisor imports it, and its start-up time
is part of every local job's overhead.
"""

from __future__ import annotations

import os


def default_state_dir() -> str:
    """``$AIRFLOW_TORCHX_STATE_DIR``, else ``$XDG_STATE_HOME/airflow-torchx``, else
    ``~/.local/state/airflow-torchx`` (absolute)."""
    explicit = os.environ.get("AIRFLOW_TORCHX_STATE_DIR")
    if not explicit:
        xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
        explicit = os.path.join(xdg, "airflow-torchx")
    return os.path.abspath(os.path.expanduser(explicit))
