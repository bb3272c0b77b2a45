"""The application spec: what a job is (``AppDef``/``Role``/``Resource``), where it stands
(``AppState``/``AppStatus``), and the small vocabularies around it (macros, mounts, handles).

Semantics follow TorchX's ``torchx.specs`` so components written for TorchX read the same here.
"""

from __future__ import annotations

import copy
import difflib
import enum
import re
import string
import textwrap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from airflow_provider_torchx.core.errors import (
    AppStatusError,
    InvalidSpecError,
    MalformedAppHandleError,
    shown,
)

if TYPE_CHECKING:
    from airflow_provider_torchx.core.guards import Trip
    from airflow_provider_torchx.core.usage import Usage

__all__ = [
    "NULL_RESOURCE",
    "AppDef",
    "AppDryRunInfo",
    "AppState",
    "AppStatus",
    "AppStatusError",
    "BindMount",
    "DeviceMount",
    "MalformedAppHandleError",
    "ParsedAppHandle",
    "ReplicaStatus",
    "Resource",
    "RetryPolicy",
    "Role",
    "RoleStatus",
    "VolumeMount",
    "is_terminal",
    "macros",
    "make_app_handle",
    "named_resources",
    "parse_app_handle",
    "parse_mounts",
    "validate_app",
]

# --------------------------------------------------------------------------- resources

#: Capability key that carries a cloud instance type (AWS Batch pins node ranges with it).
INSTANCE_TYPE = "instanceType"


@dataclass
class Resource:
    """What one replica needs: ``cpu`` (vCPUs), ``gpu``, ``memMB`` and scheduler-specific
    ``capabilities`` (e.g. an instance type) and ``devices`` (name -> count)."""

    cpu: int
    gpu: int
    memMB: int
    capabilities: dict[str, Any] = field(default_factory=dict)
    devices: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def copy(original: Resource, **capabilities: Any) -> Resource:
        """A copy of ``original`` with ``capabilities`` merged into (and winning over) its own."""
        res = copy.deepcopy(original)
        res.capabilities.update(capabilities)
        return res


#: "Not specified": the default of ``Role.resource``; schedulers that need numbers reject it.
NULL_RESOURCE = Resource(cpu=-1, gpu=-1, memMB=-1)

# Share of an instance's memory a job may ask for; the rest is left to the OS and the agent
# (asking for all of it makes AWS Batch leave the job RUNNABLE forever).
_MEM_TAX = 0.96

# name: (vCPU, GPU, memory GiB) of AWS instance types commonly used for training.
_AWS_INSTANCES: dict[str, tuple[int, int, int]] = {
    "t3.medium": (2, 0, 4),
    "m5.xlarge": (4, 0, 16),
    "m5.2xlarge": (8, 0, 32),
    "m5.4xlarge": (16, 0, 64),
    "c5.18xlarge": (72, 0, 144),
    "g4dn.xlarge": (4, 1, 16),
    "g4dn.2xlarge": (8, 1, 32),
    "g4dn.12xlarge": (48, 4, 192),
    "g4dn.metal": (96, 8, 384),
    "g5.xlarge": (4, 1, 16),
    "g5.12xlarge": (48, 4, 192),
    "g5.48xlarge": (192, 8, 768),
    "p3.2xlarge": (8, 1, 61),
    "p3.8xlarge": (32, 4, 244),
    "p3.16xlarge": (64, 8, 488),
    "p3dn.24xlarge": (96, 8, 768),
    "p4d.24xlarge": (96, 8, 1152),
    "p5.48xlarge": (192, 8, 2048),
}


def _aws_resource(itype: str) -> Resource:
    cpu, gpu, mem_gib = _AWS_INSTANCES[itype]
    return Resource(
        cpu=cpu,
        gpu=gpu,
        memMB=int(mem_gib * 1024 * _MEM_TAX),
        capabilities={INSTANCE_TYPE: itype},
    )


