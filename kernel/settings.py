"""Where every command resolves its Kafka address, topic prefix and default paths — one place.

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
    return PACKAGE_DIR / "scenarios" / "quickstart.yaml"
