#!/usr/bin/env bash
# Install what the browser tests (tests/e2e/test_live_local.py, test_ui_security.py) drive a
# real browser with: Debian's `chromium` (apt) and Playwright from PyPI in a virtualenv of its
# own, .venv-browser, which uses that browser (no browser download). Idempotent: apt and pip run only when something is
# missing or the pinned Playwright version changed.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
venv=.venv-browser
# Pinned here: only this venv uses them (Playwright's Python package drives the browser over a pipe).
pins="playwright==1.65.2 pyee==13.0.0 greenlet==3.5.6 typing-extensions==4.16.0"
if ! command -v chromium >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium >/dev/null
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$pins" ]; then
    # shellcheck disable=SC2086 # one word per pin
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $pins
    echo "$pins" >"$venv/.installed"
fi
