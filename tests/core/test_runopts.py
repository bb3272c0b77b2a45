"""Typed run options: ``cfg_from_str`` parsing, ``check`` vs ``resolve``, errors that name the
option and list the valid ones, and the usage text."""

from __future__ import annotations

import pytest

from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.runopts import runopt, runopts


def _local_opts() -> runopts:
    """The local scheduler seed's options."""
    opts = runopts()
    opts.add("log_dir", str, "Directory to write stdout/stderr log files of replicas.")
    opts.add(
        "prepend_cwd",
        bool,
        "If set, prepends CWD to replica's PATH env var making binaries in CWD take precedence.",
        default=False,
    )
    opts.add(
        "auto_set_cuda_visible_devices",
        bool,
        "Sets CUDA_VISIBLE_DEVICES for roles that request GPU resources.",
        default=False,
    )
    return opts


def _typed_opts() -> runopts:
    """One option of every type, plus a required one."""
    opts = runopts()
    opts.add("queue", str, "Queue to schedule job in.", required=True)
    opts.add("name", str, "a string", default="runner")
    opts.add("flag", bool, "a bool", default=False)
    opts.add("count", int, "an int", default=0)
    opts.add("ratio", float, "a float", default=0.5)
    opts.add("items", list, "a list")
    opts.add("tags", dict, "a dict")
    return opts


# --------------------------------------------------------------------------- cfg_from_str


def test_cfg_from_str_seed_example() -> None:
    assert _local_opts().cfg_from_str("log_dir=/tmp/foobar", "prepend_cwd=True") == {
        "log_dir": "/tmp/foobar",
        "prepend_cwd": True,
    }


def test_cfg_from_str_several_pairs_in_one_literal() -> None:
    assert _local_opts().cfg_from_str("log_dir=/tmp/foobar,prepend_cwd=True,auto_set_cuda_visible_devices=0") == {
        "log_dir": "/tmp/foobar",
        "prepend_cwd": True,
        "auto_set_cuda_visible_devices": False,
    }
    assert _local_opts().cfg_from_str("log_dir=/x; prepend_cwd=yes") == {"log_dir": "/x", "prepend_cwd": True}


def test_cfg_from_str_gives_only_what_was_given() -> None:
    assert _typed_opts().cfg_from_str() == {}
    assert _typed_opts().cfg_from_str("", " , ") == {}
    assert _typed_opts().cfg_from_str("count=3,") == {"count": 3}


def test_cfg_from_str_later_pairs_win() -> None:
    assert _typed_opts().cfg_from_str("count=1", "count=2,count=3") == {"count": 3}


@pytest.mark.parametrize(
    ("literal", "expected"),
    [
        ("flag=True", True),
        ("flag=true", True),
        ("flag=1", True),
        ("flag=yes", True),
        ("flag=ON", True),
        ("flag=False", False),
        ("flag=false", False),
        ("flag=0", False),
        ("flag=no", False),
        ("flag=off", False),
    ],
)
def test_cfg_from_str_bool(literal: str, expected: bool) -> None:
    assert _typed_opts().cfg_from_str(literal) == {"flag": expected}


@pytest.mark.parametrize(
    ("literal", "key", "expected"),
    [
        ("count=42", "count", 42),
        ("count=-7", "count", -7),
        ("ratio=2.5", "ratio", 2.5),
        ("ratio=3", "ratio", 3.0),
        ("ratio=1e-3", "ratio", 0.001),
        ("name=alice", "name", "alice"),
        ("name= spaced ", "name", "spaced"),
        ("name=a=b", "name", "a=b"),  # only the first "=" splits key from value
        ("name=", "name", ""),
        ("queue=arn:aws:batch:us-east-1:1:job-queue/q", "queue", "arn:aws:batch:us-east-1:1:job-queue/q"),
        ("items=a", "items", ["a"]),
        ("items=a,b", "items", ["a", "b"]),
        ("items=a;b", "items", ["a", "b"]),
        ("items=a, b ;c", "items", ["a", "b", "c"]),
        ("items=nofile:1024:2048,core:0:0", "items", ["nofile:1024:2048", "core:0:0"]),
        ("items=", "items", []),
        ("tags=k:v", "tags", {"k": "v"}),
        ("tags=k1:v1,k2:v2", "tags", {"k1": "v1", "k2": "v2"}),
        ("tags=k1:v1;k2:v2", "tags", {"k1": "v1", "k2": "v2"}),
        ("tags=url:http://x", "tags", {"url": "http://x"}),  # split at the first ":"
    ],
)
def test_cfg_from_str_types(literal: str, key: str, expected: object) -> None:
    out = _typed_opts().cfg_from_str(literal)
    assert out == {key: expected}
    assert type(out[key]) is type(expected)


