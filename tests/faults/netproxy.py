"""The fault network: one TCP proxy in front of every server endpoint of the
cluster (etcd, each bookie, each broker's Pulsar port), and per directed link
between two named nodes a rule that the proxies apply to the bytes they carry.

Why a proxy and not iptables: every process connects from 127.0.0.1 (the
kernel's source address for all of 127.0.0.0/8, whatever the destination),
so address rules on `lo` cannot tell two brokers apart without a source-bind
option in every client (bookie client, etcd client) of the Rust code; and CI
may run where netfilter or `tc netem` is unavailable. A proxy needs no
privileges, runs wherever Python does, and can do what iptables cannot
without netem (delay, retransmission stalls, throttling).

Who is on the other end of an accepted connection: the proxy looks the
client's socket up in /proc/net/tcp (its inode) and finds which of the
cluster's processes holds that inode in /proc/PID/fd. Every process of the
cluster is ours, so this works as root and as an ordinary user (Linux only).

Rules act on the bytes flowing from one node to another:
- `blackhole`: held, not dropped (a TCP stream cannot lose bytes; a real
  partition makes the kernel retransmit until healed, or until a timeout in
  the application gives up on the connection). A new connection across a
  blackholed link is accepted but not connected on until healed (the SYN
  "hangs").
- `delay` (seconds, jitter): each chunk delivered that much later, in order.
- `loss` (probability): a chunk is held 0.2-0.3 s with that probability, as
  a lost segment waits for its retransmission timeout.
- `throttle` (bytes/s).
`reset(a, b)` closes every connection between a and b with an RST.
"""

import asyncio
import os
import socket
import struct
import threading
import time

CHUNK_BYTES_MAX = 64 * 1024
# Chunks queued per direction of a connection before the proxy stops reading
# (TCP back-pressure instead of unbounded memory while a link is held).
QUEUE_CHUNKS_MAX = 64
UPSTREAM_CONNECT_TIMEOUT_S = 5.0


class Rule:
    __slots__ = ("kind", "delay_s", "jitter_s", "loss", "rate_bps")

    def __init__(self, kind, delay_s=0.0, jitter_s=0.0, loss=0.0, rate_bps=0):
        assert kind in ("blackhole", "delay", "loss", "throttle"), kind
        self.kind, self.delay_s, self.jitter_s, self.loss, self.rate_bps = kind, delay_s, jitter_s, loss, rate_bps

    def __repr__(self):
        if self.kind == "delay":
            return "delay %dms+-%dms" % (self.delay_s * 1000, self.jitter_s * 1000)
        if self.kind == "loss":
            return "loss %.0f%%" % (self.loss * 100)
        if self.kind == "throttle":
            return "throttle %dB/s" % self.rate_bps
        return self.kind


V4_MAPPED_PREFIX = "0000000000000000FFFF0000"
CLOSED = object()


def _hex_addr(ip, port):
    return "%08X:%04X" % (struct.unpack("<I", socket.inet_aton(ip))[0], port)


def socket_inode(local, remote):
    """Inode of the TCP socket whose local end is `local` and remote end
    `remote` ((ip, port) IPv4 pairs), from /proc/net/tcp, or /proc/net/tcp6
    for an IPv6 socket talking IPv4 (v4-mapped: the C++ Pulsar client's);
    None if absent."""
    want = {
        "/proc/net/tcp": (_hex_addr(*local), _hex_addr(*remote)),
        "/proc/net/tcp6": (V4_MAPPED_PREFIX + _hex_addr(*local), V4_MAPPED_PREFIX + _hex_addr(*remote)),
    }
    for path, (want_local, want_remote) in want.items():
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[1] == want_local and fields[2] == want_remote:
                        return fields[9]
        except OSError:
            continue
    return None


def pid_holding(inode, pids):
    target = "socket:[%s]" % inode
    for pid in pids:
        fd_dir = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) == target:
                    return pid
            except OSError:
                continue
    return None


class _Conn:
    def __init__(self, src, dst):
        self.src, self.dst = src, dst
        self.writers = []

    def abort(self):
        for w in self.writers:
            sock = w.get_extra_info("socket")
            try:
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            w.transport.abort()