class UnknownResourceError(InvalidSpecError, KeyError):
    """A named resource that is not registered (a ``KeyError`` too, as a mapping lookup)."""

    def __str__(self) -> str:
        return str(self.args[0])


class NamedResources(Mapping[str, Resource]):
    """Registry of named resources (``aws_p3.2xlarge`` ...). Each lookup returns a fresh copy,
    so callers may edit what they get."""

    def __init__(self) -> None:
        self._factories: dict[str, Callable[[], Resource]] = {}

    def register(self, name: str, factory: Callable[[], Resource]) -> None:
        """Add (or replace) the resource ``name``; ``factory`` builds a new ``Resource``."""
        self._factories[name] = factory

    def __getitem__(self, name: str) -> Resource:
        try:
            factory = self._factories[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self._factories), n=3, cutoff=0.6)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise UnknownResourceError(
                f"resource: unknown named resource {name!r}.{hint} Known: {', '.join(sorted(self._factories))}"
            ) from None
        return factory()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._factories))

    def __len__(self) -> int:
        return len(self._factories)


named_resources = NamedResources()
for _itype in _AWS_INSTANCES:
    named_resources.register(f"aws_{_itype}", lambda i=_itype: _aws_resource(i))  # type: ignore[misc]


def resource(
    cpu: int | None = None,
    gpu: int | None = None,
    memMB: int | None = None,
    h: str | None = None,
) -> Resource:
    """A ``Resource`` from a named resource ``h`` or from explicit numbers (TorchX's helper).
    ``h`` wins when given; unspecified numbers default to 1 cpu, 0 gpu, 1024 MB."""
    if h:
        return named_resources[h]
    return Resource(cpu=1 if cpu is None else cpu, gpu=gpu or 0, memMB=1024 if memMB is None else memMB)


# --------------------------------------------------------------------------- mounts


@dataclass
class BindMount:
    """A host path mounted into the container."""

    src_path: str
    dst_path: str
    read_only: bool = False


@dataclass
class VolumeMount:
    """A named volume (on AWS Batch: an EFS file system id) mounted into the container."""

    src: str
    dst_path: str
    read_only: bool = False


@dataclass
class DeviceMount:
    """A host device exposed to the container with cgroup permissions ``r``, ``w``, ``m``."""

    src_path: str
    dst_path: str
    permissions: str = "rwm"


Mount = BindMount | VolumeMount | DeviceMount

_MOUNT_FORMS = (
    "type=bind,src=<host path>,dst=<container path>[,readonly]; "
    "type=volume,src=<name or id>,dst=<container path>[,readonly]; "
    "type=device,src=<host device>[,dst=<container path>][,perm=rwm]"
)


def parse_mounts(opts: list[str] | str) -> list[Mount]:
    """Parse Docker-like mount options into typed mounts.

    ``opts`` is TorchX's token list (``["type=bind", "src=/a", "dst=/b", "readonly"]``) or one
    comma-joined string; tokens may themselves hold commas. Each mount starts with ``type=``.
    """
    raw = opts if isinstance(opts, str) else ",".join(opts)
    tokens = [t.strip() for t in raw.split(",") if t.strip()]
    groups: list[dict[str, str]] = []
    for tok in tokens:
        key, sep, value = tok.partition("=")
        key = key.strip()
        if key == "type":
            groups.append({})
        elif not groups:
            raise InvalidSpecError(f"mounts: {tok!r} comes before any 'type='; expected {_MOUNT_FORMS}")
        if key in groups[-1]:
            raise InvalidSpecError(f"mounts: {key!r} given twice in one mount; expected {_MOUNT_FORMS}")
        groups[-1][key] = value.strip() if sep else ""
    return [_mount_from(g) for g in groups]