def test_list_value_runs_until_the_next_key() -> None:
    # docs/cli.md: pairs split at the last "," or ";" before the next "key=".
    assert _typed_opts().cfg_from_str("items=v1,v2,count=3") == {"items": ["v1", "v2"], "count": 3}
    assert _typed_opts().cfg_from_str("items=v1;v2;tags=a:1,b:2,flag=true") == {
        "items": ["v1", "v2"],
        "tags": {"a": "1", "b": "2"},
        "flag": True,
    }


def test_api_sheet_rule_foo_bar() -> None:
    opts = runopts()
    opts.add("FOO", list, "a list")
    opts.add("BAR", str, "a str")
    assert opts.cfg_from_str("FOO=v1,v2,BAR=v3") == {"FOO": ["v1", "v2"], "BAR": "v3"}


@pytest.mark.parametrize(
    ("literal", "shown"),
    [
        ("count=abc", "count='abc' is not a valid int"),
        ("count=1.5", "count='1.5' is not a valid int"),
        ("ratio=fast", "ratio='fast' is not a valid float"),
        ("flag=maybe", "flag='maybe' is not a valid bool"),
        ("flag=", "flag='' is not a valid bool"),
        ("tags=novalue", "tags='novalue' is not a valid dict"),
        ("tags=:v", "tags=':v' is not a valid dict"),
    ],
)
def test_cfg_from_str_wrong_type_names_the_option_and_what_it_takes(literal: str, shown: str) -> None:
    """One short line: the option, the value, its type and help; not every option's usage."""
    with pytest.raises(InvalidRunConfigError) as exc:
        _typed_opts().cfg_from_str(literal)
    msg = str(exc.value)
    key = literal.split("=")[0]
    assert msg.startswith(f"cfg: {shown}") and msg.endswith(f"; {key}: {_typed_opts().get(key).help}")
    assert "queue" not in msg and "usage" not in msg


def test_wrong_bool_and_dict_say_what_is_allowed() -> None:
    with pytest.raises(InvalidRunConfigError, match="true/false"):
        _typed_opts().cfg_from_str("flag=2")
    with pytest.raises(InvalidRunConfigError, match="k1:v1,k2:v2"):
        _typed_opts().cfg_from_str("tags=a")


def test_a_minimum_is_checked_wherever_values_are() -> None:
    opts = runopts()
    opts.add("timeout", int, "Seconds (at least 60).", minimum=60)
    opts.add("ratio", float, "A share.", minimum=0.5)
    assert opts.cfg_from_str("timeout=60,ratio=0.5") == {"timeout": 60, "ratio": 0.5}
    assert opts.resolve({"timeout": "61"}) == {"timeout": 61, "ratio": None}
    seconds, share = "; timeout: Seconds (at least 60).", "; ratio: A share."
    refused = [
        (lambda: opts.cfg_from_str("timeout=59"), "timeout=59 is below its minimum: it must be an int >= 60", seconds),
        (lambda: opts.check({"timeout": -1}), "timeout=-1 is below its minimum: it must be an int >= 60", seconds),
        (lambda: opts.resolve({"ratio": 0.25}), "ratio=0.25 is below its minimum: it must be a float >= 0.5", share),
    ]
    for call, shown, help_text in refused:
        with pytest.raises(InvalidRunConfigError) as exc:
            call()
        assert shown in str(exc.value) and help_text in str(exc.value), str(exc.value)


def test_only_numbers_take_a_minimum_and_a_default_must_reach_it() -> None:
    opts = runopts()
    with pytest.raises(TypeError, match="'name' has a minimum, but only int and float options take one"):
        opts.add("name", str, "A name.", minimum=1)
    with pytest.raises(InvalidRunConfigError, match="n=0 is below its minimum"):
        opts.add("n", int, "n", default=0, minimum=1)
    assert len(opts) == 0


