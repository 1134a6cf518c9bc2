"""Where every command resolves its Kafka address, topic prefix, scenario argument and default
paths — one place.

Resolution order for ``--bootstrap``: the flag, else ``$KAFKA_BOOTSTRAP_SERVERS``, else the
address the local broker (``headroom kafka start``) recorded in its state directory. For
``--prefix``: the flag, else ``$HEADROOM_TOPIC_PREFIX``, else ``headroom.``.
"""

from __future__ import annotations

import os
from pathlib import Path

import headroom
from headroom.kernel.errors import ConfigError

DEFAULT_PREFIX = "headroom."
DEFAULT_BROKER_PORT = 19092
# the package ``headroom`` itself, with its data: broker/ and the shipped scenarios/
PACKAGE_DIR = Path(headroom.__file__).resolve().parent
# the scenarios shipped with the package (package data of ``headroom.scenarios``)
SCENARIOS_DIR = PACKAGE_DIR / "scenarios"


def default_state_dir() -> Path:
    """The local broker's state directory: pid, data, log and its bootstrap address."""
    env = os.environ.get("HEADROOM_KAFKA_STATE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "headroom" / "kafka"


def resolve_state_dir(flag: str | None) -> Path:
    return Path(flag).expanduser() if flag else default_state_dir()


def resolve_prefix(flag: str | None) -> str:
    prefix = flag if flag is not None else os.environ.get("HEADROOM_TOPIC_PREFIX", DEFAULT_PREFIX)
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    if not prefix or any(c not in allowed for c in prefix) or len(prefix) > 200:
        raise ConfigError(f"--prefix: {prefix!r} must be 1-200 characters of [A-Za-z0-9._-]")
    return prefix


def resolve_bootstrap(flag: str | None) -> str:
    """The bootstrap address, or a ConfigError that says how to get one."""
    if flag:
        return flag
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        return env
    address_file = default_state_dir() / "bootstrap"
    if address_file.exists():
        address = address_file.read_text().strip()
        if address:
            return address
    raise ConfigError(
        "--bootstrap: no Kafka address given; pass --bootstrap HOST:PORT, set "
        "KAFKA_BOOTSTRAP_SERVERS, or start the local broker with `headroom kafka start`"
    )


def default_scenario_path() -> Path:
    """The quickstart scenario shipped with the package."""
    return SCENARIOS_DIR / "quickstart.yaml"


def shipped_scenarios() -> list[str]:
    """The names of the scenarios shipped with the package (``quickstart``, …), sorted."""
    return sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml") if p.is_file())


def resolve_scenario(arg: str | os.PathLike[str] | None) -> Path:
    """The scenario file a ``SCENARIO`` argument (or ``--scenario FILE``) names: a path to an
    existing file as given; else ``NAME`` or ``NAME.yaml`` among the scenarios shipped with the
    package (their CSV traces lie beside them, inside the package); ``None`` is the quickstart.
    Anything else is a :class:`ConfigError` that lists the shipped names."""
    if arg is None:
        return default_scenario_path()
    path = Path(arg)
    if path.is_file():
        return path
    name = os.fspath(arg)
    # a bare name only: nothing that could reach outside the shipped folder
    if name and Path(name).name == name and not name.startswith("."):
        for candidate in (name, f"{name}.yaml"):
            shipped = SCENARIOS_DIR / candidate
            if shipped.is_file():
                return shipped
    what = "not a regular file" if name and path.exists() else "no such file"
    raise ConfigError(
        f"{name}: {what}, nor the name of a shipped scenario "
        f"({', '.join(shipped_scenarios()) or 'none found'})"
    )