class FaultNet:
    """Proxies on an event loop of their own (a daemon thread); every public
    method is safe to call from any thread."""

    def __init__(self, rng_seed, pids_of):
        # `pids_of()` -> {pid: node name} of the cluster's live processes.
        self.pids_of = pids_of
        self.rules = {}
        self.conns = set()
        self.unknown_peers = 0
        self.unknown_samples = []
        self.loop = asyncio.new_event_loop()
        # Jitter and loss draws come from their own RNG: the schedule's RNG
        # stays independent of how many chunks happened to flow.
        import random

        self.chunk_rng = random.Random(rng_seed)
        self._changed = None
        self.servers = []
        self.thread = threading.Thread(target=self._run, name="faultnet", daemon=True)
        self.thread.start()
        self._call(self._init_event)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _call(self, fn, *args):
        """Runs `fn(*args)` (a plain function or a coroutine function) on the
        loop and returns its result."""

        async def wrapper():
            out = fn(*args)
            if asyncio.iscoroutine(out):
                out = await out
            return out

        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(timeout=30)

    def _init_event(self):
        self._changed = asyncio.Event()

    def _notify(self):
        old, self._changed = self._changed, asyncio.Event()
        old.set()

    # --- configuration -----------------------------------------------------------

    def add_proxy(self, dst_node, listen, target):
        """Listens on `listen` (ip, port) and forwards to `target` as the
        node `dst_node`."""

        async def start():
            server = await asyncio.start_server(
                lambda r, w: self._accept(r, w, dst_node, listen, target),
                host=listen[0],
                port=listen[1],
                reuse_address=True,
            )
            self.servers.append(server)

        self._call(start)

    def set_rule(self, frm, to, rule):
        """Bytes from `frm` to `to` follow `rule` (None: pass freely)."""

        def apply():
            if rule is None:
                self.rules.pop((frm, to), None)
            else:
                self.rules[(frm, to)] = rule
            self._notify()

        self._call(apply)

    def heal(self):
        def apply():
            self.rules.clear()
            self._notify()

        self._call(apply)

    def reset(self, a, b):
        """RST every open connection between nodes a and b; the count."""

        def apply():
            hit = [c for c in self.conns if {c.src, c.dst} == {a, b}]
            for c in hit:
                c.abort()
            return len(hit)

        return self._call(apply)

    def close(self):
        async def stop():
            for s in self.servers:
                s.close()
            for c in list(self.conns):
                c.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self._call(stop)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)

    # --- the proxy ---------------------------------------------------------------

    async def _identify_retrying(self, peer, listen):
        for _ in range(5):
            src = self._identify(peer, listen)
            if src is not None:
                return src
            await asyncio.sleep(0.05)
        return None

    def _identify(self, peer, listen):
        inode = socket_inode(peer, listen)
        if inode is None:
            return None
        if inode == "0":
            return CLOSED
        pids = self.pids_of()
        pid = pid_holding(inode, list(pids))
        return pids.get(pid) if pid is not None else None

    def _held(self, frm, to):
        rule = self.rules.get((frm, to))
        return rule is not None and rule.kind == "blackhole"

    async def _accept(self, reader, writer, dst, listen, target):
        peer = writer.get_extra_info("peername")
        src = await self._identify_retrying(peer[:2], listen)
        if src == CLOSED:
            # The client closed the connection before it was accepted here
            # (its socket lingers without an owner): nothing to carry.
            writer.transport.abort()
            return
        if src is None:
            self.unknown_peers += 1
            self.unknown_samples.append((dst, peer[:2]))
            del self.unknown_samples[:-20]
            src = "?"
        conn = _Conn(src, dst)
        conn.writers.append(writer)
        self.conns.add(conn)
        try:
            # Connecting takes both directions (SYN, SYN-ACK).
            while self._held(src, dst) or self._held(dst, src):
                await self._changed.wait()
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(target[0], target[1]), UPSTREAM_CONNECT_TIMEOUT_S
                )
            except (OSError, asyncio.TimeoutError):
                conn.abort()
                return
            conn.writers.append(up_writer)
            for w in (writer, up_writer):
                sock = w.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.gather(
                self._pipe(reader, up_writer, src, dst, conn),
                self._pipe(up_reader, writer, dst, src, conn),
                return_exceptions=True,
            )
        finally:
            self.conns.discard(conn)
            for w in conn.writers:
                w.close()

    async def _pipe(self, reader, writer, frm, to, conn):
        queue = asyncio.Queue(QUEUE_CHUNKS_MAX)
        delivery = asyncio.ensure_future(self._deliver(queue, writer, frm, to, conn))
        last_ready = 0.0
        try:
            while True:
                try:
                    data = await reader.read(CHUNK_BYTES_MAX)
                except (OSError, ConnectionError):
                    data = b""
                if not data:
                    break
                ready = time.monotonic()
                rule = self.rules.get((frm, to))
                if rule is not None:
                    if rule.kind == "delay":
                        ready += max(0.0, rule.delay_s + self.chunk_rng.uniform(-rule.jitter_s, rule.jitter_s))
                    elif rule.kind == "loss" and self.chunk_rng.random() < rule.loss:
                        # Linux's minimum retransmission timeout is 200 ms;
                        # small request/response traffic mostly loses its
                        # last segment in flight, which only the RTO recovers.
                        ready += self.chunk_rng.uniform(0.2, 0.3)
                last_ready = max(last_ready, ready)
                await queue.put((last_ready, data))
        finally:
            await queue.put(None)
            await delivery

    async def _deliver(self, queue, writer, frm, to, conn):
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                ready, data = item
                wait = ready - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                while self._held(frm, to):
                    await self._changed.wait()
                rule = self.rules.get((frm, to))
                if rule is not None and rule.kind == "throttle" and rule.rate_bps > 0:
                    await asyncio.sleep(len(data) / rule.rate_bps)
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            # One side ended: end the connection (these protocols never
            # half-close).
            for w in conn.writers:
                w.close()