def test_cfg_from_str_unknown_key_lists_valid_options() -> None:
    with pytest.raises(InvalidRunConfigError) as exc:
        _local_opts().cfg_from_str("log_dir=/x,logdir=/y")
    msg = str(exc.value)
    assert "'logdir'" in msg
    assert "valid options: auto_set_cuda_visible_devices, log_dir, prepend_cwd. Did you mean 'log_dir'?" in msg
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize("literal", ["log_dir", "=x", "prepend_cwd"])
def test_cfg_from_str_not_a_pair(literal: str) -> None:
    with pytest.raises(InvalidRunConfigError) as exc:
        _local_opts().cfg_from_str(literal)
    msg = str(exc.value)
    assert "key=value" in msg and repr(literal) in msg
    assert "log_dir, prepend_cwd" in msg


def test_cfg_from_str_does_not_check_required() -> None:
    # Required options are checked when the final cfg is resolved (as TorchX's resolve does).
    assert _typed_opts().cfg_from_str("count=1") == {"count": 1}


# --------------------------------------------------------------------------- check / resolve


def test_check_type_checks_without_defaults_or_required() -> None:
    opts = _typed_opts()
    assert opts.check(None) == {}
    assert opts.check({"count": 2}) == {"count": 2}
    assert opts.check({"count": "2", "flag": "true", "items": "a,b", "tags": "k:v"}) == {
        "count": 2,
        "flag": True,
        "items": ["a", "b"],
        "tags": {"k": "v"},
    }
    # ints are floats too; tuples are lists
    ratio = opts.check({"ratio": 1, "items": ("x",)})  # type: ignore[dict-item]
    assert ratio == {"ratio": 1.0, "items": ["x"]}
    assert type(ratio["ratio"]) is float


@pytest.mark.parametrize(
    ("cfg", "shown"),
    [
        ({"count": True}, "count=True has type bool; expected int"),
        ({"count": 1.5}, "count=1.5 has type float; expected int"),
        ({"flag": 1}, "flag=1 has type int; expected bool"),
        ({"name": 3}, "name=3 has type int; expected str"),
        ({"ratio": False}, "ratio=False has type bool; expected float"),
        ({"items": ["a", 1]}, "items=['a', 1] has type list; expected list"),
        ({"items": {"a": "b"}}, "has type dict; expected list"),
        ({"tags": {"a": 1}}, "tags={'a': 1} has type dict; expected dict"),
        ({"tags": ["a"]}, "has type list; expected dict"),
        ({"count": "many"}, "count='many' is not a valid int"),
    ],
)
def test_check_wrong_type(cfg: dict[str, object], shown: str) -> None:
    with pytest.raises(InvalidRunConfigError) as exc:
        _typed_opts().check(cfg)  # type: ignore[arg-type]
    msg = str(exc.value)
    assert msg.startswith("cfg: ")
    assert shown in msg
    key = next(iter(cfg))
    assert msg.endswith(f"; {key}: {_typed_opts().get(key).help}")  # what it takes; not every option's usage
    assert "usage" not in msg and "\n" not in msg


def test_check_unknown_key() -> None:
    with pytest.raises(InvalidRunConfigError, match=r"unknown option 'queu'; valid options: count, flag, items"):
        _typed_opts().check({"queu": "q"})


def test_resolve_fills_defaults() -> None:
    assert _typed_opts().resolve({"queue": "q"}) == {
        "queue": "q",
        "name": "runner",
        "flag": False,
        "count": 0,
        "ratio": 0.5,
        "items": None,
        "tags": None,
    }
    assert _local_opts().resolve(None) == {
        "log_dir": None,
        "prepend_cwd": False,
        "auto_set_cuda_visible_devices": False,
    }


def test_resolve_keeps_given_values_and_parses_strings() -> None:
    out = _typed_opts().resolve({"queue": "q", "name": "n", "count": "5", "flag": True, "ratio": None})
    assert out["name"] == "n" and out["count"] == 5 and out["flag"] is True
    assert out["ratio"] == 0.5  # None means "not given"


