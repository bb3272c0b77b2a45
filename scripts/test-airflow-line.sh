#!/usr/bin/env bash
# Run tests on an older Airflow line than the pinned one (constraints.txt): 3.1 (the oldest
# supported, with the pre-3.3 cancel-while-deferred path) or 3.2, each in its own virtualenv
# .venv-airflowXY pinned by constraints-airflow-X.Y.txt. Idempotent: a venv is made once and
# reinstalled only when its constraints or pyproject.toml change. Arguments after the line go
# to pytest (default: the tests whose behaviour differs between lines, but the PyTorch ones:
# `tests -m "airflow_line and not torch"`). The Docker-marked and live tests need the services
# (`bash scripts/services.sh start` and `source .ci/state/services.env`; test.sh does both).
#
#   scripts/test-airflow-line.sh 3.2 [PYTEST ARGS...]
#   scripts/test-airflow-line.sh --prepare 3.2      # make or refresh the venv only (test.sh)
#   scripts/test-airflow-line.sh --deps-only 3.2    # install its pinned dependencies, not the package
#   scripts/test-airflow-line.sh --freeze 3.2.2 'fastapi<0.137' 'svcs<26'   # (re)write constraints-airflow-3.2.txt
#
# --freeze makes the constraints file the way every one was made: `pip freeze` of a fresh venv
# after `pip install "apache-airflow==VERSION" [EXTRA...] -e ".[test]"` (the editable package
# left out). EXTRA: caps the line itself lacks: Airflow 3.2.2 breaks with fastapi >= 0.137 (a
# pydantic discriminator error; 3.3 caps it) and with svcs >= 26 (its in-process execution API,
# which dag.test uses, finds no 'svcs_registry').
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
usage="usage: $0 [--prepare] LINE [PYTEST ARGS...] | --freeze VERSION [EXTRA REQUIREMENT...] (lines: $(ls constraints-airflow-*.txt | sed 's/constraints-airflow-\(.*\)\.txt/\1/' | tr '\n' ' '))"

if [ "${1:-}" = "--freeze" ]; then
    version=${2:?$usage}
    shift 2
    line=${version%.*}
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$python" -m venv "$tmp/venv"
    "$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check "apache-airflow==$version" "$@" -e ".[test]"
    extra=""
    for req in "$@"; do extra+="\"$req\" "; done
    {
        echo "# Pins for the Airflow $line test environment (.venv-airflow${line/./}, scripts/test-airflow-line.sh $line): pip freeze"
        echo "# of a Python $("$tmp/venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') venv after: pip install \"apache-airflow==$version\" $extra-e \".[test]\" (editable package left out)."
        "$tmp/venv/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check
    } >"constraints-airflow-$line.txt"
    echo "wrote constraints-airflow-$line.txt"
    exit 0
fi

prepare_only=false
deps_only=false
case "${1:-}" in
--prepare) prepare_only=true && shift ;;
# The pins alone (the constraints file is a full freeze), leaving the source tree alone (an
# editable install rewrites its egg-info, which running tests read): test.sh runs this for both
# lines at once, beside the checks, and --prepare after, which then only adds the package.
--deps-only) deps_only=true && shift ;;
esac
line=${1:?$usage}
shift
constraints=constraints-airflow-$line.txt
[ -f "$constraints" ] || { echo "test-airflow-line: no $constraints; $usage" >&2; exit 2; }
venv=.venv-airflow${line/./}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
stamp="$venv/.installed"
want=$(cat "$constraints" pyproject.toml | sha256sum | cut -d' ' -f1)
if $deps_only; then
    deps_stamp="$venv/.deps-installed"
    deps_want=$(sha256sum "$constraints" | cut -d' ' -f1)
    if [ "$(cat "$deps_stamp" 2>/dev/null)" != "$deps_want" ] && [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$constraints"
        echo "$deps_want" >"$deps_stamp"
    fi
    exit 0
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$constraints" -e ".[test]"
    echo "$want" >"$stamp"
fi
"$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(not m.version("apache-airflow").startswith(sys.argv[1] + "."))' "$line" ||
    { echo "test-airflow-line: $venv does not hold Airflow $line" >&2; exit 1; }
if $prepare_only; then exit 0; fi
[ "$#" -gt 0 ] || set -- tests -m "airflow_line and not torch"
exec "$venv/bin/python" -m pytest "$@"
