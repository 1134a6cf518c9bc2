"""The loopback protocol between clients and ranking servers: length-prefixed orjson frames.

Why not HTTP: a ranking call is one small request and one small response, many in flight at once on
one connection; a 4-byte length prefix and an orjson body cost microseconds, multiplex naturally
(responses carry the request ``id`` and may come back in any order) and need no dependency.

Framing (both directions)::

    +----------------+---------------------------------------+
    | length: uint32 | body: one JSON object, UTF-8 (orjson) |
    |  big-endian    |  exactly ``length`` bytes             |
    +----------------+---------------------------------------+

``length`` is at most :data:`MAX_FRAME_BYTES` (1 MiB, the contract's message limit); a longer
prefix, a body that is not a JSON object, or a connection that ends inside a frame is a
:class:`ProtocolError` (the peer's fault: the connection is closed, nothing else is affected).

Messages:

* client → server: :class:`RankRequest` (``op: "rank"``) — rank ``base + extra`` candidates of a
  user with ``model``; ``extra`` and ``model == "strong"`` are the optional part, which the server's
  shedding core may trim (``extra``) or refuse (``strong``: the response says ``downgraded`` and
  the client re-runs the request on the base model of a dedicated replica).
* server → client: :class:`RankResponse` — the ad ranked first and its model score, what was
  actually done (``candidates``, ``model``, the shedding ``decision``), and the server's
  :class:`Health` (overload flag, queueing delay): clients read it from every response
  (client-side shedding, docs/architecture.md).

:class:`WireClient` keeps one connection to one server and matches responses to requests by id;
:func:`serve` runs the server side. Errors say whose fault they are (after h11):
:class:`ProtocolError` (malformed bytes from the peer) and :class:`ServerUnavailable` (the
connection could not be made or was lost; in-flight calls fail with it so the caller can retry
elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from headroom.kernel.errors import HeadroomError

__all__ = [
    "MAX_FRAME_BYTES",
    "Health",
    "ProtocolError",
    "RankRequest",
    "RankResponse",
    "ServerUnavailable",
    "WireClient",
    "decode_body",
    "encode_frame",
    "read_frame",
    "serve",
]

MAX_FRAME_BYTES: Final = 1 << 20  # docs/messages.md's message limit; a ranking frame is ~200 bytes
_HEADER = struct.Struct(">I")
ModelName = Literal["base", "strong"]
_MODELS: Final = ("base", "strong")


class ProtocolError(HeadroomError):
    """The peer sent bytes that break the framing or the message schema."""


class ServerUnavailable(HeadroomError):
    """The server could not be reached, or the connection was lost with the call in flight."""


# -- frames ---------------------------------------------------------------------------------------


def encode_frame(obj: dict[str, Any]) -> bytes:
    """One frame: the 4-byte length and the orjson body."""
    body = orjson.dumps(obj)
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(
            f"frame of {len(body):,} bytes is over the limit of {MAX_FRAME_BYTES:,}"
        )
    return _HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """The JSON object of a frame body (a :class:`ProtocolError` for anything else)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"frame body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"frame body must be a JSON object, got {type(obj).__name__}")
    return obj


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next frame's object, or None at a clean end of stream (between frames)."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ProtocolError("connection ended inside a frame header") from None
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame length {length:,} is over the limit of {MAX_FRAME_BYTES:,}")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ProtocolError(f"connection ended inside a frame body of {length} bytes") from None
    return decode_body(body)


# -- messages -------------------------------------------------------------------------------------


