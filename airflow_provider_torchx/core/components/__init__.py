"""Components: plain functions that return an ``AppDef``, found by name and called with
command-line style or keyword arguments.

A component's arguments come from its signature (types from the annotations: ``str``,
``int``, ``float``, ``bool``, ``list[str]``, ``dict[str, str]``, each possibly optional) and its
docstring (the first paragraph describes it, the ``Args:`` section gives each argument's help).
An argument annotated ``Annotated[T, check, ...]`` has its given values passed to each
``check(flag, value)`` after conversion, which raises ``ComponentError`` naming the flag, the
value and what is allowed (``AtLeast(1)``: an int >= 1); the checks run when the component is
called and when a DAG's literal arguments are checked at parse time.

Resolution order of a name (as TorchX): functions registered through the entry-point group
``airflow_provider_torchx.components`` (an entry point names a module, whose public functions
become ``<entry point name>.<function>``, or a single function, named as the entry point),
then the builtins ``utils.*`` and ``dist.*``, then ``path/to/file.py:function``.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib.util
import inspect
import logging
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

from airflow_provider_torchx.core.errors import ComponentError
from airflow_provider_torchx.core.runopts import as_type, did_you_mean
from airflow_provider_torchx.core.specs import AppDef

__all__ = [
    "COMPONENT_ENTRY_POINT_GROUP",
    "AtLeast",
    "Component",
    "ComponentError",
    "check_args_form",
    "get_app",
    "get_component",
    "list_components",
]

log = logging.getLogger(__name__)

COMPONENT_ENTRY_POINT_GROUP = "airflow_provider_torchx.components"
_BUILTIN_MODULES = ("utils", "dist")
_TYPE_HELP = {
    str: "str",
    int: "int",
    float: "float",
    bool: "bool (true/false)",
    list: "list of str (a,b,c)",
    dict: "dict of str (k1=v1,k2=v2)",
}
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
# Where one "key=value" item of a dict argument ends: a comma followed by the next "key=".
_NEXT_DICT_KEY = re.compile(r",(?=[^,=]+=)")
_REQUIRED = inspect.Parameter.empty
_ARG_SECTIONS = ("Args:", "Arguments:")
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$")


# --------------------------------------------------------------------------- argument types

#: A check of an argument's converted value (``Annotated`` metadata): ``check(flag, value)``.
ArgCheck = Callable[[str, Any], object]


@dataclass(frozen=True)
class AtLeast:
    """``Annotated[int, AtLeast(1)]``: the argument's smallest allowed value."""

    minimum: int

    def __call__(self, flag: str, value: Any) -> None:
        if value < self.minimum:
            raise ComponentError(f"{flag}: {value!r} is not allowed: it must be an int >= {self.minimum}")


@dataclass(frozen=True)
class _Param:
    """One named argument of a component: its base type (a key of ``_TYPE_HELP``), whether
    ``None`` is allowed, its default (``_REQUIRED`` if none), its help text and the checks of
    its given values (``Annotated`` metadata)."""

    name: str
    kind: type
    optional: bool
    default: Any
    help: str
    checks: tuple[ArgCheck, ...] = ()

    @property
    def flag(self) -> str:
        """How the argument is written on a command line (``-j`` or ``--msg``)."""
        return f"-{self.name}" if len(self.name) == 1 else f"--{self.name}"

    def from_str(self, raw: str) -> Any:
        """Convert a command-line string into this argument's type and check it; raise naming it."""
        return self._checked(self._converted(raw))

    def _checked(self, value: Any) -> Any:
        """``value`` once every check accepted it (None, where allowed, is not checked)."""
        if value is not None:
            for check in self.checks:
                check(self.flag, value)
        return value

    def _converted(self, raw: str) -> Any:
        text = raw.strip()
        if self.kind is str:
            return raw
        if self.kind is int:
            try:
                return int(text)
            except ValueError:
                pass
        elif self.kind is float:
            try:
                return float(text)
            except ValueError:
                pass
        elif self.kind is bool:
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
        elif self.kind is list:
            return [item for item in text.split(",") if item] if text else []
        elif self.kind is dict:
            out: dict[str, str] = {}
            for item in _NEXT_DICT_KEY.split(text) if text else []:
                key, sep, value = item.partition("=")
                if not sep or not key.strip():
                    break
                out[key.strip()] = value
            else:
                return out
        raise ComponentError(f"{self.flag}: {raw!r} is not a valid {_TYPE_HELP[self.kind]}")

    def check(self, value: Any) -> Any:
        """Accept a Python value of the right type (or a string, converted); raise naming it."""
        if value is None and self.optional:
            return None
        if isinstance(value, str) and self.kind is not str:
            return self.from_str(value)
        try:
            return self._checked(as_type(self.kind, value))
        except TypeError:
            allowed = _TYPE_HELP[self.kind] + (" or None" if self.optional else "")
            raise ComponentError(f"{self.flag}: {value!r} is a {type(value).__name__}; expected {allowed}") from None