def _mount_from(opts: dict[str, str]) -> Mount:
    kind = opts["type"]
    allowed = {
        "bind": {"type", "src", "dst", "readonly"},
        "volume": {"type", "src", "dst", "readonly"},
        "device": {"type", "src", "dst", "perm"},
    }
    if kind not in allowed:
        raise InvalidSpecError(f"mounts: type={kind!r} is not one of bind, volume, device; expected {_MOUNT_FORMS}")
    unknown = sorted(set(opts) - allowed[kind])
    if unknown:
        raise InvalidSpecError(
            f"mounts: unknown option {unknown[0]!r} for type={kind}; allowed: {', '.join(sorted(allowed[kind]))}"
        )
    src = opts.get("src", "")
    if not src:
        raise InvalidSpecError(f"mounts: type={kind} needs src=...; expected {_MOUNT_FORMS}")
    if kind == "device":
        perm = opts.get("perm", "rwm")
        if not perm or set(perm) - set("rwm"):
            raise InvalidSpecError(f"mounts: perm={perm!r} must be made of the letters r, w, m")
        return DeviceMount(src_path=src, dst_path=opts.get("dst") or src, permissions=perm)
    dst = opts.get("dst", "")
    if not dst:
        raise InvalidSpecError(f"mounts: type={kind} needs dst=...; expected {_MOUNT_FORMS}")
    if "readonly" in opts and opts["readonly"] not in ("", "true", "True", "1"):
        raise InvalidSpecError(f"mounts: readonly takes no value (got readonly={opts['readonly']!r})")
    read_only = "readonly" in opts
    if kind == "bind":
        return BindMount(src_path=src, dst_path=dst, read_only=read_only)
    return VolumeMount(src=src, dst_path=dst, read_only=read_only)


# --------------------------------------------------------------------------- macros


class macros:  # noqa: N801 - TorchX's public name
    """Placeholders substituted when an app is scheduled, in a role's args, env values and
    metadata values. ``$$`` stands for a literal ``$``.

    - ``img_root``: where the role's image is on the host (local: its directory).
    - ``base_img_root``: where the base image is (empty where the scheduler has none).
    - ``app_id``: the app id the scheduler assigned.
    - ``replica_id``: the replica's index within its role.
    - ``rank0_env``: the *name* of an env var that holds rank 0's host address, so
      ``"$${" + macros.rank0_env + "}"`` becomes ``${MASTER_HOST_VAR}`` for the shell to expand.
    """

    img_root = "${img_root}"
    base_img_root = "${base_img_root}"
    app_id = "${app_id}"
    replica_id = "${replica_id}"
    rank0_env = "${rank0_env}"

    @dataclass
    class Values:
        """The values of the macros for one replica."""

        img_root: str
        app_id: str
        replica_id: str
        rank0_env: str
        base_img_root: str = ""

        def substitute(self, arg: str) -> str:
            """``arg`` with every macro replaced (unknown ``$names`` are left as they are)."""
            return string.Template(arg).safe_substitute(**asdict(self))

        def apply(self, role: Role) -> Role:
            """A deep copy of ``role`` with the macros substituted in args, env values and
            string metadata values (``overrides`` stays shared, as TorchX does)."""
            overrides = role.overrides
            role.overrides = {}
            try:
                out = copy.deepcopy(role)
            finally:
                role.overrides = overrides
            out.overrides = overrides
            out.args = [self.substitute(a) for a in out.args]
            out.env = {k: self.substitute(v) for k, v in out.env.items()}
            out.metadata = {k: self.substitute(v) if isinstance(v, str) else v for k, v in out.metadata.items()}
            return out


# --------------------------------------------------------------------------- app definition


class RetryPolicy(str, enum.Enum):
    """What restarts when a replica fails (and ``max_retries`` allows it).

    ``REPLICA``: only the failed replica; ``APPLICATION``: every replica of every role;
    ``ROLE``: every replica of the failed role.
    """

    REPLICA = "REPLICA"
    APPLICATION = "APPLICATION"
    ROLE = "ROLE"


