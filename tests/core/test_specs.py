"""The application spec: defaults, named resources, states and status, macros, mounts,
handles and ``validate_app``'s errors (each must name the field)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from airflow_provider_torchx.core import specs
from airflow_provider_torchx.core.errors import AppStatusError, InvalidSpecError, MalformedAppHandleError
from airflow_provider_torchx.core.specs import (
    AppDef,
    AppDryRunInfo,
    AppState,
    AppStatus,
    BindMount,
    DeviceMount,
    ReplicaStatus,
    Resource,
    RetryPolicy,
    Role,
    RoleStatus,
    VolumeMount,
    macros,
    make_app_handle,
    named_resources,
    parse_app_handle,
    parse_mounts,
    validate_app,
)

# --------------------------------------------------------------------------- defaults


def test_appdef_defaults() -> None:
    app = AppDef("trainer")
    assert (app.name, app.roles, app.metadata) == ("trainer", [], {})
    assert AppDef("other").roles is not app.roles


def test_role_defaults() -> None:
    role = Role("worker")
    assert role.image == ""
    assert role.entrypoint == ""
    assert role.args == []
    assert role.env == {}
    assert role.num_replicas == 1
    assert role.min_replicas is None
    assert role.max_retries == 0
    assert role.retry_policy is RetryPolicy.APPLICATION
    assert role.resource == specs.NULL_RESOURCE
    assert role.port_map == {}
    assert role.metadata == {}
    assert role.mounts == []
    assert role.workspace is None
    assert role.overrides == {}


def test_role_mutable_defaults_are_not_shared() -> None:
    a, b = Role("a"), Role("b")
    a.args.append("x")
    a.env["K"] = "v"
    a.resource.capabilities["c"] = 1
    assert b.args == [] and b.env == {}
    assert b.resource.capabilities == {}
    assert specs.NULL_RESOURCE.capabilities == {}


def test_role_pre_proc_default_changes_nothing() -> None:
    info: AppDryRunInfo[dict[str, int]] = AppDryRunInfo({"a": 1})
    assert Role("r").pre_proc("local_cwd", info) is info


def test_resource_defaults_and_copy() -> None:
    res = Resource(cpu=2, gpu=1, memMB=512)
    assert (res.capabilities, res.devices) == ({}, {})
    res.devices["vpc.amazonaws.com/efa"] = 1
    copied = Resource.copy(res, instanceType="p3.2xlarge", other=True)
    assert copied.capabilities == {"instanceType": "p3.2xlarge", "other": True}
    assert copied.devices == {"vpc.amazonaws.com/efa": 1}
    assert res.capabilities == {}  # the original is untouched
    copied.devices["x"] = 2
    assert "x" not in res.devices


def test_resource_helper() -> None:
    assert specs.resource() == Resource(cpu=1, gpu=0, memMB=1024)
    assert specs.resource(cpu=4, gpu=2, memMB=100) == Resource(cpu=4, gpu=2, memMB=100)
    assert specs.resource(cpu=4, h="aws_t3.medium") == named_resources["aws_t3.medium"]


# --------------------------------------------------------------------------- named resources


def test_aws_named_resources_carry_instance_type() -> None:
    aws = [name for name in named_resources if name.startswith("aws_")]
    assert "aws_p3.2xlarge" in aws and "aws_g5.xlarge" in aws and "aws_t3.medium" in aws
    for name in aws:
        res = named_resources[name]
        assert res.capabilities[specs.INSTANCE_TYPE] == name.removeprefix("aws_")
        assert res.cpu > 0 and res.gpu >= 0 and res.memMB > 0


def test_named_resource_values() -> None:
    p3 = named_resources["aws_p3.2xlarge"]
    assert (p3.cpu, p3.gpu) == (8, 1)
    # Below the instance's 61 GiB: some memory is left to the OS and the agent.
    assert 0.9 * 61 * 1024 < p3.memMB < 61 * 1024
    assert specs.INSTANCE_TYPE == "instanceType"


def test_named_resource_lookup_returns_a_fresh_copy() -> None:
    first = named_resources["aws_m5.xlarge"]
    first.capabilities["instanceType"] = "edited"
    first.cpu = 999
    again = named_resources["aws_m5.xlarge"]
    assert again.capabilities["instanceType"] == "m5.xlarge"
    assert again.cpu == 4


def test_named_resource_mapping_protocol() -> None:
    assert "aws_p3.2xlarge" in named_resources
    assert "nope" not in named_resources
    assert len(named_resources) == len(list(named_resources))
    assert list(named_resources) == sorted(named_resources)


def test_unknown_named_resource_gets_did_you_mean_hint() -> None:
    with pytest.raises(InvalidSpecError) as exc:
        named_resources["aws_p3.2xlarg"]
    msg = str(exc.value)
    assert "'aws_p3.2xlarg'" in msg
    assert "Did you mean 'aws_p3.2xlarge'" in msg
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, KeyError)


def test_unknown_named_resource_without_close_match_lists_known() -> None:
    with pytest.raises(KeyError) as exc:
        named_resources["zzzzzz"]
    msg = str(exc.value)
    assert "Did you mean" not in msg
    assert "'zzzzzz'" in msg and "aws_t3.medium" in msg


def test_register_named_resource() -> None:
    registry = specs.NamedResources()
    registry.register("tiny", lambda: Resource(cpu=1, gpu=0, memMB=64))
    assert registry["tiny"] == Resource(cpu=1, gpu=0, memMB=64)
    assert registry["tiny"] is not registry["tiny"]
    with pytest.raises(InvalidSpecError, match="Did you mean 'tiny'"):
        registry["tinny"]


# --------------------------------------------------------------------------- states and status

_TERMINAL = {AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED}


def test_app_state_values() -> None:
    assert [s.name for s in AppState] == [
        "UNSUBMITTED",
        "SUBMITTED",
        "PENDING",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
        "UNKNOWN",
    ]
    assert [int(s) for s in AppState] == list(range(8))
    assert str(AppState.RUNNING) == "RUNNING"


@pytest.mark.parametrize("state", list(AppState))
def test_is_terminal(state: AppState) -> None:
    expected = state in _TERMINAL
    assert state.is_terminal() is expected
    assert specs.is_terminal(state) is expected
    assert AppStatus(state=state).is_terminal() is expected


def _failed_status() -> AppStatus:
    return AppStatus(
        state=AppState.FAILED,
        num_restarts=2,
        msg="role trainer replica 1 exited with code 3\nlast line",
        structured_error_msg='{"message": "oom"}',
        ui_url="https://example.com/job/1",
        roles=[
            RoleStatus(
                "trainer",
                [
                    ReplicaStatus(0, AppState.SUCCEEDED, "trainer", hostname="node-a", exit_code=0),
                    ReplicaStatus(1, AppState.FAILED, "trainer", hostname="node-b", exit_code=3),
                ],
            ),
            RoleStatus("ps", [ReplicaStatus(0, AppState.RUNNING, "ps")]),
        ],
    )


def test_raise_for_status_succeeded_does_not_raise() -> None:
    AppStatus(state=AppState.SUCCEEDED).raise_for_status()


@pytest.mark.parametrize("state", [s for s in AppState if s != AppState.SUCCEEDED])
def test_raise_for_status_carries_the_status(state: AppState) -> None:
    status = AppStatus(state=state, msg="why it ended")
    with pytest.raises(AppStatusError) as exc:
        status.raise_for_status()
    assert exc.value.status is status
    assert state.name in str(exc.value)
    assert "why it ended" in str(exc.value)


def test_app_status_error_without_message_shows_the_status() -> None:
    status = _failed_status()
    assert str(AppStatusError(status)) == status.format()


def test_failed_replica() -> None:
    rep = _failed_status().failed_replica()
    assert rep is not None and (rep.role, rep.id, rep.exit_code) == ("trainer", 1, 3)
    assert AppStatus(state=AppState.RUNNING).failed_replica() is None


def test_format_is_readable() -> None:
    text = _failed_status().format()
    lines = text.splitlines()
    assert lines[0] == "AppStatus:"
    assert "  State: FAILED" in lines
    assert "  Num restarts: 2" in lines
    assert "trainer[0]@node-a:SUCCEEDED (exit 0) trainer[1]@node-b:FAILED (exit 3)" in text
    assert "ps[0]:RUNNING" in text
    # A multi-line message stays indented under its heading.
    assert "Msg: role trainer replica 1 exited with code 3" in text
    assert any(line.strip() == "last line" and line.startswith("       ") for line in lines)
    assert 'Structured error msg: {"message": "oom"}' in text
    assert "UI URL: https://example.com/job/1" in text
    assert str(_failed_status()) == text


def test_format_minimal_status_omits_empty_parts() -> None:
    text = AppStatus(state=AppState.PENDING).format()
    assert text == "AppStatus:\n  State: PENDING\n  Num restarts: 0"


# --------------------------------------------------------------------------- macros


def _values() -> macros.Values:
    return macros.Values(
        img_root="/img", app_id="echo-x1", replica_id="3", rank0_env="MASTER_ADDR", base_img_root="/base"
    )


def test_macro_names() -> None:
    assert macros.img_root == "${img_root}"
    assert macros.base_img_root == "${base_img_root}"
    assert macros.app_id == "${app_id}"
    assert macros.replica_id == "${replica_id}"
    assert macros.rank0_env == "${rank0_env}"


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        (macros.app_id, "echo-x1"),
        (f"{macros.img_root}/bin/{macros.app_id}-{macros.replica_id}", "/img/bin/echo-x1-3"),
        (macros.base_img_root, "/base"),
        # "$$" escapes "$", so the rank0_env macro can make a shell variable reference.
        ("$${" + macros.rank0_env + "}:29500", "${MASTER_ADDR}:29500"),
        ("$$" + macros.app_id, "$echo-x1"),
        ("cost $$5", "cost $5"),
        ("$${app_id}", "${app_id}"),
        # Unknown names are left alone (the shell may expand them).
        ("$HOME ${nope} $", "$HOME ${nope} $"),
        ("plain", "plain"),
    ],
)
def test_substitute(arg: str, expected: str) -> None:
    assert _values().substitute(arg) == expected


def test_base_img_root_defaults_to_empty() -> None:
    vals = macros.Values(img_root="/i", app_id="a", replica_id="0", rank0_env="R")
    assert vals.substitute(f"[{macros.base_img_root}]") == "[]"


def test_apply_substitutes_args_env_metadata_and_returns_a_copy() -> None:
    overrides: dict[str, object] = {"x": 1}
    role = Role(
        "trainer",
        image="img",
        entrypoint=macros.img_root + "/run",  # the entrypoint is not a macro target
        args=["--id", macros.app_id, "--rank", macros.replica_id, "$$literal"],
        env={"JOB": f"{macros.app_id}/{macros.replica_id}", "MASTER": "$${" + macros.rank0_env + "}"},
        metadata={"where": macros.img_root, "n": 5, "nested": {"k": macros.app_id}},
        overrides=overrides,
    )
    out = _values().apply(role)

    assert out is not role
    assert out.args == ["--id", "echo-x1", "--rank", "3", "$literal"]
    assert out.env == {"JOB": "echo-x1/3", "MASTER": "${MASTER_ADDR}"}
    assert out.metadata == {"where": "/img", "n": 5, "nested": {"k": macros.app_id}}
    assert out.entrypoint == "${img_root}/run"
    # The original is untouched and nothing mutable is shared, except overrides.
    assert role.args == ["--id", "${app_id}", "--rank", "${replica_id}", "$$literal"]
    assert role.env["JOB"] == "${app_id}/${replica_id}"
    assert role.metadata["where"] == "${img_root}"
    assert out.resource is not role.resource
    out.metadata["nested"]["k"] = "changed"
    assert role.metadata["nested"]["k"] == macros.app_id
    assert out.overrides is overrides and role.overrides is overrides


# --------------------------------------------------------------------------- mounts


@pytest.mark.parametrize(
    ("opts", "expected"),
    [
        (["type=bind", "src=/host", "dst=/container"], [BindMount("/host", "/container", read_only=False)]),
        (["type=bind", "src=/host", "dst=/container", "readonly"], [BindMount("/host", "/container", True)]),
        ("type=bind,src=/host,dst=/container,readonly", [BindMount("/host", "/container", True)]),
        ("type=volume,src=fs-1234,dst=/data", [VolumeMount("fs-1234", "/data", read_only=False)]),
        (["type=volume", "src=fs-1234", "dst=/data", "readonly"], [VolumeMount("fs-1234", "/data", True)]),
        # device: dst defaults to src, perm to rwm
        (
            "type=device,src=/dev/infiniband/uverbs0",
            [DeviceMount("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs0")],
        ),
        (
            ["type=device", "src=/dev/fuse", "dst=/dev/f", "perm=rw"],
            [DeviceMount("/dev/fuse", "/dev/f", permissions="rw")],
        ),
        ("type=device,src=/dev/x,perm=r", [DeviceMount("/dev/x", "/dev/x", "r")]),
        # several mounts, tokens that themselves hold commas, blanks around parts
        (
            ["type=bind,src=/a,dst=/b", "type=device", "src=/dev/d", " type = volume , src = v , dst = /v , readonly "],
            [BindMount("/a", "/b"), DeviceMount("/dev/d", "/dev/d", "rwm"), VolumeMount("v", "/v", True)],
        ),
        ("type=bind,src=/a,dst=/b,readonly=true", [BindMount("/a", "/b", True)]),
        ([], []),
        ("", []),
    ],
)
def test_parse_mounts(opts: list[str] | str, expected: list[specs.Mount]) -> None:
    assert parse_mounts(opts) == expected


def test_device_mount_default_permissions() -> None:
    assert DeviceMount("/dev/a", "/dev/a").permissions == "rwm"
    assert BindMount("/a", "/b").read_only is False
    assert VolumeMount("v", "/b").read_only is False


@pytest.mark.parametrize(
    ("opts", "names"),
    [
        ("src=/a,dst=/b", ["'src=/a'", "type="]),
        (["dst=/b", "type=bind", "src=/a"], ["'dst=/b'", "type="]),
        ("type=nfs,src=/a,dst=/b", ["'nfs'", "bind", "volume", "device"]),
        ("type=,src=/a,dst=/b", ["type=''", "bind"]),
        ("type=bind,dst=/b", ["type=bind", "src="]),
        ("type=bind,src=,dst=/b", ["type=bind", "src="]),
        ("type=bind,src=/a", ["type=bind", "dst="]),
        ("type=volume,src=v", ["type=volume", "dst="]),
        ("type=device,dst=/dev/x", ["type=device", "src="]),
        ("type=device,src=/dev/x,perm=rx", ["perm='rx'", "r, w, m"]),
        ("type=device,src=/dev/x,perm=", ["perm=''", "r, w, m"]),
        ("type=bind,src=/a,dst=/b,perm=rw", ["'perm'", "type=bind", "readonly"]),
        ("type=device,src=/dev/x,readonly", ["'readonly'", "type=device", "perm"]),
        ("type=bind,src=/a,dst=/b,bogus=1", ["'bogus'", "allowed"]),
        ("type=bind,src=/a,src=/c,dst=/b", ["'src' given twice"]),
        ("type=bind,src=/a,dst=/b,readonly=no", ["readonly='no'"]),
    ],
)
def test_parse_mounts_errors_name_the_bad_part(opts: list[str] | str, names: list[str]) -> None:
    with pytest.raises(InvalidSpecError) as exc:
        parse_mounts(opts)
    msg = str(exc.value)
    assert msg.startswith("mounts: ")
    for name in names:
        assert name in msg


# --------------------------------------------------------------------------- handles


@pytest.mark.parametrize(
    ("scheduler", "session", "app_id"),
    [
        ("local_cwd", "default", "echo-x1y2"),
        ("aws_batch", "alice", "queue:0a1b2c3d-uuid"),
        ("local_dir", "", "app"),  # an empty session is allowed, as in TorchX
        ("my.backend-2", "s e s", "a.b_c-1"),
    ],
)
def test_app_handle_round_trip(scheduler: str, session: str, app_id: str) -> None:
    handle = make_app_handle(scheduler, session, app_id)
    assert handle == f"{scheduler}://{session}/{app_id}"
    parsed = parse_app_handle(handle)
    assert parsed == (scheduler, session, app_id)
    assert (parsed.scheduler_backend, parsed.session_name, parsed.app_id) == (scheduler, session, app_id)
    assert isinstance(parsed, specs.ParsedAppHandle) and isinstance(parsed, tuple)


@pytest.mark.parametrize(
    "handle",
    [
        "",
        "echo-x1",
        "local_cwd:/default/echo",
        "local_cwd://default",
        "local_cwd://default/",
        "://default/echo",
        "local_cwd://default/a/b",
        "local_cwd://default/..",
        "local_cwd://default/a..b",
        "local cwd://default/echo",
    ],
)
def test_malformed_handle_shows_expected_form(handle: str) -> None:
    with pytest.raises(MalformedAppHandleError) as exc:
        parse_app_handle(handle)
    msg = str(exc.value)
    assert "scheduler://session/app_id" in msg
    assert repr(handle) in msg
    assert isinstance(exc.value, ValueError)


def test_an_app_id_longer_than_a_file_name_is_malformed() -> None:
    """No scheduler names a job by a longer id; a longer one is named, shortened, in the error."""
    assert parse_app_handle("local_cwd://s/" + "a" * 255).app_id == "a" * 255
    with pytest.raises(MalformedAppHandleError, match=r"app_id: 'a{120}'\.\.\. \(256 characters\) is longer than 255"):
        parse_app_handle("local_cwd://s/" + "a" * 256)
    with pytest.raises(MalformedAppHandleError, match="is longer than 255 characters"):
        make_app_handle("local_cwd", "s", "a" * 256)


def test_parse_app_handle_rejects_non_strings() -> None:
    with pytest.raises(MalformedAppHandleError, match="scheduler://session/app_id"):
        parse_app_handle(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("app_id", ["", "a/b", "..", "x..y"])
def test_make_app_handle_rejects_bad_app_ids(app_id: str) -> None:
    with pytest.raises(MalformedAppHandleError, match=re.escape(f"app_id: {app_id!r}")):
        make_app_handle("local_cwd", "default", app_id)


# --------------------------------------------------------------------------- validate_app


def _valid_app() -> AppDef:
    return AppDef(
        "train",
        roles=[
            Role("trainer", image="img", entrypoint="python", args=["-c", "pass"], env={"A": "1"}, num_replicas=2),
            Role("ps", image="img", entrypoint="sh", min_replicas=1, max_retries=3, mounts=[BindMount("/a", "/b")]),
        ],
    )


def test_validate_app_accepts_a_valid_app() -> None:
    app = _valid_app()
    validate_app(app)
    # Resources: unspecified (the default), explicit and named ones are all valid.
    assert app.roles[0].resource == specs.NULL_RESOURCE
    app.roles[0].resource = Resource(cpu=0, gpu=0, memMB=0, devices={"vpc.amazonaws.com/efa": 1})
    app.roles[1].resource = named_resources["aws_p4d.24xlarge"]
    validate_app(app)


def _set(obj: object, attr: str, value: object) -> None:
    setattr(obj, attr, value)


@pytest.mark.parametrize(
    ("edit", "field_name", "shown"),
    [
        (lambda a: _set(a, "roles", []), "app.roles", "'train'"),
        (lambda a: _set(a, "name", ""), "app.name", "''"),
        (lambda a: _set(a, "name", "../x"), "app.name", "'../x'"),
        (lambda a: _set(a, "name", ".hidden"), "app.name", "'.hidden'"),
        (lambda a: _set(a.roles[0], "entrypoint", ""), "roles[0].entrypoint", "''"),
        (lambda a: _set(a.roles[1], "entrypoint", "   "), "roles[1].entrypoint", "'   '"),
        (lambda a: _set(a.roles[0], "num_replicas", 0), "roles[0].num_replicas", "num_replicas=0"),
        (lambda a: _set(a.roles[0], "num_replicas", -2), "roles[0].num_replicas", "num_replicas=-2"),
        (lambda a: _set(a.roles[1], "name", "trainer"), "roles[1].name", "'trainer'"),
        (lambda a: _set(a.roles[0], "name", "../x"), "roles[0].name", "'../x'"),
        (lambda a: _set(a.roles[0], "name", "a/b"), "roles[0].name", "'a/b'"),
        (lambda a: _set(a.roles[0], "name", ""), "roles[0].name", "''"),
        (lambda a: _set(a.roles[1], "min_replicas", 0), "roles[1].min_replicas", "0"),
        (lambda a: _set(a.roles[0], "min_replicas", 3), "roles[0].min_replicas", "num_replicas=2"),
        (lambda a: _set(a.roles[1], "max_retries", -1), "roles[1].max_retries", "-1"),
        (lambda a: _set(a.roles[0], "resource", "aws_p3.2xlarge"), "roles[0].resource", "'aws_p3.2xlarge'"),
        (lambda a: _set(a.roles[0].resource, "cpu", -2), "roles[0].resource.cpu", "-2"),
        (lambda a: _set(a.roles[1].resource, "gpu", 1.5), "roles[1].resource.gpu", "1.5"),
        (lambda a: _set(a.roles[0].resource, "memMB", "1G"), "roles[0].resource.memMB", "'1G'"),
        (lambda a: _set(a.roles[0].resource, "devices", {"efa": -1}), "roles[0].resource.devices['efa']", "-1"),
        (lambda a: _set(a.roles[0], "args", ["ok", 5]), "roles[0].args[1]", "5"),
        (lambda a: _set(a.roles[0], "env", {"A": 1}), "roles[0].env", "'A'=1"),
        (lambda a: _set(a.roles[1], "mounts", ["type=bind,src=/a,dst=/b"]), "roles[1].mounts[0]", "parse_mounts"),
    ],
)
def test_validate_app_errors_name_the_field(edit: Callable[[AppDef], None], field_name: str, shown: str) -> None:
    app = _valid_app()
    edit(app)
    with pytest.raises(InvalidSpecError) as exc:
        validate_app(app)
    msg = str(exc.value)
    assert msg.startswith(field_name + ":"), msg
    assert shown in msg


# --------------------------------------------------------------------------- dry run info


def test_dryrun_info_prints_its_request() -> None:
    info = AppDryRunInfo({"cmd": ["echo", "hi"]}, fmt=lambda r: f"REQUEST {r['cmd']}")
    assert str(info) == repr(info) == "REQUEST ['echo', 'hi']"
    assert str(AppDryRunInfo({"a": 1})) == "{'a': 1}"
    assert info.cfg == {} and info.scheduler is None and info.labels == {}
    with pytest.raises(ValueError, match="no app"):
        _ = info.app


def test_public_names_are_exported() -> None:
    public = {
        "AppDef",
        "Role",
        "Resource",
        "AppState",
        "AppStatus",
        "RoleStatus",
        "ReplicaStatus",
        "RetryPolicy",
        "macros",
        "named_resources",
        "parse_mounts",
        "BindMount",
        "VolumeMount",
        "DeviceMount",
        "make_app_handle",
        "parse_app_handle",
        "is_terminal",
        "AppDryRunInfo",
    }
    assert public <= set(specs.__all__)
    assert all(hasattr(specs, name) for name in specs.__all__)
