"""The loopback protocol: frames, messages, multiplexing, lost connections, hostile bytes."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.workers.wire import (
    MAX_FRAME_BYTES,
    Health,
    ProtocolError,
    RankRequest,
    RankResponse,
    ServerUnavailable,
    WireClient,
    decode_body,
    encode_frame,
    read_frame,
    serve,
)

requests = st.builds(
    RankRequest,
    id=st.integers(0, 2**62),
    user=st.integers(0, 2**62),
    segment=st.text(min_size=1, max_size=20),
    t_s=st.floats(0, 1e9),
    base=st.integers(1, 10_000),
    extra=st.integers(0, 10_000),
    model=st.sampled_from(["base", "strong"]),
    value=st.floats(0, 1e6),
    budget_ms=st.floats(0, 1e5),
)


@given(requests)
def test_a_request_survives_a_round_trip(req: RankRequest) -> None:
    frame = encode_frame(req.to_dict())
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    assert RankRequest.from_dict(decode_body(frame[4:])) == req


def test_a_response_survives_a_round_trip() -> None:
    resp = RankResponse(
        id=7,
        ok=False,
        health=Health(overloaded=True, queue_ms=12.5),
        model="strong",
        decision="DOWNGRADE",
        downgraded=True,
        error="shed",
    )
    assert RankResponse.from_dict(decode_body(encode_frame(resp.to_dict())[4:])) == resp


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"op": "rank", "id": 1}, "user"),
        ({"op": "rank", "id": True, "user": 1}, "id"),
        ({"op": "nope"}, "op"),
    ],
)
def test_a_malformed_request_names_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(ProtocolError, match=field):
        RankRequest.from_dict(body)


def test_request_fields_are_validated() -> None:
    with pytest.raises(ProtocolError, match="base"):
        RankRequest(id=1, user=1, segment="s", t_s=0.0, base=0)
    with pytest.raises(ProtocolError, match="model"):
        RankRequest(id=1, user=1, segment="s", t_s=0.0, base=1, model="huge")  # type: ignore[arg-type]
    assert RankRequest(id=1, user=1, segment="s", t_s=0.0, base=1, extra=3).optional
    assert not RankRequest(id=1, user=1, segment="s", t_s=0.0, base=1).optional


def test_non_json_and_non_object_bodies_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError, match="not JSON"):
        decode_body(b"\xff\x00")
    with pytest.raises(ProtocolError, match="object"):
        decode_body(b"[1, 2]")


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_read_frame_rejects_an_oversized_length_before_reading_it() -> None:
    reader = _reader(struct.pack(">I", MAX_FRAME_BYTES + 1) + b"x")
    with pytest.raises(ProtocolError, match="over the limit"):
        await read_frame(reader)


async def test_read_frame_distinguishes_a_clean_end_from_a_torn_frame() -> None:
    assert await read_frame(_reader(b"")) is None
    with pytest.raises(ProtocolError, match="header"):
        await read_frame(_reader(b"\x00\x00"))
    with pytest.raises(ProtocolError, match="body"):
        await read_frame(_reader(struct.pack(">I", 10) + b"{}"))


async def _echo_server(delays: dict[int, float]) -> asyncio.Server:
    async def handle(req: RankRequest) -> RankResponse:
        await asyncio.sleep(delays.get(req.id, 0.0))
        return RankResponse(
            id=req.id, ok=True, health=Health(False, 0.0), top_ad=req.user, candidates=req.base
        )

    return await serve(handle, "127.0.0.1", 0)


@contextlib.asynccontextmanager
async def _echo_client(delays: dict[int, float]) -> AsyncIterator[WireClient]:
    """A client connected to :func:`_echo_server`; both closed on the way out."""
    server = await _echo_server(delays)
    client = WireClient("127.0.0.1", server.sockets[0].getsockname()[1])
    await client.connect()
    try:
        yield client
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


async def test_responses_are_matched_to_requests_whatever_their_order() -> None:
    # request 0 is slow: the others overtake it on the same connection
    async with _echo_client({0: 0.05}) as client:
        calls = [
            client.call(RankRequest(id=i, user=100 + i, segment="s", t_s=0.0, base=5), 5.0)
            for i in range(20)
        ]
        done = await asyncio.gather(*calls)
        assert [r.top_ad for r in done] == [100 + i for i in range(20)]
        assert client.in_flight == 0


async def test_a_slow_answer_is_a_timeout_and_the_connection_stays_up() -> None:
    # request 0 takes longer than the caller waits: TimeoutError (an OSError), not a lost server
    async with _echo_client({0: 0.5}) as client:
        with pytest.raises(TimeoutError):
            await client.call(RankRequest(id=0, user=7, segment="s", t_s=0.0, base=1), 0.05)
        assert not client.closed
        assert client.in_flight == 0
        done = await client.call(RankRequest(id=1, user=8, segment="s", t_s=0.0, base=1), 5.0)
        assert done.top_ad == 8


async def test_a_lost_connection_fails_every_call_in_flight_at_once() -> None:
    # a server that reads two requests and dies without answering (like kill -9)
    got_two = asyncio.Event()

    async def crash(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):
            await read_frame(reader)
        got_two.set()
        writer.transport.abort()

    server = await asyncio.start_server(crash, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = WireClient("127.0.0.1", port)
    await client.connect()
    calls = [
        asyncio.ensure_future(
            client.call(RankRequest(id=i, user=i, segment="s", t_s=0.0, base=1), 30.0)
        )
        for i in (1, 2)
    ]
    await got_two.wait()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, ServerUnavailable) for r in results), results
    assert client.closed
    with pytest.raises(ServerUnavailable):
        await client.call(RankRequest(id=3, user=3, segment="s", t_s=0.0, base=1), 1.0)
    await client.close()
    server.close()
    await server.wait_closed()


async def test_connecting_to_nobody_is_server_unavailable() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    client = WireClient("127.0.0.1", port)
    with pytest.raises(ServerUnavailable, match="cannot connect"):
        await client.connect()


async def test_a_malformed_frame_closes_only_that_connection() -> None:
    seen: list[str] = []
    server = await serve(
        lambda req: asyncio.sleep(0, RankResponse(id=req.id, ok=True, health=Health(False, 0.0))),
        "127.0.0.1",
        0,
        on_protocol_error=lambda peer, exc: seen.append(str(exc)),
    )
    port = server.sockets[0].getsockname()[1]
    good = WireClient("127.0.0.1", port)
    await good.connect()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(struct.pack(">I", 3) + b"[1]")
    await writer.drain()
    assert await reader.read() == b""  # the server hung up on the bad peer
    writer.close()
    resp = await good.call(RankRequest(id=9, user=1, segment="s", t_s=0.0, base=1), 5.0)
    assert resp.ok
    assert seen
    assert "object" in seen[0]
    await good.close()
    server.close()
    await server.wait_closed()