@dataclass
class Role:
    """A set of identical replicas: same image, entrypoint, args, env and resources.

    Only ``name`` is needed to construct one; ``validate_app`` checks the rest before submit.
    """

    name: str
    image: str = ""
    entrypoint: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    num_replicas: int = 1
    min_replicas: int | None = None
    max_retries: int = 0
    retry_policy: RetryPolicy = RetryPolicy.APPLICATION
    resource: Resource = field(default_factory=lambda: copy.deepcopy(NULL_RESOURCE))
    port_map: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    workspace: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    def pre_proc(self, scheduler: str, dryrun_info: AppDryRunInfo[Any]) -> AppDryRunInfo[Any]:
        """Hook to edit a scheduler's request for this role; the default changes nothing."""
        return dryrun_info


@dataclass
class AppDef:
    """An application: a name and one or more roles, plus free-form metadata."""

    name: str
    roles: list[Role] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)


_UNSAFE_NAME = re.compile(r"[/\\\x00]")


def _check_name(fieldname: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidSpecError(f"{fieldname}: must be a non-empty string, got {value!r}")
    if _UNSAFE_NAME.search(value) or value.startswith("."):
        raise InvalidSpecError(
            f"{fieldname}: {value!r} may not contain '/', '\\' or NUL nor start with '.' "
            "(names become file and job names)"
        )


def _check_resource(where: str, res: object) -> None:
    if not isinstance(res, Resource):
        raise InvalidSpecError(f"{where}: {res!r} is not a Resource (use Resource(...) or named_resources[...])")
    for name in ("cpu", "gpu", "memMB"):
        value = getattr(res, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < -1:
            raise InvalidSpecError(f"{where}.{name}: {value!r} must be an int >= 0 (or -1: not specified)")
    for dev, count in res.devices.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidSpecError(f"{where}.devices[{dev!r}]: {count!r} must be an int >= 0")


def validate_app(app: AppDef) -> None:
    """Check what every scheduler needs; raise ``InvalidSpecError`` naming the field.

    Checks: a valid app name; at least one role; unique, valid role names; a non-empty
    entrypoint; ``num_replicas > 0``; ``0 < min_replicas <= num_replicas`` when set;
    ``max_retries >= 0``; a ``Resource`` of ints (-1: not specified); string args and env;
    typed mounts.
    """
    _check_name("app.name", app.name)
    if not app.roles:
        raise InvalidSpecError(f"app.roles: app {app.name!r} has no roles; it needs at least one Role")
    seen: set[str] = set()
    for i, role in enumerate(app.roles):
        where = f"roles[{i}]"
        _check_name(f"{where}.name", role.name)
        if role.name in seen:
            raise InvalidSpecError(f"{where}.name: role name {role.name!r} is used twice; role names must be unique")
        seen.add(role.name)
        if not isinstance(role.entrypoint, str) or not role.entrypoint.strip():
            raise InvalidSpecError(
                f"{where}.entrypoint: role {role.name!r} has an empty entrypoint {role.entrypoint!r}; "
                "give the program to run"
            )
        if not isinstance(role.num_replicas, int) or role.num_replicas <= 0:
            raise InvalidSpecError(
                f"{where}.num_replicas: role {role.name!r} has num_replicas={role.num_replicas!r}; must be an int > 0"
            )
        if role.min_replicas is not None and not 0 < role.min_replicas <= role.num_replicas:
            raise InvalidSpecError(
                f"{where}.min_replicas: {role.min_replicas!r} must be between 1 and num_replicas={role.num_replicas}"
            )
        if not isinstance(role.max_retries, int) or role.max_retries < 0:
            raise InvalidSpecError(f"{where}.max_retries: {role.max_retries!r} must be an int >= 0")
        _check_resource(f"{where}.resource", role.resource)
        for j, arg in enumerate(role.args):
            if not isinstance(arg, str):
                raise InvalidSpecError(f"{where}.args[{j}]: {arg!r} is a {type(arg).__name__}; args must be strings")
        for key, val in role.env.items():
            if not isinstance(key, str) or not isinstance(val, str):
                raise InvalidSpecError(f"{where}.env: {key!r}={val!r}; env keys and values must be strings")
        for j, mount in enumerate(role.mounts):
            if not isinstance(mount, BindMount | VolumeMount | DeviceMount):
                raise InvalidSpecError(
                    f"{where}.mounts[{j}]: {mount!r} is not a BindMount, VolumeMount or DeviceMount "
                    "(parse strings with parse_mounts)"
                )


# --------------------------------------------------------------------------- states and status


class AppState(enum.IntEnum):
    """The state of an app. ``SUCCEEDED``, ``FAILED`` and ``CANCELLED`` are terminal."""

    UNSUBMITTED = 0
    SUBMITTED = 1
    PENDING = 2
    RUNNING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLED = 6
    UNKNOWN = 7

    def is_terminal(self) -> bool:
        """Whether the app will not change state any more."""
        return self in _TERMINAL_STATES

    def __str__(self) -> str:
        return self.name


_TERMINAL_STATES = frozenset({AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED})


def is_terminal(state: AppState) -> bool:
    """Whether ``state`` is terminal (module-level twin of ``AppState.is_terminal``)."""
    return state in _TERMINAL_STATES


@dataclass
class ReplicaStatus:
    """The state of one replica (``id`` is its index within the role)."""

    id: int
    state: AppState
    role: str
    hostname: str = ""
    structured_error_msg: str = ""
    exit_code: int | None = None
    msg: str = ""
    #: The host devices the scheduler gave the replica (GPUs ``"4,5"``, as in
    #: ``CUDA_VISIBLE_DEVICES``); empty when it assigned none.
    devices: str = ""


@dataclass
class RoleStatus:
    """The replicas' states of one role."""

    role: str
    replicas: list[ReplicaStatus] = field(default_factory=list)


@dataclass
class AppStatus:
    """Where an app stands. ``msg`` says why it failed (which role/replica, exit code or the
    scheduler's reason) when it did."""

    state: AppState
    num_restarts: int = 0
    msg: str = ""
    structured_error_msg: str = ""
    ui_url: str | None = None
    roles: list[RoleStatus] = field(default_factory=list)
    #: What the job cost (``core/usage.py``), once it ended and where the scheduler knows it.
    usage: Usage | None = None
    #: What a live job has cost so far and when it was submitted (``Usage.gpu_hours_at``
    #: counts its running attempts up to a given time); None once it ended, or unknown.
    usage_so_far: Usage | None = None
    #: The guard the scheduler stopped the job for, holding it without a watcher
    #: (``core/guards.py``); None: none did.
    guard_trip: Trip | None = None

    def is_terminal(self) -> bool:
        """Whether the app's state is terminal."""
        return self.state.is_terminal()

    def raise_for_status(self) -> None:
        """Raise ``AppStatusError`` (carrying this status) unless the app SUCCEEDED."""
        if self.state != AppState.SUCCEEDED:
            raise AppStatusError(self, f"app did not succeed: {self.state.name}: {self.msg or 'no reason given'}")

    def failed_replica(self) -> ReplicaStatus | None:
        """The first FAILED replica, if any (the one to blame in error messages)."""
        for role in self.roles:
            for rep in role.replicas:
                if rep.state == AppState.FAILED:
                    return rep
        return None

    def format(self) -> str:
        """A readable multi-line summary (state, restarts, each replica, message, UI link)."""
        lines = [f"State: {self.state.name}", f"Num restarts: {self.num_restarts}"]
        if self.roles:
            lines.append("Roles:")
            for role in self.roles:
                reps = []
                for rep in role.replicas:
                    code = f" (exit {rep.exit_code})" if rep.exit_code is not None else ""
                    host = f"@{rep.hostname}" if rep.hostname else ""
                    devices = f" (GPUs {rep.devices})" if rep.devices else ""
                    reps.append(f"{role.role}[{rep.id}]{host}:{rep.state.name}{code}{devices}")
                lines.append("  " + " ".join(reps))
        if self.msg:
            lines.append("Msg: " + self.msg.replace("\n", "\n     "))
        if self.structured_error_msg:
            lines.append("Structured error msg: " + self.structured_error_msg)
        if self.ui_url:
            lines.append(f"UI URL: {self.ui_url}")
        return "AppStatus:\n" + textwrap.indent("\n".join(lines), "  ")

    def __str__(self) -> str:
        return self.format()


# --------------------------------------------------------------------------- handles


class ParsedAppHandle(NamedTuple):
    """The parts of ``scheduler://session/app_id``."""

    scheduler_backend: str
    session_name: str
    app_id: str


_HANDLE_FORM = "scheduler://session/app_id (e.g. local_cwd://default/echo-x1y2)"
_HANDLE_RE = re.compile(r"^(?P<scheduler>[A-Za-z0-9_.-]+)://(?P<session>[^/]*)/(?P<app_id>[^/]+)$")
#: The longest app id: a file name's limit (local jobs and cursor files are named by it); no
#: scheduler's ids come near it (Batch: a queue and a UUID).
MAX_APP_ID = 255


def _app_id_error(app_id: str) -> str | None:
    """Why ``app_id`` cannot be an app id (None: it can)."""
    if not app_id or "/" in app_id or ".." in app_id:
        return f"app_id: {shown(app_id)} may not be empty or contain '/' or '..'"
    if len(app_id) > MAX_APP_ID:
        return f"app_id: {shown(app_id)} is longer than {MAX_APP_ID} characters"
    return None


def make_app_handle(scheduler_backend: str, session_name: str, app_id: str) -> str:
    """``scheduler_backend://session_name/app_id``."""
    why = _app_id_error(app_id)
    if why:
        raise MalformedAppHandleError(why)
    return f"{scheduler_backend}://{session_name}/{app_id}"


def parse_app_handle(app_handle: str) -> ParsedAppHandle:
    """Split a handle into its parts; anything else raises ``MalformedAppHandleError``."""
    m = _HANDLE_RE.match(app_handle) if isinstance(app_handle, str) else None
    if not m or ".." in m.group("app_id"):
        raise MalformedAppHandleError(f"app_handle: {shown(app_handle)} is not of the form {_HANDLE_FORM}")
    why = _app_id_error(m.group("app_id"))
    if why:
        raise MalformedAppHandleError(f"app_handle: {why}")
    return ParsedAppHandle(m.group("scheduler"), m.group("session"), m.group("app_id"))


# --------------------------------------------------------------------------- dry run info

T = TypeVar("T")


class AppDryRunInfo(Generic[T]):
    """A scheduler's native request for an app, before (or instead of) submitting it.

    ``request`` is what ``schedule()`` submits; ``print()`` shows it through ``fmt``. The app
    (a deep copy with everything the runner patched in), the resolved cfg, the scheduler name
    and the job labels are attached by the scheduler.
    """

    def __init__(self, request: T, fmt: Callable[[T], str] = repr) -> None:
        self.request = request
        self._fmt = fmt
        self._app: AppDef | None = None
        self._cfg: dict[str, Any] = {}
        self._scheduler: str | None = None
        self.labels: dict[str, str] = {}

    @property
    def app(self) -> AppDef:
        """The app as submitted (the runner's patched deep copy)."""
        if self._app is None:
            raise ValueError("this AppDryRunInfo carries no app (it was built by hand or read back)")
        return self._app

    @property
    def cfg(self) -> dict[str, Any]:
        """The resolved run config (defaults applied)."""
        return self._cfg

    @property
    def scheduler(self) -> str | None:
        """The scheduler backend this request is for."""
        return self._scheduler

    def __repr__(self) -> str:
        return self._fmt(self.request)

    __str__ = __repr__
