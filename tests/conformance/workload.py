"""A seeded multi-turn chat workload and the probe prompts taken against it.

Sessions open on one of a few shared system prompts, then alternate a user
message (random tokens) with the engine's answer (the tokens the modelled model
"samples", drawn here). Each turn's prompt is the whole conversation so far
plus the new message, so consecutive turns share their prefix, sessions share
system prompts, and a session's turns mostly return to its home target. All
randomness comes from one ``random.Random(seed)``; request ids are counters.
"""

import random
from dataclasses import dataclass, field

VOCAB = 50_000


@dataclass(frozen=True)
class Namespace:
    lora: tuple | None = None  # (lora_name, lora_int_id, lora_path)
    cache_salt: str | None = None
    report_full: bool = False  # sampling extra_args kv_cache_report_mode="full"

    @property
    def lora_name(self):
        return self.lora[0] if self.lora else None


def lora(name, lora_id):
    return (name, lora_id, f"/adapters/{name}")


@dataclass(frozen=True)
class WorkloadShape:
    system_prompt_lengths: tuple = (32, 48, 64, 100, 128, 160, 37, 211, 250)
    user_message_tokens: tuple = (4, 120)
    max_tokens: tuple = (1, 16)
    max_context: int = 900  # a session ends before its prompt + answer passes this
    max_turns: int = 8
    concurrency: int = 5  # requests kept in flight per target
    stickiness: float = 0.8  # chance a target's next turn is one of its own sessions
    think_ticks: tuple = (0, 6)
    namespaces: tuple = (Namespace(),)
    namespace_weights: tuple = (1.0,)
    # Namespaces probes may use that no request does.
    probe_only_namespaces: tuple = (Namespace(cache_salt="probe-only-salt"),)


@dataclass
class Session:
    sid: int
    home: int
    namespace: Namespace
    history: list  # the conversation so far, the last answer included
    prompts: list = field(default_factory=list)  # every turn's prompt
    turns: int = 0
    busy: bool = False
    ready_tick: int = 0
    closed: bool = False


@dataclass
class TurnSpec:
    request_id: str
    target: int
    tokens: list
    max_tokens: int
    namespace: Namespace
    answer: list  # tokens the model "samples", in order


@dataclass
class ProbeSpec:
    kind: str
    tokens: list
    namespace: Namespace


class ChatWorkload:
    def __init__(self, seed, num_targets, shape):
        self.rng = random.Random(seed)
        self.shape = shape
        self.num_targets = num_targets
        self.system_prompts = [self._tokens(n) for n in shape.system_prompt_lengths]
        self.sessions = []
        self.by_request = {}
        self.next_request = 0

    def _tokens(self, n):
        return [self.rng.randrange(1, VOCAB) for _ in range(n)]

    def _user_message(self):
        return self._tokens(self.rng.randint(*self.shape.user_message_tokens))

    def _new_session(self, home):
        namespace = self.rng.choices(self.shape.namespaces, self.shape.namespace_weights)[0]
        system = self.rng.choice(self.system_prompts)
        session = Session(sid=len(self.sessions), home=home, namespace=namespace,
                          history=list(system))
        self.sessions.append(session)
        return session

    def arrivals(self, tick, inflight):
        """New turns for this tick; ``inflight[t]`` is target t's unfinished request count."""
        specs = []
        for target in range(self.num_targets):
            while inflight[target] < self.shape.concurrency:
                spec = self._next_turn(tick, target)
                inflight[target] += 1
                specs.append(spec)
        return specs

    def _next_turn(self, tick, target):
        """A turn for ``target``: usually of a session that lives there, sometimes of
        a session from another target (so conversations move between engines),
        otherwise the first turn of a new session."""
        while True:
            ready = [s for s in self.sessions
                     if not s.busy and not s.closed and s.ready_tick <= tick]
            mine = [s for s in ready if s.home == target]
            others = [s for s in ready if s.home != target]
            draw = self.rng.random()
            if mine and draw < self.shape.stickiness:
                session = self.rng.choice(mine)
            elif others and draw < self.shape.stickiness + (1 - self.shape.stickiness) / 2:
                session = self.rng.choice(others)
            else:
                session = self._new_session(target)
            tokens = session.history + self._user_message()
            max_tokens = self.rng.randint(*self.shape.max_tokens)
            if len(tokens) + max_tokens <= self.shape.max_context:
                break
            session.closed = True
        session.busy = True
        session.turns += 1
        session.prompts.append(list(tokens))
        request_id = f"req-{self.next_request}-s{session.sid}t{session.turns}"
        self.next_request += 1
        spec = TurnSpec(request_id=request_id, target=target, tokens=tokens,
                        max_tokens=max_tokens, namespace=session.namespace,
                        answer=self._tokens(max_tokens))
        self.by_request[request_id] = (session, spec)
        return spec

    def next_token(self, request):
        _, spec = self.by_request[request.request_id]
        return spec.answer[request.num_output_tokens]

    def finished(self, tick, request):
        session, spec = self.by_request.pop(request.request_id)
        session.history = list(request.all_token_ids)
        session.busy = False
        session.ready_tick = tick + self.rng.randint(*self.shape.think_ticks)
        if session.turns >= self.shape.max_turns:
            session.closed = True

    # ------------------------------------------------------------------ probes

    def probes(self, count):
        """Probe prompts: continuations of live conversations, earlier turns and
        their prefixes, fresh prompts on a shared system prompt, random prompts,
        and known conversations under another namespace. Half are cut to a whole
        number of blocks (16 tokens)."""
        out = []
        kinds = ("continuation", "earlier_turn", "prefix", "fresh_system", "random",
                 "other_namespace")
        weights = (0.3, 0.2, 0.15, 0.15, 0.05, 0.15)
        for _ in range(count):
            kind = self.rng.choices(kinds, weights)[0]
            started = [s for s in self.sessions if s.prompts]
            if not started:
                kind = "fresh_system"
            namespace = Namespace()
            if kind == "continuation":
                session = self.rng.choice(started)
                tokens = session.history + self._user_message()
                namespace = session.namespace
            elif kind == "earlier_turn":
                session = self.rng.choice(started)
                tokens = list(self.rng.choice(session.prompts))
                namespace = session.namespace
            elif kind == "prefix":
                session = self.rng.choice(started)
                prompt = self.rng.choice(session.prompts)
                tokens = prompt[: self.rng.randint(1, len(prompt))]
                namespace = session.namespace
            elif kind == "fresh_system":
                tokens = self.rng.choice(self.system_prompts) + self._user_message()
                namespace = self.rng.choices(self.shape.namespaces,
                                             self.shape.namespace_weights)[0]
            elif kind == "random":
                tokens = self._tokens(self.rng.randint(1, 300))
            else:
                session = self.rng.choice(started)
                tokens = list(self.rng.choice(session.prompts))
                others = [n for n in self.shape.namespaces + self.shape.probe_only_namespaces
                          if (n.lora, n.cache_salt) != (session.namespace.lora,
                                                        session.namespace.cache_salt)]
                namespace = self.rng.choice(others)
            if self.rng.random() < 0.5 and len(tokens) >= 16:
                tokens = tokens[: len(tokens) - len(tokens) % 16]
            out.append(ProbeSpec(kind=kind, tokens=tokens, namespace=namespace))
        return out
