"""A TCP proxy that adds a fixed network delay, to benchmark stores as a network sees them.

    python -m benchmarks.latency_proxy --target 127.0.0.1:8000 --rtt-ms 2
    # prints "listening 127.0.0.1:PORT", then forwards until killed

Every chunk is delivered ``rtt_ms / 2`` after it was read, in each direction, in order;
the proxy never waits for a reply before forwarding more, so pipelined requests stay
pipelined. Loopback answers in ~0.05 ms, where a client in the same AWS region as
DynamoDB or a MongoDB primary waits ~1-3 ms per round trip: a local server alone hides
what saving round trips is worth. Not a test and not part of the product.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

_CHUNK = 65_536


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Forward ``reader`` to ``writer``, each chunk ``delay`` seconds after it arrived."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    sender = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(_CHUNK)
            queue.put_nowait((time.monotonic() + delay, data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()
    finally:
        writer.close()


async def serve(target_host: str, target_port: int, rtt_ms: float) -> None:
    """Forward connections on a free loopback port to the target, with the delay."""
    delay = rtt_ms / 2000

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            _pump(client_r, server_w, delay),
            _pump(server_r, client_w, delay),
            return_exceptions=True,
        )

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"listening {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def delayed(target: str, rtt_ms: float) -> Iterator[str]:
    """``host:port`` of a proxy process in front of ``target`` (returned as is for 0 ms)."""
    if rtt_ms <= 0:
        yield target
        return
    command = [sys.executable, "-m", "benchmarks.latency_proxy", "--target", target]
    proc = subprocess.Popen(
        [*command, "--rtt-ms", str(rtt_ms)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "listening":
            raise RuntimeError(f"latency proxy did not start: {line}")
        yield line[1]
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--rtt-ms", type=float, default=2.0, help="added round-trip time")
    args = parser.parse_args()
    host, _, port = args.target.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(host, int(port), args.rtt_ms))


if __name__ == "__main__":
    main()
