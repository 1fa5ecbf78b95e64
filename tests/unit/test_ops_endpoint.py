"""The ops endpoint's HTTP, against the server itself (no consumer behind it)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client

import pytest

from streams.ops import Health, Metrics, OpsServer


def _ask(port: int, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


async def _raw(port: int, request: bytes) -> bytes:
    """All that ``request`` gets back, up to the server's close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


async def test_head_is_answered_as_get_without_a_body_and_a_405_says_what_is_allowed() -> None:
    # HEAD got a 405 with a body (no answer to HEAD may have one) and no Allow header
    server = OpsServer(Health(Metrics()), "127.0.0.1", 0)
    await server.start()
    try:
        for path, status in (("/healthz", 200), ("/readyz", 503), ("/metrics", 200)):
            got, headers, _ = await asyncio.to_thread(_ask, server.port, "GET", path)
            assert got == status
            head = await asyncio.to_thread(_ask, server.port, "HEAD", path)
            assert head == (status, headers, b"")
            raw = await _raw(server.port, f"HEAD {path} HTTP/1.1\r\n\r\n".encode())
            assert raw.endswith(b"\r\n\r\n")  # the headers alone
        status, headers, _ = await asyncio.to_thread(_ask, server.port, "POST", "/healthz")
        assert status == 405
        assert headers["Allow"] == "GET, HEAD"
    finally:
        await server.stop()


async def test_a_client_that_stops_reading_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # the answer was written with no time limit: a client that read nothing of a large
    # /metrics kept its connection (and on Python 3.12 and later the shutdown) for good
    body = b"x" * (64 << 20)  # more than the two sockets' buffers hold
    monkeypatch.setattr(OpsServer, "patience_s", 0.5, raising=False)
    monkeypatch.setattr(
        OpsServer, "_answer", lambda self, method, path: ("200 OK", "text/plain", body)
    )
    server = OpsServer(Health(Metrics()), "127.0.0.1", 0)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, limit=1 << 16)
        transport = writer.transport
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()
        writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")
        await asyncio.sleep(2)  # reading nothing, past the server's patience (twice over)
        transport.resume_reading()
        got = 0
        with contextlib.suppress(ConnectionResetError):
            while chunk := await asyncio.wait_for(reader.read(1 << 20), 10):
                got += len(chunk)
        writer.close()
        assert got < len(body)  # cut off, not waited for
    finally:
        await asyncio.wait_for(server.stop(), 5)


async def test_a_malformed_request_line_is_a_bad_request() -> None:
    # a request line that was not "METHOD TARGET HTTP/x" was answered 405, as if its
    # first word were a method the endpoint does not serve
    server = OpsServer(Health(Metrics()), "127.0.0.1", 0)
    await server.start()
    try:
        for request in (b"garbage", b"GET", b"GET /healthz", b"GET  /healthz HTTP/1.1", b" "):
            raw = await _raw(server.port, request + b"\r\n\r\n")
            assert raw.startswith(b"HTTP/1.1 400 Bad Request\r\n"), (request, raw)
            assert b"Allow:" not in raw
        raw = await _raw(server.port, b"GET /healthz?x=1 HTTP/1.0\r\nHost: a\r\n\r\n")
        assert raw.startswith(b"HTTP/1.1 200 OK\r\n")
    finally:
        await server.stop()