def _base_type(fn_name: str, name: str, annotation: Any) -> tuple[type, bool, tuple[ArgCheck, ...]]:
    """``(base type, optional, checks)`` of an annotation (``checks``: the callables of an
    outer ``Annotated``); anything unsupported raises."""
    checks: tuple[ArgCheck, ...] = ()
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *metadata = typing.get_args(annotation)
        checks = tuple(m for m in metadata if callable(m))
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(members) < len(typing.get_args(annotation))
        if len(members) == 1:
            annotation = members[0]
            origin = typing.get_origin(annotation)
    if annotation in (str, int, float, bool):
        return annotation, optional, checks
    args = typing.get_args(annotation)
    if (origin or annotation) is list and args in ((), (str,)):
        return list, optional, checks
    if (origin or annotation) is dict and args in ((), (str, str)):
        return dict, optional, checks
    raise ComponentError(
        f"component {fn_name}: argument {name!r} has the unsupported type {annotation!r}; "
        "use str, int, float, bool, list[str], dict[str, str] or an Optional of them"
    )


def _docstring_parts(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description (first paragraph) and each argument's help from the ``Args:`` section
    (Google style: ``name: text`` or ``name (type): text``, continued on deeper lines)."""
    lines = (inspect.getdoc(fn) or "").splitlines()
    description: list[str] = []
    for line in lines:
        if not line.strip() or line.strip() in _ARG_SECTIONS:
            break
        description.append(line.strip())
    helps: dict[str, str] = {}
    in_args, arg_indent, current = False, 0, ""
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped in _ARG_SECTIONS:
            in_args, arg_indent, current = True, 0, ""
        elif not in_args or not stripped:
            continue
        elif indent == 0:
            in_args = False  # the next section (``Returns:`` ...) starts at the margin
        else:
            arg_indent = arg_indent or indent
            m = _ARG_LINE.match(stripped)
            if indent == arg_indent and m:
                current = m.group(1)
                helps[current] = m.group(2).strip()
            elif current:
                helps[current] = f"{helps[current]} {stripped}".strip()
    return _plain(" ".join(description)), {k: _plain(v) for k, v in helps.items()}


def _plain(text: str) -> str:
    """``text`` without reStructuredText literal quotes (for terminal help)."""
    return text.replace("``", "")


# --------------------------------------------------------------------------- components


@dataclass(frozen=True)
class Component:
    """A component: its resolved ``name``, the function ``fn`` that returns the ``AppDef``
    and the first paragraph of its docstring as ``description``."""

    name: str
    fn: Callable[..., AppDef]
    description: str

    @functools.cached_property
    def _signature(self) -> tuple[list[_Param], _Param | None]:
        """The named arguments and the ``*args`` parameter (or None)."""
        try:
            hints = typing.get_type_hints(self.fn, include_extras=True)
        except Exception as err:
            raise ComponentError(f"component {self.name}: cannot read its type annotations: {err}") from err
        helps = _docstring_parts(self.fn)[1]
        params: list[_Param] = []
        varargs: _Param | None = None
        for p in inspect.signature(self.fn).parameters.values():
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                varargs = _Param(p.name, list, False, [], helps.get(p.name, ""))
                continue
            if p.kind in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY):
                raise ComponentError(f"component {self.name}: argument {p.name!r} must be a named parameter")
            kind, optional, checks = _base_type(self.name, p.name, hints.get(p.name, str))
            params.append(_Param(p.name, kind, optional or p.default is None, p.default, helps.get(p.name, ""), checks))
        return params, varargs

    def _with_defaults(self, defaults: dict[str, str] | None) -> list[_Param]:
        """The arguments with ``defaults`` (strings, converted) replacing the function's."""
        params, _ = self._signature
        by_name = {p.name: p for p in params}
        unknown = sorted(set(defaults or {}) - set(by_name))
        if unknown:
            raise ComponentError(
                f"component {self.name}: component_defaults name unknown argument(s) {', '.join(unknown)}; "
                f"arguments: {', '.join(by_name) or '(none)'}"
            )
        return [
            _Param(p.name, p.kind, p.optional, p.check((defaults or {})[p.name]), p.help, p.checks)
            if p.name in (defaults or {})
            else p
            for p in params
        ]

    def _parser(self, params: list[_Param]) -> _ArgumentParser:
        parser = _ArgumentParser(
            prog=self.name,
            description=self.description,
            add_help=False,
            allow_abbrev=False,
            exit_on_error=False,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        for p in params:
            note = "required" if p.default is _REQUIRED else f"default: {p.default!r}"
            flags = [p.flag] if p.flag.startswith("--") else [p.flag, f"-{p.flag}"]
            parser.add_argument(
                *flags,
                dest=p.name,
                metavar=p.name.upper(),
                help=f"{p.help} ({_TYPE_HELP[p.kind]}, {note})".lstrip(),
                default=argparse.SUPPRESS,
                # a bare ``--flag`` means true
                nargs="?" if p.kind is bool else None,
                const="true" if p.kind is bool else None,
            )
        varargs = self._signature[1]
        if varargs:
            parser.add_argument(
                varargs.name,
                nargs=argparse.REMAINDER,
                default=argparse.SUPPRESS,
                help=f"{varargs.help} (the words after the options, or after --)".lstrip(),
            )
        return parser

    def usage_text(self, defaults: dict[str, str] | None = None) -> str:
        """The component's help: synopsis, description and every argument."""
        return self._parser(self._with_defaults(defaults)).format_help()

    @property
    def usage(self) -> str:
        """The component's help with the function's own defaults."""
        return self.usage_text()

    def bind(self, args: list[str] | Mapping[str, Any], defaults: dict[str, str] | None = None) -> AppDef:
        """Call the function with ``args`` (CLI-style list or keyword dict) and return its app.

        Every problem with the arguments (unknown, missing, wrong type, rejected by the
        function) raises ``ComponentError`` carrying the usage text.
        """
        params = self._with_defaults(defaults)
        parser = self._parser(params)
        varargs_param = self._signature[1]
        varargs_name = varargs_param.name if varargs_param else None
        with self._usage_on_error(parser):
            if isinstance(args, Mapping):
                given, varargs = self._from_dict(params, varargs_name, dict(args))
            else:
                check_args_form(args)
                given, varargs = self._from_list(parser, params, varargs_name, list(args))
            kwargs: dict[str, Any] = {}
            for p in params:
                if p.name in given:
                    kwargs[p.name] = given[p.name]
                elif p.default is _REQUIRED:
                    raise ComponentError(f"missing required argument {p.flag} ({_TYPE_HELP[p.kind]}) {p.help}".rstrip())
                else:
                    kwargs[p.name] = p.default
            app = self.fn(*varargs, **kwargs)
        if not isinstance(app, AppDef):
            raise ComponentError(f"component {self.name}: returned {type(app).__name__}, not an AppDef")
        return app

    def check_args(self, args: list[str] | Mapping[str, Any], templated: Callable[[Any], bool]) -> None:
        """Check ``args`` as ``bind`` would, without calling the function (cheap enough for DAG
        parsing): unknown arguments (with the closest names) and values of the wrong type
        raise ``ComponentError`` with the usage text. Missing arguments pass (a connection's
        ``component_defaults`` may give them), as do the values ``templated`` says are
        templates; a list holding a template is left to ``bind``."""
        params, varargs = self._signature
        parser = self._default_parser
        varargs_name = varargs.name if varargs else None
        with self._usage_on_error(parser):
            if isinstance(args, Mapping):
                names = [p.name for p in params] + ([varargs_name] if varargs_name else [])
                for key in args:  # templated values too: their names are literal
                    if key not in names:
                        raise _unknown_argument(key, names)
                self._from_dict(params, varargs_name, {k: v for k, v in args.items() if not templated(v)})
            elif all(isinstance(a, str) and not templated(a) for a in args):
                self._from_list(parser, params, varargs_name, list(args))

    @functools.cached_property
    def _default_parser(self) -> _ArgumentParser:
        """The parser of the function's own arguments and defaults (made once: DAG parsing
        checks many tasks' arguments)."""
        return self._parser(self._signature[0])

    @contextmanager
    def _usage_on_error(self, parser: _ArgumentParser) -> Iterator[None]:
        """Re-raise a ``ComponentError`` naming the component: the error on its first line, then
        the short synopsis (not every argument's help, which drowned the error)."""
        try:
            yield
        except ComponentError as err:
            synopsis = parser.format_usage().rstrip()
            more = f"(`airflow-torchx builtins {self.name}` prints the component's arguments)"
            raise ComponentError(f"component {self.name}: {err}\n{synopsis}\n{more}") from err

    @staticmethod
    def _from_list(
        parser: _ArgumentParser, params: list[_Param], varargs_name: str | None, args: list[str]
    ) -> tuple[dict[str, Any], list[str]]:
        try:
            parsed, unknown = parser.parse_known_args(args)
        except argparse.ArgumentError as err:
            raise ComponentError(str(err)) from err
        if unknown:
            flag = next((u.partition("=")[0] for u in unknown if u.startswith("-")), "")
            hint = did_you_mean(flag, [p.flag for p in params]) if flag else ""
            raise ComponentError(f"unrecognized arguments: {' '.join(unknown)}.{hint}".rstrip("."))
        ns = vars(parsed)
        rest: list[str] = ns.pop(varargs_name, []) if varargs_name else []
        if rest[:1] == ["--"]:
            rest = rest[1:]
        by_name = {p.name: p for p in params}
        return {name: by_name[name].from_str(raw) for name, raw in ns.items()}, rest

    @staticmethod
    def _from_dict(
        params: list[_Param], varargs_name: str | None, args: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        by_name = {p.name: p for p in params}
        given: dict[str, Any] = {}
        varargs: list[str] = []
        for key, value in args.items():
            if varargs_name and key == varargs_name:
                varargs = [value] if isinstance(value, str) else value
                if not isinstance(varargs, list | tuple) or not all(isinstance(v, str) for v in varargs):
                    raise ComponentError(f"{key}: {value!r} must be a list of str")
                varargs = list(varargs)
            elif key in by_name:
                given[key] = by_name[key].check(value)
            else:
                raise _unknown_argument(key, [*by_name, *([varargs_name] if varargs_name else [])])
        return given, varargs


def check_args_form(args: Any) -> None:
    """Component arguments are a mapping (keyword arguments) or a list or tuple of str (a
    command line); anything else raises ``ComponentError`` naming ``component_args``, the value
    and what is allowed."""
    if isinstance(args, Mapping) or (isinstance(args, list | tuple) and all(isinstance(a, str) for a in args)):
        return
    raise ComponentError(
        f"component_args: {args!r} ({type(args).__name__}) is not allowed: give a list of str, as on a command "
        "line (['--msg', 'hi']), or a dict of keyword arguments ({'msg': 'hi'})"
    )


def _unknown_argument(key: str, allowed: list[str]) -> ComponentError:
    return ComponentError(
        f"unknown argument {key!r}; arguments: {', '.join(allowed) or '(none)'}.{did_you_mean(key, allowed)}"
    )


class _ArgumentParser(argparse.ArgumentParser):
    """An argparse parser that raises ``ComponentError`` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ComponentError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise ComponentError(message or f"argument parsing stopped (status {status})")


def _public_functions(module: types.ModuleType) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The public functions defined in ``module`` (not imported into it)."""
    for name, obj in vars(module).items():
        if not name.startswith("_") and inspect.isfunction(obj) and obj.__module__ == module.__name__:
            yield name, obj


def _make(name: str, fn: Callable[..., Any]) -> Component:
    return Component(name=name, fn=fn, description=_docstring_parts(fn)[0])


def _entry_point_components(only: str | None = None) -> dict[str, Component]:
    """Components registered through entry points (only those that could be ``only``)."""
    found: dict[str, Component] = {}
    for ep in metadata.entry_points(group=COMPONENT_ENTRY_POINT_GROUP):
        if only is not None and only != ep.name and not only.startswith(ep.name + "."):
            continue
        try:
            target = ep.load()
        except Exception as err:
            if only is not None:
                raise ComponentError(
                    f"component {only}: entry point {ep.name} = {ep.value} failed to load: {err}"
                ) from err
            log.warning("skipping component entry point %s = %s: %s", ep.name, ep.value, err)
            continue
        if isinstance(target, types.ModuleType):
            for fn_name, fn in _public_functions(target):
                found[f"{ep.name}.{fn_name}"] = _make(f"{ep.name}.{fn_name}", fn)
        elif callable(target):
            found[ep.name] = _make(ep.name, target)
    return found


def builtin_components() -> dict[str, Component]:
    """The builtin components (``utils.*``, ``dist.*``) by name."""
    found: dict[str, Component] = {}
    for mod_name in _BUILTIN_MODULES:
        module = importlib.import_module(f"{__name__}.{mod_name}")
        for fn_name, fn in _public_functions(module):
            found[f"{mod_name}.{fn_name}"] = _make(f"{mod_name}.{fn_name}", fn)
    return found


def list_components() -> dict[str, Component]:
    """Every named component: entry points' and the builtins (an entry point wins a clash)."""
    return {**builtin_components(), **_entry_point_components()}


def _file_component(name: str) -> Component:
    """``path/to/file.py:function`` loaded from the file."""
    path_str, _, fn_name = name.rpartition(":")
    path = Path(path_str).expanduser()
    if not path.is_file():
        raise ComponentError(f"component {name}: file {path_str!r} does not exist")
    mod_name = f"_airflow_torchx_component_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ComponentError(f"component {name}: {path_str!r} cannot be loaded as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # lets dataclasses and get_type_hints see the module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(mod_name, None)
        raise ComponentError(f"component {name}: loading {path_str!r} failed: {err!r}") from err
    functions = dict(_public_functions(module))
    if fn_name not in functions:
        raise ComponentError(
            f"component {name}: {path_str!r} has no function {fn_name!r}; "
            f"its functions: {', '.join(functions) or '(none)'}"
        )
    return _make(name, functions[fn_name])


def get_component(name: str) -> Component:
    """The component called ``name``: an entry point's, a builtin or ``file.py:function``.

    An unknown name raises ``ComponentError`` with the closest known names.
    """
    found = _entry_point_components(only=name).get(name) or builtin_components().get(name)
    if found:
        return found
    if ":" in name:
        return _file_component(name)
    known = list_components()
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    raise ComponentError(
        f"component: unknown component {name!r}.{hint}\n\n"
        "usage: COMPONENT is a registered or builtin component name or path/to/file.py:function; "
        f"known components: {', '.join(sorted(known))}"
    )


def get_app(name: str, args: list[str] | Mapping[str, Any], defaults: dict[str, str] | None = None) -> AppDef:
    """Resolve component ``name`` and call it with ``args``: a CLI-style list (``["--msg",
    "hi"]``, then ``*args`` after the options or after ``--``) or a dict of keyword arguments
    (values of the right type, or strings to convert; ``*args`` under its parameter name).
    ``defaults`` (strings) replace the function's defaults. Raises ``ComponentError``."""
    return get_component(name).bind(args, defaults)
