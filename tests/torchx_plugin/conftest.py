"""The tests of the ``aws_batch`` TorchX plugin run in TorchX's venv (``scripts/torchx-venv.sh``:
``.venv-torchx/bin/python -m pytest tests/torchx_plugin``); the project's venvs have no TorchX,
so there this directory is not collected (and a run of it there collects nothing and fails)."""

from __future__ import annotations

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("torchx") else ["*.py"]
