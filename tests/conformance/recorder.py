"""The subscriber side: receives what vLLM's ``ZmqEventPublisher`` sends and writes the JSONL.

Nothing leaves the process: each engine's ``KVEventsConfig.endpoint`` is
``inproc://conformance/SCENARIO/endpoint-E`` (vLLM's default is
``tcp://*:5557``). vLLM binds ``inproc://`` endpoints, gives a data-parallel
rank r > 0 the endpoint with ``_dp{r}`` appended (``offset_endpoint_port``),
and makes its PUB socket on ``zmq.Context.instance()``, the context the SUB
sockets here use, as inproc requires. Each endpoint gets one SUB socket that
connects to every rank's endpoint.

Slow joiners: a PUB socket drops what it sends before a subscription reaches
it, and socket monitors report no events for inproc connections. So the SUB
sockets connect before the publishers exist (``connect``, called before the
engines are built): libzmq keeps an inproc connect to a name nobody has bound
yet pending, and when the PUB socket binds that name, ``bind`` attaches the
pipe and reads the subscription the SUB queued at connect before it returns,
so the subscription is in place before vLLM's publisher thread sends anything.
``check_publishers`` then checks that every publisher reports the endpoint a
SUB socket connected to. Every received message is checked: three frames, the
configured topic, and for each (endpoint, rank) the sequence numbers 0, 1, 2,
... with none missing or repeated; anything else raises, and a batch that
never arrives raises after ``RECEIVE_TIMEOUT_S``.

Batches are written in the order they were published (the harness records
that order), not in the order two sockets happened to deliver them, so the
file is the same on every run.
"""

import base64
import json
import time

import msgspec
import zmq

TOPIC = b""
RECEIVE_TIMEOUT_S = 20.0


class Recorder:
    def __init__(self, out_file, scenario, num_endpoints, num_ranks, rank_endpoint):
        """``rank_endpoint(endpoint, rank)`` is vLLM's ``offset_endpoint_port``."""
        self.out = out_file
        self.num_ranks = num_ranks
        self.ctx = zmq.Context.instance()
        self.base_endpoints = [f"inproc://conformance/{scenario}/endpoint-{e}"
                               for e in range(num_endpoints)]
        self.rank_endpoints = [[rank_endpoint(base, rank) for rank in range(num_ranks)]
                               for base in self.base_endpoints]
        self.subs = []
        self.poller = zmq.Poller()
        self.published = []  # (endpoint, rank, seq) in publish order
        self.next_published = {}  # (endpoint, rank) -> next seq to publish
        self.received = {}  # (endpoint, rank, seq) -> payload
        self.next_received = {}  # (endpoint, rank) -> next seq expected
        self.written = 0
        self.batches = 0
        self.probes = 0

    def publisher_endpoint(self, endpoint):
        """The ``KVEventsConfig.endpoint`` an engine of this endpoint gets (every rank)."""
        return self.base_endpoints[endpoint]

    def connect(self):
        """Subscribes to every publisher; call it before any publisher is made."""
        for endpoints in self.rank_endpoints:
            sub = self.ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
            sub.setsockopt(zmq.LINGER, 0)
            sub.set_hwm(0)
            for address in endpoints:
                sub.connect(address)
            self.subs.append(sub)
            self.poller.register(sub, zmq.POLLIN)

    def check_publishers(self, engines):
        """Every engine's publisher is bound where its endpoint's SUB socket connected."""
        for engine in engines:
            bound = engine.publisher.get_publisher_config().endpoint
            expected = self.rank_endpoints[engine.endpoint][engine.rank]
            if bound != expected:
                raise RuntimeError(f"engine {engine.endpoint}/{engine.rank} publishes on "
                                   f"{bound}, the harness subscribed to {expected}")

    # ------------------------------------------------------------- JSONL

    def _line(self, obj):
        self.out.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def header(self, obj):
        self._line({"kind": "header", **obj})

    def note_published(self, endpoint, rank):
        seq = self.next_published.get((endpoint, rank), 0)
        self.next_published[(endpoint, rank)] = seq + 1
        self.published.append((endpoint, rank, seq))

    def sync(self):
        """Receives every batch published so far and writes them, in publish order."""
        deadline = time.monotonic() + RECEIVE_TIMEOUT_S
        while any(key not in self.received for key in self.published[self.written:]):
            if time.monotonic() > deadline:
                missing = [k for k in self.published[self.written:] if k not in self.received]
                raise RuntimeError(f"batches never arrived (endpoint, rank, seq): {missing[:5]}")
            for sub, _ in self.poller.poll(100):
                self._receive(sub)
        for key in self.published[self.written:]:
            payload = self.received.pop(key)
            self._line({"kind": "batch", "endpoint": key[0], "seq": key[2],
                        "payload": base64.b64encode(payload).decode("ascii")})
            self.batches += 1
        self.written = len(self.published)

    def _receive(self, sub):
        endpoint = self.subs.index(sub)
        while True:
            try:
                frames = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3:
                raise RuntimeError(f"expected 3 frames, got {len(frames)}")
            topic, seq_bytes, payload = frames
            if topic != TOPIC:
                raise RuntimeError(f"unexpected topic {topic!r}")
            if len(seq_bytes) != 8:
                raise RuntimeError("sequence frame is not 8 bytes")
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            batch = msgspec.msgpack.decode(payload)
            rank = batch[2] if len(batch) > 2 and batch[2] is not None else 0
            expected = self.next_received.get((endpoint, rank), 0)
            if seq != expected:
                raise RuntimeError(
                    f"endpoint {endpoint} rank {rank}: got seq {seq}, expected {expected}")
            self.next_received[(endpoint, rank)] = seq + 1
            self.received[(endpoint, rank, seq)] = payload

    def probe(self, obj):
        assert self.written == len(self.published), "sync() before writing a probe"
        self._line({"kind": "probe", **obj})
        self.probes += 1

    def reset(self, obj):
        """A prefix-cache reset, written after every batch published before it."""
        assert self.written == len(self.published), "sync() before writing a reset"
        self._line({"kind": "reset", **obj})

    def end(self):
        self.sync()
        self._line({"kind": "end", "batches": self.batches, "probes": self.probes})

    def close(self):
        for sub in self.subs:
            sub.close(0)
