"""Builtin components, component resolution and argument binding."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_provider_torchx.core.components import (
    COMPONENT_ENTRY_POINT_GROUP,
    ComponentError,
    get_app,
    get_component,
    list_components,
)
from airflow_provider_torchx.core.specs import BindMount, DeviceMount, macros, named_resources, validate_app

# --------------------------------------------------------------------------- builtins


def test_echo_defaults_and_args() -> None:
    app = get_app("utils.echo", [])
    validate_app(app)
    (role,) = app.roles
    assert (app.name, role.name, role.entrypoint, role.args, role.num_replicas) == (
        "echo",
        "echo",
        "echo",
        ["hello world"],
        1,
    )
    assert role.image == "busybox"
    assert role.resource.cpu == 1 and role.resource.memMB == 1024
    app = get_app("utils.echo", ["--msg", "hi there", "--num_replicas", "3", "--image", "img:1"])
    assert (app.roles[0].args, app.roles[0].num_replicas, app.roles[0].image) == (["hi there"], 3, "img:1")


def test_sh_joins_args_into_one_command_line() -> None:
    app = get_app(
        "utils.sh",
        [
            "--env",
            "A=1,B=x,y",
            "--mounts",
            "type=bind,src=/a,dst=/b,readonly",
            "--num_replicas",
            "2",
            "echo",
            "$A",
            "&&",
            "ls",
            "-l",
        ],
    )
    validate_app(app)
    (role,) = app.roles
    assert (role.entrypoint, role.args) == ("sh", ["-c", "echo $A && ls -l"])
    assert role.env == {"A": "1", "B": "x,y"}
    assert role.mounts == [BindMount(src_path="/a", dst_path="/b", read_only=True)]
    assert role.num_replicas == 2
    assert (role.resource.cpu, role.resource.gpu, role.resource.memMB) == (1, 0, 1024)


def test_sh_options_after_the_command_belong_to_the_command() -> None:
    app = get_app("utils.sh", ["--cpu", "4", "grep", "--cpu", "x"])
    assert app.roles[0].args == ["-c", "grep --cpu x"]
    assert app.roles[0].resource.cpu == 4


def test_sh_named_resource_wins_over_numbers() -> None:
    app = get_app("utils.sh", ["-h", "aws_p3.2xlarge", "--cpu", "3", "nvidia-smi"])
    assert app.roles[0].resource == named_resources["aws_p3.2xlarge"]
    assert app.roles[0].resource.capabilities == {"instanceType": "p3.2xlarge"}


def test_sh_device_mount_and_dict_args() -> None:
    app = get_app("utils.sh", {"args": ["true"], "mounts": ["type=device", "src=/dev/fuse"], "max_retries": 2})
    assert app.roles[0].mounts == [DeviceMount(src_path="/dev/fuse", dst_path="/dev/fuse", permissions="rwm")]
    assert app.roles[0].max_retries == 2


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-m", "http.server", "8000"], ["-m", "http.server", "8000"]),
        (["-c", "print(1)", "--", "--flag"], ["-c", "print(1)", "--flag"]),
        (["--script", "train.py", "a", "b"], ["train.py", "a", "b"]),
    ],
)
def test_python_module_code_or_script(args: list[str], expected: list[str]) -> None:
    app = get_app("utils.python", args)
    validate_app(app)
    (role,) = app.roles
    assert (role.entrypoint, role.args, role.image, app.name, role.name) == (
        "python",
        expected,
        "python:3.11-slim",
        "python",
        "python",
    )


@pytest.mark.parametrize("args", [[], ["-m", "a", "-c", "b"], ["-m", "a", "--script", "x.py", "-c", "c"]])
def test_python_needs_exactly_one_of_m_c_script(args: list[str]) -> None:
    with pytest.raises(ComponentError, match=r"-m/-c/--script: give exactly one") as err:
        get_app("utils.python", args)
    assert "usage: utils.python" in str(err.value)


def test_touch_requires_file() -> None:
    app = get_app("utils.touch", ["--file", "/tmp/x"])
    assert (app.roles[0].entrypoint, app.roles[0].args) == ("touch", ["/tmp/x"])
    with pytest.raises(ComponentError, match=r"missing required argument --file"):
        get_app("utils.touch", [])


def test_spmd_single_node_uses_localhost() -> None:
    app = get_app("dist.spmd", ["--script", "train.py", "--", "--lr", "0.1", "a b"])
    validate_app(app)
    (role,) = app.roles
    assert (app.name, role.name, role.num_replicas, role.entrypoint) == ("spmd", "train", 1, "sh")
    assert role.args == [
        "-c",
        "export OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1}; exec torchrun --nnodes 1 --nproc_per_node 2 "
        "--rdzv_backend c10d --rdzv_endpoint localhost:0 --rdzv_id ${app_id} --tee 2 --role '' train.py --lr 0.1 'a b'",
    ]
    assert role.port_map == {"c10d": 29500}
    # Each rank's stderr is tee'd into a file of its own, and reaches the log unprefixed.
    assert role.env == {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "${role_name}"}


def test_spmd_multi_node_takes_the_schedulers_port_unless_given_one() -> None:
    (role,) = get_app("dist.spmd", ["-j", "2x1", "--script", "t.py"]).roles
    rendered = macros.Values(img_root="", app_id="job-1", replica_id="0", rank0_env="MASTER_ADDR").apply(role)
    assert " --rdzv_endpoint $MASTER_ADDR:${TORCHX_PORT_C10D:-29500} " in rendered.args[1]
    assert role.port_map == {"c10d": 29500}


def test_spmd_multi_node_reads_rank0_env_through_the_shell() -> None:
    app = get_app(
        "dist.spmd",
        [
            "-j",
            "3x4",
            "-m",
            "pkg.train",
            "--rdzv_port",
            "1234",
            "--debug",
            "--env",
            "LOGLEVEL=INFO",
            "-h",
            "aws_g5.xlarge",
        ],
    )
    (role,) = app.roles
    assert (role.name, role.num_replicas, role.port_map) == ("train", 3, {"c10d": 1234})
    assert role.env["LOGLEVEL"] == "INFO" and role.env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert role.resource.capabilities == {"instanceType": "g5.xlarge"}
    rendered = macros.Values(img_root="", app_id="job-1", replica_id="2", rank0_env="MASTER_ADDR").apply(role)
    assert rendered.args[1] == (
        "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; exec torchrun --nnodes 3 --nproc_per_node 4 "
        "--rdzv_backend c10d --rdzv_endpoint $MASTER_ADDR:1234 --rdzv_id job-1 --tee 2 --role '' -m pkg.train"
    )


def test_spmd_omp_threads_default_to_the_cpus_of_each_process_unless_set() -> None:
    (role,) = get_app("dist.spmd", ["-j", "2x4", "--cpu", "10", "--script", "t.py"]).roles
    rendered = macros.Values(img_root="", app_id="job-1", replica_id="0", rank0_env="MASTER_ADDR").apply(role)
    for env, threads in (({}, "2"), ({"OMP_NUM_THREADS": "7"}, "7")):
        done = subprocess.run(
            ["sh", "-c", rendered.args[1].split("; exec ")[0] + '; echo "$OMP_NUM_THREADS"'],
            env={"PATH": os.environ["PATH"], **env},
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.strip() == threads, (env, done)


@pytest.mark.parametrize("j", ["0x2", "2x0", "x2", "2x", "abc", "1x2x3", "-1"])
def test_spmd_bad_j(j: str) -> None:
    with pytest.raises(ComponentError, match=r"-j: .* is not NODESxPROCS or PROCS") as err:
        get_app("dist.spmd", ["-j", j, "--script", "t.py"])
    assert "usage: dist.spmd" in str(err.value)


def test_spmd_j_procs_only_and_needs_one_target() -> None:
    assert get_app("dist.spmd", {"j": "8", "script": "t.py"}).roles[0].num_replicas == 1
    with pytest.raises(ComponentError, match=r"--script/-m: give exactly one"):
        get_app("dist.spmd", ["-j", "2"])


# --------------------------------------------------------------------------- binding


def test_dict_args_typed_or_strings_and_varargs() -> None:
    app = get_app("utils.sh", {"args": ["echo", "hi"], "num_replicas": "2", "cpu": 3, "env": {"A": "b"}, "h": None})
    (role,) = app.roles
    assert (role.args, role.num_replicas, role.resource.cpu, role.env) == (["-c", "echo hi"], 2, 3, {"A": "b"})
    assert get_app("utils.sh", {"args": "echo one string"}).roles[0].args == ["-c", "echo one string"]


def test_bool_forms() -> None:
    for args, expected in (([], False), (["--debug"], True), (["--debug", "false"], False), (["--debug=yes"], True)):
        env = get_app("dist.spmd", [*args, "--script", "t.py"]).roles[0].env
        assert ("TORCH_DISTRIBUTED_DEBUG" in env) is expected, args
    assert "NCCL_DEBUG" in get_app("dist.spmd", {"script": "t.py", "debug": True}).roles[0].env


def test_defaults_replace_function_defaults() -> None:
    app = get_app("utils.echo", [], defaults={"msg": "from defaults", "num_replicas": "2"})
    assert (app.roles[0].args, app.roles[0].num_replicas) == (["from defaults"], 2)
    assert get_app("utils.echo", ["--msg", "given"], defaults={"msg": "d"}).roles[0].args == ["given"]
    assert get_app("utils.touch", [], defaults={"file": "/tmp/f"}).roles[0].args == ["/tmp/f"]
    assert "default: 'from defaults'" in get_component("utils.echo").usage_text({"msg": "from defaults"})


@pytest.mark.parametrize(
    ("defaults", "pattern"),
    [
        ({"nope": "1"}, r"component_defaults name unknown argument\(s\) nope"),
        ({"num_replicas": "x"}, r"not a valid int"),
    ],
)
def test_bad_defaults(defaults: dict[str, str], pattern: str) -> None:
    with pytest.raises(ComponentError, match=pattern):
        get_app("utils.echo", [], defaults=defaults)


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["--nope", "1"], r"unrecognized arguments: --nope 1"),
        (["positional"], r"unrecognized arguments: positional"),
        (["--num_replicas", "two"], r"--num_replicas: 'two' is not a valid int"),
        (["--num_replicas"], r"--num_replicas: expected one argument"),
        (["--help"], r"unrecognized arguments: --help"),
        ({"nope": 1}, r"unknown argument 'nope'; arguments: msg, image, num_replicas"),
        ({"mgs": "hi"}, r"unknown argument 'mgs'; arguments: msg, image, num_replicas\. Did you mean 'msg'\?"),
        (["--mgs", "hi"], r"unrecognized arguments: --mgs hi\. Did you mean '--msg'"),
        (["--mgs=hi"], r"unrecognized arguments: --mgs=hi\. Did you mean '--msg'"),
        ({"num_replicas": 2.5}, r"--num_replicas: 2.5 is a float; expected int"),
        ({"num_replicas": True}, r"--num_replicas: True is a bool; expected int"),
        ({"msg": None}, r"--msg: None is a NoneType; expected str"),
        ({"msg": ["a"]}, r"--msg: \['a'\] is a list; expected str"),
        ("--msg hi", r"component_args: '--msg hi' \(str\) is not allowed: give a list of str"),
        ({"num_replicas": 0}, r"--num_replicas: 0 is not allowed: it must be an int >= 1"),
        (["--num_replicas", "-1"], r"--num_replicas: -1 is not allowed: it must be an int >= 1"),
    ],
)
def test_bad_args_raise_component_error_with_a_short_usage(args: object, pattern: str) -> None:
    """The error on the first line, then the one-line synopsis; not every argument's help."""
    with pytest.raises(ComponentError, match=pattern) as err:
        get_app("utils.echo", args)  # type: ignore[arg-type]
    first, synopsis, pointer = str(err.value).splitlines()
    assert re.search(pattern, first) and first.startswith("component utils.echo: ")
    assert synopsis == "usage: utils.echo [--msg MSG] [--image IMAGE] [--num_replicas NUM_REPLICAS]"
    assert pointer == "(`airflow-torchx builtins utils.echo` prints the component's arguments)"


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ({"env": "A"}, r"--env: 'A' is not a valid dict of str \(k1=v1,k2=v2\)"),
        ({"env": {"A": 1}}, r"--env: \{'A': 1\} is a dict; expected dict of str"),
        ({"args": [1]}, r"args: \[1\] must be a list of str"),
        ({"args": ["true"], "mounts": ["type=bind", "src=/a"]}, r"--mounts: mounts: type=bind needs dst="),
        (
            {"args": ["true"], "h": "aws_p3.2xlarg"},
            r"-h: resource: unknown named resource 'aws_p3.2xlarg'. Did you mean 'aws_p3.2xlarge'",
        ),
        ([], r"args: utils.sh needs a command line"),
    ],
)
def test_bad_sh_args(args: object, pattern: str) -> None:
    with pytest.raises(ComponentError, match=pattern):
        get_app("utils.sh", args)  # type: ignore[arg-type]