def _req(d: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in d:
        raise ProtocolError(f"{key}: missing")
    value = d[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ProtocolError(f"{key}: must not be a bool")
    if not isinstance(value, kind):
        raise ProtocolError(f"{key}: wrong type {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class RankRequest:
    """Rank the first ``base + extra`` retrieved candidates of ``user`` with ``model``.

    ``t_s`` is scenario time (the world's drift clock). ``value`` is the request's value signal:
    the server's shedding core drops optional work lowest value per unit of compute first.
    ``budget_ms``: optional work that cannot *start* within this many ms of arrival is dropped
    (the client would no longer wait for it), and extras that could not *finish* within it are
    trimmed before they start.
    """

    id: int
    user: int
    segment: str
    t_s: float
    base: int
    extra: int = 0
    model: ModelName = "base"
    value: float = 0.0
    budget_ms: float = 1000.0

    def __post_init__(self) -> None:
        if self.base < 1:
            raise ProtocolError(f"base: must be >= 1, got {self.base}")
        if self.extra < 0:
            raise ProtocolError(f"extra: must be >= 0, got {self.extra}")
        if self.model not in _MODELS:
            raise ProtocolError(f"model: must be 'base' or 'strong', got {self.model!r}")
        if not self.value >= 0.0:
            raise ProtocolError(f"value: must be >= 0, got {self.value}")

    @property
    def optional(self) -> bool:
        return self.extra > 0 or self.model == "strong"

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": "rank",
            "id": self.id,
            "user": self.user,
            "segment": self.segment,
            "t_s": self.t_s,
            "base": self.base,
            "extra": self.extra,
            "model": self.model,
            "value": self.value,
            "budget_ms": self.budget_ms,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankRequest:
        if d.get("op") != "rank":
            raise ProtocolError(f"op: expected 'rank', got {d.get('op')!r}")
        return cls(
            id=_req(d, "id", int),
            user=_req(d, "user", int),
            segment=_req(d, "segment", str),
            t_s=float(_req(d, "t_s", (int, float))),
            base=_req(d, "base", int),
            extra=_req(d, "extra", int),
            model=_req(d, "model", str),
            value=float(_req(d, "value", (int, float))),
            budget_ms=float(_req(d, "budget_ms", (int, float))),
        )


@dataclass(frozen=True, slots=True)
class Health:
    """What every response says about the server: the client-side shedding input."""

    overloaded: bool
    queue_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"overloaded": self.overloaded, "queue_ms": self.queue_ms}

    @classmethod
    def from_dict(cls, d: Any) -> Health:
        if not isinstance(d, dict):
            raise ProtocolError("health: must be an object")
        return cls(
            overloaded=_req(d, "overloaded", bool),
            queue_ms=float(_req(d, "queue_ms", (int, float))),
        )


@dataclass(frozen=True, slots=True)
class RankResponse:
    """The outcome of one :class:`RankRequest`.

    ``ok`` false: nothing was ranked (``error`` says why; ``downgraded`` true when the strong model
    was refused, so the client should re-run the request on the base model). ``base_top_ad`` is
    the ad the *baseline* (base model, first ``base`` candidates) ranks first — the counterfactual
    the client needs for ground-truth incremental value; a strong-model replica computes it on the
    side, outside the request's emulated time. ``candidates`` and
    ``model`` are what was actually ranked; ``decision`` the server-side shedding decision
    (``ADMIT``, ``TRIM``, ``DOWNGRADE``, ``SHED``); ``server_ms`` the time from arrival to
    response on the server's clock; ``queue_ms`` the part of it spent waiting for slots.
    """

    id: int
    ok: bool
    health: Health
    top_ad: int = -1
    score: float = 0.0
    base_top_ad: int = -1
    candidates: int = 0
    model: ModelName = "base"
    decision: str = "ADMIT"
    downgraded: bool = False
    server_ms: float = 0.0
    queue_ms: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id,
            "ok": self.ok,
            "health": self.health.to_dict(),
            "top_ad": self.top_ad,
            "score": self.score,
            "base_top_ad": self.base_top_ad,
            "candidates": self.candidates,
            "model": self.model,
            "decision": self.decision,
            "downgraded": self.downgraded,
            "server_ms": self.server_ms,
            "queue_ms": self.queue_ms,
        }
        if self.error is not None:
            d["error"] = self.error
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankResponse:
        error = d.get("error")
        if error is not None and not isinstance(error, str):
            raise ProtocolError("error: must be a string or absent")
        return cls(
            id=_req(d, "id", int),
            ok=_req(d, "ok", bool),
            health=Health.from_dict(d.get("health")),
            top_ad=_req(d, "top_ad", int),
            score=float(_req(d, "score", (int, float))),
            base_top_ad=_req(d, "base_top_ad", int),
            candidates=_req(d, "candidates", int),
            model=_req(d, "model", str),
            decision=_req(d, "decision", str),
            downgraded=_req(d, "downgraded", bool),
            server_ms=float(_req(d, "server_ms", (int, float))),
            queue_ms=float(_req(d, "queue_ms", (int, float))),
            error=error,
        )


# -- client side ----------------------------------------------------------------------------------


class WireClient:
    """One multiplexed connection to one ranking server.

    ``await client.call(request, timeout_s)`` sends a frame and waits for the response with the same
    id. A lost connection fails every call in flight with :class:`ServerUnavailable` at once (the
    reader sees the end of stream), so a client can retry elsewhere without waiting for timeouts.
    Reconnecting is the owner's job (:meth:`connect` again after :attr:`closed`).
    """

    def __init__(self, host: str, port: int, *, connect_timeout_s: float = 1.0) -> None:
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self._connect_timeout_s = connect_timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[RankResponse]] = {}
        self._reader_task: asyncio.Task[None] | None = None
        self._closed = True
        self.lost_reason: str | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def connect(self) -> None:
        """Open the connection (:class:`ServerUnavailable` if the server does not answer)."""
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), self._connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise ServerUnavailable(f"cannot connect to {self.address}: {exc}") from None
        self._closed = False
        self.lost_reason = None
        self._reader_task = asyncio.create_task(self._read_loop(), name=f"wire-{self.address}")

    async def _read_loop(self) -> None:
        assert self._reader is not None
        reason = "connection closed by the server"
        try:
            while True:
                obj = await read_frame(self._reader)
                if obj is None:
                    break
                response = RankResponse.from_dict(obj)
                future = self._pending.pop(response.id, None)
                if future is not None and not future.done():
                    future.set_result(response)
        except (ProtocolError, OSError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            reason = "connection closed by the client"
            raise
        finally:
            self._lose(reason)

    def _lose(self, reason: str) -> None:
        self._closed = True
        self.lost_reason = reason
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ServerUnavailable(f"{self.address}: {reason}"))
        if self._writer is not None:
            self._writer.close()

    async def call(self, request: RankRequest, timeout_s: float) -> RankResponse:
        """Send one request and wait for its response; :class:`ServerUnavailable` when the
        connection is (or gets) lost, :class:`TimeoutError` after ``timeout_s``."""
        if self._closed or self._writer is None:
            raise ServerUnavailable(f"{self.address}: not connected")
        future: asyncio.Future[RankResponse] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = future
        try:
            self._writer.write(encode_frame(request.to_dict()))
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            # a slow answer on a live connection; TimeoutError is an OSError, so it is named
            # first or it would be reported as a lost server
            raise
        except OSError as exc:
            raise ServerUnavailable(f"{self.address}: {exc}") from None
        finally:
            self._pending.pop(request.id, None)

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
            self._reader_task = None
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self._closed = True


# -- server side ----------------------------------------------------------------------------------

Handler = Callable[[RankRequest], Awaitable[RankResponse]]
ErrorHook = Callable[[str, Exception], None]


async def serve(
    handler: Handler,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    on_protocol_error: ErrorHook | None = None,
) -> asyncio.Server:
    """Start serving :class:`RankRequest` frames; each request runs as its own task, responses
    are written as they complete (so a slow request never holds up a fast one). A malformed
    frame closes that connection only (``on_protocol_error(peer, exc)`` is told)."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str(writer.get_extra_info("peername"))
        tasks: set[asyncio.Task[None]] = set()
        lock = asyncio.Lock()

        async def one(request: RankRequest) -> None:
            response = await handler(request)
            async with lock:
                if writer.is_closing():
                    return
                writer.write(encode_frame(response.to_dict()))
                with contextlib.suppress(OSError):
                    await writer.drain()

        try:
            while True:
                obj = await read_frame(reader)
                if obj is None:
                    break
                request = RankRequest.from_dict(obj)
                task = asyncio.create_task(one(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except ProtocolError as exc:
            if on_protocol_error is not None:
                on_protocol_error(peer, exc)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for task in list(tasks):
                task.cancel()
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    return await asyncio.start_server(connection, host, port)
