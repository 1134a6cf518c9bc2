"""Kafka client security: ``--kafka-config FILE`` parsed once into the settings every client uses.

The file holds client properties in the keys librdkafka (kcat ``-F``) and the Java client share::

    security.protocol=SASL_SSL
    sasl.mechanism=SCRAM-SHA-512
    sasl.username=headroom
    sasl.password=…
    ssl.ca.location=/path/to/ca.pem

Recognised keys: ``security.protocol`` (``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``),
``sasl.mechanism`` (librdkafka also spells it ``sasl.mechanisms``: ``PLAIN``, ``SCRAM-SHA-256``,
``SCRAM-SHA-512``), ``sasl.username``, ``sasl.password`` (or a Java ``sasl.jaas.config`` line
carrying ``username="…" password="…"``), ``ssl.ca.location``, ``ssl.certificate.location``,
``ssl.key.location``, ``ssl.key.password`` and ``ssl.endpoint.identification.algorithm``
(``https``, the default, checks the broker's host name; ``none`` or empty does not). Other keys
are the business of other clients (``client.id``, ``bootstrap.servers``, ``ssl.truststore.*`` …)
and are ignored, by name only.

Where the file comes from (:func:`resolve`): the flag, else ``$HEADROOM_KAFKA_CONFIG``, else —
when the address is the local broker's — the ``client.properties`` that ``headroom kafka start
--security sasl_ssl`` wrote beside it; else PLAINTEXT, no credentials.

One process talks to one cluster, so the parsed settings are installed once per process
(:func:`install`, done by :meth:`headroom.streams.kafka.KafkaTarget.from_args`) and every producer,
consumer, admin client and probe of :mod:`headroom.streams.kafka` and :mod:`headroom.streams.broker`
uses them; the Faust app gets the same settings as its broker credentials.

Passwords live in :class:`Secret`, whose ``str`` and ``repr`` are ``***``: they can reach the
Kafka client and nothing else — never a log line, an event or an error message.
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headroom.kernel.errors import ConfigError

ENV_VAR = "HEADROOM_KAFKA_CONFIG"
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
KNOWN_KEYS = frozenset(
    {
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "sasl.jaas.config",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.endpoint.identification.algorithm",
    }
)
REDACTED = "***"


class Secret:
    """A password: shown as ``***`` everywhere; :meth:`reveal` hands it to a Kafka client."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __str__(self) -> str:
        return REDACTED

    def __repr__(self) -> str:
        return f"Secret({REDACTED})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class ClientSecurity:
    """The security settings of every Kafka client of this process (PLAINTEXT by default)."""

    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: Secret | None = field(default=None, repr=False)
    ca_location: Path | None = None
    certificate_location: Path | None = None
    key_location: Path | None = None
    key_password: Secret | None = field(default=None, repr=False)
    check_hostname: bool = True
    source: Path | None = None  # the file these came from (None: defaults)

    @property
    def uses_ssl(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def describe(self) -> dict[str, Any]:
        """What may be logged: protocol, mechanism, user and file — never a password."""
        return {
            "security_protocol": self.protocol,
            "sasl_mechanism": self.mechanism,
            "sasl_username": self.username,
            "kafka_config": None if self.source is None else str(self.source),
        }

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context: the CA of ``ssl.ca.location`` (else the system's), the client
        certificate when given, host-name checks unless turned off."""
        context = ssl.create_default_context(
            cafile=None if self.ca_location is None else str(self.ca_location)
        )
        if self.certificate_location is not None:
            context.load_cert_chain(
                str(self.certificate_location),
                None if self.key_location is None else str(self.key_location),
                None if self.key_password is None else self.key_password.reveal(),
            )
        if not self.check_hostname:
            context.check_hostname = False
        return context

    def aiokafka_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for aiokafka's producer, consumer, admin client and connection."""
        kwargs: dict[str, Any] = {"security_protocol": self.protocol}
        if self.uses_ssl:
            kwargs["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            assert self.password is not None
            kwargs["sasl_mechanism"] = self.mechanism
            kwargs["sasl_plain_username"] = self.username
            kwargs["sasl_plain_password"] = self.password.reveal()
        return kwargs


PLAINTEXT = ClientSecurity()


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def parse_properties(text: str) -> dict[str, str]:
    """Java ``.properties`` lines as librdkafka reads them: ``key=value`` (or ``key: value``),
    ``#`` and ``!`` comments, blank lines, a trailing backslash continuing a line."""
    out: dict[str, str] = {}
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip() if not pending else raw.lstrip()
        if not pending and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    for line in logical:
        match = re.match(r"^([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if match is None:
            out[line] = ""
            continue
        out[match.group(1)] = match.group(2).strip()
    return out


_JAAS_FIELD = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


def from_properties(props: dict[str, str], source: Path | None = None) -> ClientSecurity:
    """Validate client properties; :class:`ConfigError` (exit 2) lists every problem, naming
    the key — never a password's value."""
    where = f"{source}: " if source is not None else ""
    problems: list[str] = []
    protocol = props.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        problems.append(f"{where}security.protocol: {protocol!r} is not one of {PROTOCOLS}")
    mechanism_text = props.get("sasl.mechanism") or props.get("sasl.mechanisms")
    mechanism = mechanism_text.strip().upper() if mechanism_text else None
    username = props.get("sasl.username") or None
    password_text = props.get("sasl.password") or None
    jaas = props.get("sasl.jaas.config")
    if jaas:
        fields = {k: v.replace('\\"', '"') for k, v in _JAAS_FIELD.findall(jaas)}
        username = username or fields.get("username")
        password_text = password_text or fields.get("password")
    sasl = protocol in ("SASL_PLAINTEXT", "SASL_SSL")
    if sasl:
        if mechanism is None:
            mechanism = "PLAIN"  # librdkafka's and the Java client's default
        if mechanism not in MECHANISMS:
            problems.append(f"{where}sasl.mechanism: {mechanism!r} is not one of {MECHANISMS}")
        if not username:
            problems.append(f"{where}sasl.username: required with security.protocol={protocol}")
        if not password_text:
            problems.append(f"{where}sasl.password: required with security.protocol={protocol}")

    def path(key: str) -> Path | None:
        text = props.get(key)
        if not text:
            return None
        p = Path(text).expanduser()
        if source is not None and not p.is_absolute():
            p = source.parent / p
        if not p.is_file():
            problems.append(f"{where}{key}: {text}: no such file")
        return p

    ca = path("ssl.ca.location")
    cert = path("ssl.certificate.location")
    key = path("ssl.key.location")
    algorithm = props.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
    if algorithm not in ("https", "none", ""):
        problems.append(
            f"{where}ssl.endpoint.identification.algorithm: {algorithm!r} must be https or none"
        )
    if problems:
        raise ConfigError(problems)
    key_password = props.get("ssl.key.password")
    return ClientSecurity(
        protocol=protocol,
        mechanism=mechanism if sasl else None,
        username=username if sasl else None,
        password=Secret(password_text) if sasl and password_text else None,
        ca_location=ca,
        certificate_location=cert,
        key_location=key,
        key_password=Secret(key_password) if key_password else None,
        check_hostname=algorithm == "https",
        source=source,
    )


def load(path: Path) -> ClientSecurity:
    """Read and validate a client properties file."""
    path = path.expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--kafka-config: {path}: {exc.strerror or exc}") from None
    return from_properties(parse_properties(text), source=path.resolve())


def ignored_keys(path: Path) -> list[str]:
    """Keys of a client properties file that headroom's clients do not use (names only)."""
    with_values = parse_properties(path.expanduser().read_text())
    return sorted(k for k in with_values if k not in KNOWN_KEYS)


def resolve(flag: str | None, local_state_dir: Path | None = None) -> ClientSecurity:
    """``--kafka-config``, else ``$HEADROOM_KAFKA_CONFIG``, else ``client.properties`` of the
    local broker's state directory (``local_state_dir``, given when the address is that
    broker's), else PLAINTEXT."""
    if flag:
        return load(Path(flag))
    env = os.environ.get(ENV_VAR)
    if env:
        return load(Path(env))
    if local_state_dir is not None:
        candidate = local_state_dir / "client.properties"
        if candidate.is_file():
            return load(candidate)
    return PLAINTEXT


# --------------------------------------------------------------------------------------------
# The process's settings
# --------------------------------------------------------------------------------------------

_current: ClientSecurity = PLAINTEXT


def install(security: ClientSecurity) -> None:
    """Make ``security`` the settings of every Kafka client this process creates from now on."""
    global _current
    _current = security


def current() -> ClientSecurity:
    return _current