def test_usage_comes_from_signature_and_docstring() -> None:
    comp = get_component("utils.sh")
    assert comp.name == "utils.sh"
    assert comp.description == 'Runs its arguments as one shell command line (sh -c "ARGS...").'
    usage = comp.usage
    assert usage.startswith("usage: utils.sh ")
    # a multi-line help is joined; single-letter arguments take one dash
    assert "the command line; the words are joined with spaces, so pipes, &&" in " ".join(usage.split())
    assert "-h H, --h H" in usage
    assert "memory per replica in MB (int, default: 1024)" in " ".join(usage.split())


# --------------------------------------------------------------------------- resolution


def test_list_components_has_every_builtin() -> None:
    assert {"utils.echo", "utils.sh", "utils.python", "utils.touch", "dist.spmd"} <= set(list_components())
    assert all(c.description for c in list_components().values())


def test_unknown_component_suggests_close_names() -> None:
    with pytest.raises(ComponentError, match=r"unknown component 'utils.ehco'. Did you mean utils.echo") as err:
        get_component("utils.ehco")
    assert "path/to/file.py:function" in str(err.value)
    with pytest.raises(ComponentError, match=r"unknown component 'nothing_like_it'\.\n"):
        get_component("nothing_like_it")


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


FILE_COMPONENT = """
    from __future__ import annotations

    from typing import Optional

    from airflow_provider_torchx.core.specs import AppDef, Role

    def train(
        *extra: str, epochs: int, lr: float = 0.1, tags: Optional[list[str]] = None, verbose: bool = False
    ) -> AppDef:
        '''Trains a thing.

        Args:
            extra: passed on
            epochs: how many epochs
            lr (float): the learning rate
        '''
        args = [str(epochs), str(lr), ",".join(tags or []), str(verbose), *extra]
        return AppDef(name="train", roles=[Role(name="trainer", image="img", entrypoint="train", args=args)])

    def not_an_app() -> str:
        return "oops"

    def bad_type(x: set) -> AppDef:
        return AppDef(name="x")

    def _private() -> None:
        pass
"""