def test_resolve_returns_a_new_dict() -> None:
    cfg = {"queue": "q"}
    out = _typed_opts().resolve(cfg)
    assert cfg == {"queue": "q"} and out is not cfg


@pytest.mark.parametrize("cfg", [None, {}, {"queue": None}, {"count": 1}])
def test_resolve_missing_required(cfg: dict[str, object] | None) -> None:
    with pytest.raises(InvalidRunConfigError) as exc:
        _typed_opts().resolve(cfg)  # type: ignore[arg-type]
    msg = str(exc.value)
    assert "required option 'queue' is missing" in msg
    assert "Queue to schedule job in." in msg
    assert "usage: queue=QUEUE,[name=NAME],[flag=FLAG],[count=COUNT],[ratio=RATIO],[items=ITEMS],[tags=TAGS]" in msg


def test_check_accepts_what_resolve_rejects() -> None:
    opts = _typed_opts()
    partial = {"count": 3}
    assert opts.check(partial) == {"count": 3}
    with pytest.raises(InvalidRunConfigError, match="queue"):
        opts.resolve(partial)


# --------------------------------------------------------------------------- declaring


def test_add_rejects_bad_declarations() -> None:
    opts = runopts()
    with pytest.raises(TypeError, match="'x'"):
        opts.add("x", set, "a set")
    with pytest.raises(ValueError, match="required option 'y' cannot have a default"):
        opts.add("y", str, "y", default="d", required=True)
    with pytest.raises(InvalidRunConfigError, match="z=5 has type int; expected str"):
        opts.add("z", str, "z", default=5)
    assert len(opts) == 0


def test_add_stores_the_default_in_its_type() -> None:
    opts = runopts()
    opts.add("n", int, "n", default="3")
    opts.add("r", float, "r", default=2)
    assert opts.resolve(None) == {"n": 3, "r": 2.0}


def test_get_iter_len_update() -> None:
    opts = _local_opts()
    assert opts.get("prepend_cwd") == runopt(
        default=False,
        opt_type=bool,
        is_required=False,
        help="If set, prepends CWD to replica's PATH env var making binaries in CWD take precedence.",
    )
    assert opts.get("nope") is None
    assert [name for name, _ in opts] == ["log_dir", "prepend_cwd", "auto_set_cuda_visible_devices"]
    assert len(opts) == 3
    more = runopts()
    more.add("extra", int, "extra", default=1)
    opts.update(more)
    assert len(opts) == 4 and opts.resolve(None)["extra"] == 1


# --------------------------------------------------------------------------- usage text


def test_str_matches_the_seed_layout() -> None:
    assert str(_local_opts()) == (
        "usage:\n"
        "    [log_dir=LOG_DIR],[prepend_cwd=PREPEND_CWD],"
        "[auto_set_cuda_visible_devices=AUTO_SET_CUDA_VISIBLE_DEVICES]\n"
        "\n"
        "optional arguments:\n"
        "    log_dir=LOG_DIR (str, None)\n"
        "        Directory to write stdout/stderr log files of replicas.\n"
        "    prepend_cwd=PREPEND_CWD (bool, False)\n"
        "        If set, prepends CWD to replica's PATH env var making binaries in CWD take precedence.\n"
        "    auto_set_cuda_visible_devices=AUTO_SET_CUDA_VISIBLE_DEVICES (bool, False)\n"
        "        Sets CUDA_VISIBLE_DEVICES for roles that request GPU resources.\n"
    )


def test_str_shows_required_first() -> None:
    opts = runopts()
    opts.add("user", str, "The username.", default="runner")
    opts.add("queue", str, "Queue to schedule job in.", required=True)
    assert opts.usage() == "[user=USER],queue=QUEUE"
    assert str(opts) == (
        "usage:\n"
        "    [user=USER],queue=QUEUE\n"
        "\n"
        "required arguments:\n"
        "    queue=QUEUE (str)\n"
        "        Queue to schedule job in.\n"
        "\n"
        "optional arguments:\n"
        "    user=USER (str, runner)\n"
        "        The username.\n"
    )


def test_str_of_no_options() -> None:
    assert str(runopts()) == "usage:\n"
    assert runopts().usage() == ""
