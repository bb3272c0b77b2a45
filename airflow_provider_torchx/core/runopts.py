"""Typed run options (a scheduler's "cfg"): declaring them, parsing them from strings and
resolving a user's cfg against them.

A cfg is a plain dict ``{name: value}`` whose values are ``str``, ``int``, ``float``, ``bool``,
``list[str]`` or ``dict[str, str]``. Strings (from a command line or an Airflow connection) are
parsed into the declared type; anything that does not fit is an ``InvalidRunConfigError`` that
lists the valid options.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_torchx.core.errors import InvalidRunConfigError

CfgVal = str | int | float | bool | list[str] | dict[str, str] | None
Cfg = Mapping[str, CfgVal]

_TYPE_NAMES: dict[Any, str] = {str: "str", int: "int", float: "float", bool: "bool", list: "list", dict: "dict"}
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
# The start of the next "key=" in a cfg literal: a separator, then an option-like name and "=".
_NEXT_KEY = re.compile(r"[,;]\s*(?=[A-Za-z_][A-Za-z0-9_.-]*=)")


@dataclass(frozen=True)
class runopt:  # noqa: N801 - TorchX's public name
    """One declared option; ``minimum``: the smallest value an int or float option takes;
    ``check``: called with a typed value, raises ``InvalidRunConfigError`` naming a bad one."""

    default: CfgVal
    opt_type: type
    is_required: bool
    help: str
    minimum: int | float | None = None
    check: Callable[[CfgVal], object] | None = None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` Did you mean X?`` for the names of ``known`` closest to ``name``; empty if none is close."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _split_items(value: str) -> list[str]:
    return [v.strip() for v in re.split(r"[,;]", value) if v.strip()]


def _parse_value(name: str, opt_type: type, raw: str) -> CfgVal:
    """Turn the string ``raw`` into ``opt_type`` or raise naming the option."""
    text = raw.strip()
    if opt_type is str:
        return text
    if opt_type is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
    elif opt_type is int:
        try:
            return int(text)
        except ValueError:
            pass
    elif opt_type is float:
        try:
            return float(text)
        except ValueError:
            pass
    elif opt_type is list:
        return _split_items(text)
    elif opt_type is dict:
        out: dict[str, str] = {}
        for item in _split_items(text):
            key, sep, val = item.partition(":")
            if not sep or not key.strip():
                break
            out[key.strip()] = val.strip()
        else:
            return out
    raise InvalidRunConfigError(
        f"cfg: {name}={raw!r} is not a valid {_TYPE_NAMES[opt_type]}"
        + (" (use true/false)" if opt_type is bool else "")
        + (" (use k1:v1,k2:v2)" if opt_type is dict else "")
    )


def as_type(kind: type, value: object) -> Any:
    """``value``, already of ``kind`` (str, int, float, bool, list of str, dict of str to str),
    in that type's canonical form (ints pass as floats, bools never as ints, tuples become
    lists); ``TypeError`` if it is not of ``kind``. Shared by run options and component args."""
    ok = (
        (kind is bool and isinstance(value, bool))
        or (kind is int and isinstance(value, int) and not isinstance(value, bool))
        or (kind is float and isinstance(value, int | float) and not isinstance(value, bool))
        or (kind is str and isinstance(value, str))
        or (kind is list and isinstance(value, list | tuple) and all(isinstance(v, str) for v in value))
        or (
            kind is dict
            and isinstance(value, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        )
    )
    if not ok:
        raise TypeError(f"{value!r} is not a {kind.__name__}")
    if kind is float:
        return float(value)  # type: ignore[arg-type]
    if kind is list:
        return list(value)  # type: ignore[call-overload]
    return value


def _coerce(name: str, opt: runopt, value: object) -> CfgVal:
    """Check ``value`` against ``opt``'s type (parsing strings) and minimum; raise naming the
    option."""
    if value is None:
        return None
    t = opt.opt_type
    typed: CfgVal
    if isinstance(value, str) and t is not str:
        typed = _parse_value(name, t, value)
    else:
        try:
            typed = as_type(t, value)
        except TypeError:
            raise InvalidRunConfigError(
                f"cfg: {name}={value!r} has type {type(value).__name__}; expected {_TYPE_NAMES[t]}"
            ) from None
    if opt.minimum is not None and isinstance(typed, int | float) and typed < opt.minimum:
        article = "an" if t is int else "a"
        raise InvalidRunConfigError(
            f"cfg: {name}={typed!r} is below its minimum: it must be {article} {_TYPE_NAMES[t]} >= {opt.minimum}"
        )
    if opt.check is not None:
        opt.check(typed)
    return typed


class runopts:  # noqa: N801 - TorchX's public name
    """The options a scheduler accepts, with types, defaults, help and required flags."""

    def __init__(self) -> None:
        self._opts: dict[str, runopt] = {}

    def add(
        self,
        cfg_key: str,
        type_: type,
        help: str,  # noqa: A002 - TorchX's parameter name
        default: CfgVal = None,
        required: bool = False,
        minimum: int | float | None = None,
        check: Callable[[CfgVal], object] | None = None,
    ) -> None:
        """Declare an option. A required option has no default; ``minimum`` (int and float
        options only) is the smallest value it takes and ``check`` a test of its value (it
        raises ``InvalidRunConfigError``), both applied wherever values are checked."""
        if type_ not in _TYPE_NAMES:
            raise TypeError(f"runopts: type of {cfg_key!r} must be one of {', '.join(_TYPE_NAMES.values())}")
        if required and default is not None:
            raise ValueError(f"runopts: required option {cfg_key!r} cannot have a default")
        if minimum is not None and type_ not in (int, float):
            raise TypeError(f"runopts: {cfg_key!r} has a minimum, but only int and float options take one")
        # The default is stored in its declared type (a "1" declared for an int becomes 1).
        opt = runopt(None, type_, False, help, minimum, check)
        typed_default = _coerce(cfg_key, opt, default)
        self._opts[cfg_key] = runopt(typed_default, type_, required, help, minimum, check)

    def update(self, other: runopts) -> None:
        """Add every option of ``other``."""
        self._opts.update(other._opts)

    def get(self, name: str) -> runopt | None:
        """The option ``name``, or None."""
        return self._opts.get(name)

    def __iter__(self) -> Iterator[tuple[str, runopt]]:
        return iter(self._opts.items())

    def __len__(self) -> int:
        return len(self._opts)

    def _unknown(self, key: str) -> InvalidRunConfigError:
        valid = ", ".join(sorted(self._opts)) or "(none)"
        hint = did_you_mean(key, self._opts)
        return InvalidRunConfigError(f"cfg: unknown option {key!r}; valid options: {valid}.{hint}")

    def _typed(self, key: str, value: object) -> CfgVal:
        """``value`` checked against (strings parsed into) the type of option ``key``; an
        error names the option, the value and what the option takes (its help), on one short
        line (not every option's usage: ``runopts`` prints those)."""
        opt = self._opts.get(key)
        if opt is None:
            raise self._unknown(key)
        try:
            return _coerce(key, opt, value)
        except InvalidRunConfigError as e:
            raise InvalidRunConfigError(f"{e}; {key}: {opt.help}") from None

    def check(self, cfg: Cfg | None) -> dict[str, CfgVal]:
        """Type-check ``cfg`` (parsing string values) without applying defaults or checking
        required options: what a partial cfg (a connection's, an operator's) must pass."""
        out: dict[str, CfgVal] = {}
        for key, value in (cfg or {}).items():
            out[key] = self._typed(key, value)
        return out

    def resolve(self, cfg: Cfg | None) -> dict[str, CfgVal]:
        """The final cfg: ``cfg`` checked, defaults filled in, required options present."""
        out = self.check(cfg)
        for key, opt in self._opts.items():
            if out.get(key) is None:
                if opt.is_required:
                    raise InvalidRunConfigError(
                        f"cfg: required option {key!r} is missing ({opt.help}); usage: {self.usage()}"
                    )
                out[key] = opt.default
        return out

    def cfg_from_str(self, *cfg_literals: str) -> dict[str, CfgVal]:
        """Parse ``"key=value"`` literals into a typed cfg.

        Each literal may hold several pairs (``"a=1,b=2"``). A pair ends at the last ``,`` or
        ``;`` before the next ``key=``, so ``"FOO=v1,v2,BAR=v3"`` gives ``FOO=[v1, v2]`` for a
        list option. Unknown keys and values of the wrong type raise.
        """
        out: dict[str, CfgVal] = {}
        for literal in cfg_literals:
            for pair in _NEXT_KEY.split(literal.strip().strip(",;")):
                if not pair.strip():
                    continue
                key, sep, value = pair.partition("=")
                key = key.strip()
                if not sep or not key:
                    raise InvalidRunConfigError(
                        f"cfg: {pair!r} is not key=value; valid options: {', '.join(sorted(self._opts))}"
                    )
                out[key] = self._typed(key, value.strip())
        return out

    def usage(self) -> str:
        """One line: ``req=REQ,[opt=OPT],...``."""
        parts = []
        for key, opt in self._opts.items():
            part = f"{key}={key.upper()}"
            parts.append(part if opt.is_required else f"[{part}]")
        return ",".join(parts)

    def __str__(self) -> str:
        lines = ["usage:", f"    {self.usage()}", ""]
        for title, required in (("required arguments:", True), ("optional arguments:", False)):
            chosen = [(k, o) for k, o in self._opts.items() if o.is_required == required]
            if not chosen:
                continue
            lines.append(title)
            for key, opt in chosen:
                default = "" if required else f", {opt.default}"
                lines.append(f"    {key}={key.upper()} ({_TYPE_NAMES[opt.opt_type]}{default})")
                lines.append(f"        {opt.help}")
            lines.append("")
        return "\n".join(lines).rstrip() + "\n"
