"""A TCP relay that adds a fixed delay to everything a server sends back:
`python3 delay.py LISTEN_PORT TARGET_PORT DELAY_MS` relays 127.0.0.1:LISTEN_PORT
to 127.0.0.1:TARGET_PORT, holding each chunk the server sends for DELAY_MS
before passing it on (requests pass at once). Each reply thus arrives
DELAY_MS late, as across a network with that round trip; bandwidth is not
limited. The HTTP case's imitation of a remote server (the remote NBD case
uses nbdkit's delay filter, which has no HTTP counterpart). Standard library
only; ends on SIGTERM."""

import asyncio
import signal
import sys

CHUNK = 1 << 20


async def relay(reader, writer, delay):
    """Copy reader to writer, each chunk held `delay` seconds from its arrival."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def pump():
        while True:
            data = await reader.read(CHUNK)
            queue.put_nowait((loop.time() + delay, data))
            if not data:
                return

    async def deliver():
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    try:
        await asyncio.gather(pump(), deliver())
    except (ConnectionError, OSError):
        writer.close()


async def main():
    listen, target, delay_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    delay = delay_ms / 1000

    async def client(c_reader, c_writer):
        try:
            s_reader, s_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            c_writer.close()
            return
        await asyncio.gather(relay(c_reader, s_writer, 0), relay(s_reader, c_writer, delay),
                             return_exceptions=True)

    server = await asyncio.start_server(client, "127.0.0.1", listen, backlog=256)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