def test_file_component(tmp_path: Path) -> None:
    path = _write(tmp_path / "comps" / "my.py", FILE_COMPONENT)
    app = get_app(f"{path}:train", ["--epochs", "3", "--tags", "a,b", "--verbose=true", "x", "-y"])
    assert app.roles[0].args == ["3", "0.1", "a,b", "True", "x", "-y"]
    assert get_app(f"{path}:train", {"epochs": 1, "lr": 1, "extra": ["z"]}).roles[0].args == [
        "1",
        "1.0",
        "",
        "False",
        "z",
    ]
    comp = get_component(f"{path}:train")
    assert comp.description == "Trains a thing."
    assert "the learning rate (float, default: 0.1)" in comp.usage
    with pytest.raises(ComponentError, match=r"missing required argument --epochs \(int\) how many epochs"):
        get_app(f"{path}:train", [])
    with pytest.raises(ComponentError, match=r"returned str, not an AppDef"):
        get_app(f"{path}:not_an_app", [])
    with pytest.raises(ComponentError, match=r"argument 'x' has the unsupported type"):
        get_app(f"{path}:bad_type", [])


def test_file_component_errors(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.py", FILE_COMPONENT)
    with pytest.raises(ComponentError, match=r"has no function '_private'; its functions: train, not_an_app, bad_type"):
        get_component(f"{path}:_private")
    with pytest.raises(ComponentError, match=r"file '.*missing.py' does not exist"):
        get_component(f"{tmp_path}/missing.py:train")
    broken = _write(tmp_path / "broken.py", "raise RuntimeError('boom')\n")
    with pytest.raises(ComponentError, match=r"loading '.*broken.py' failed: RuntimeError\('boom'\)"):
        get_component(f"{broken}:train")


@pytest.fixture
def fake_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real installed distribution (a ``dist-info`` on ``sys.path``) registering components:
    a module ``mycomps`` (as ``team``), a single function (as ``solo``) and a module that
    shadows the builtin ``utils``."""
    root = tmp_path / "site"
    _write(
        root / "fake_comps.py",
        """
        from airflow_provider_torchx.core.specs import AppDef, Role

        def hello(who: str = "world") -> AppDef:
            '''Says hello.'''
            return AppDef(name="hello", roles=[Role(name="hi", image="i", entrypoint="echo", args=[who])])

        def echo(msg: str = "shadowed") -> AppDef:
            '''An echo that shadows the builtin.'''
            return AppDef(name="mine", roles=[Role(name="mine", image="i", entrypoint="echo", args=[msg])])
        """,
    )
    dist_info = root / "fake_comps-1.0.dist-info"
    _write(dist_info / "METADATA", "Metadata-Version: 2.1\nName: fake-comps\nVersion: 1.0\n")
    _write(
        dist_info / "entry_points.txt",
        f"""
        [{COMPONENT_ENTRY_POINT_GROUP}]
        team = fake_comps
        solo = fake_comps:hello
        utils = fake_comps
        broken = fake_comps_missing
        """,
    )
    monkeypatch.syspath_prepend(str(root))
    yield root
    sys.modules.pop("fake_comps", None)


def test_entry_points_come_first(fake_distribution: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert get_app("team.hello", ["--who", "you"]).roles[0].args == ["you"]
    assert get_app("solo", {"who": "me"}).roles[0].args == ["me"]
    assert get_component("solo").description == "Says hello."
    # the ``utils`` entry point shadows the builtin utils.echo; other builtins stay
    assert get_app("utils.echo", []).name == "mine"
    assert get_app("utils.touch", ["--file", "f"]).name == "touch"
    names = list_components()
    assert {"team.hello", "team.echo", "solo", "utils.hello", "dist.spmd", "utils.sh"} <= set(names)
    assert names["utils.echo"].description == "An echo that shadows the builtin."
    assert "broken" in caplog.text  # a broken entry point is skipped (with a warning) when listing
    with pytest.raises(ComponentError, match=r"entry point broken = fake_comps_missing failed to load"):
        get_component("broken.x")


def test_component_errors_are_never_system_exit() -> None:
    for args in (["--help"], ["-h"], ["--num_replicas"]):
        with pytest.raises(ComponentError):
            get_app("utils.echo", args)


def test_check_args_is_bind_without_the_call_and_leaves_templates_and_missing_ones() -> None:
    spmd = get_component("dist.spmd")
    templated = lambda v: isinstance(v, str) and "{{" in v  # noqa: E731
    with pytest.raises(ComponentError, match=r"unrecognized arguments: --scirpt\. Did you mean '--script'"):
        spmd.check_args(["--scirpt", "train.py"], templated)
    with pytest.raises(ComponentError, match=r"unknown argument 'scirpt'.*Did you mean 'script'\?"):
        spmd.check_args({"scirpt": "{{ params.script }}"}, templated)  # the name is checked, not the value
    with pytest.raises(ComponentError, match=r"--cpu: 'two' is not a valid int"):
        spmd.check_args({"cpu": "two"}, templated)
    spmd.check_args({"j": "{{ params.nodes }}x2", "script": "t.py"}, templated)  # a templated value
    spmd.check_args(["-j", "{{ params.j }}", "--nope"], templated)  # a list with a template: left to bind
    get_component("utils.echo").check_args({}, templated)  # missing arguments: a connection may give them
