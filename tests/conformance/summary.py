"""Counts what an output file holds; ``python summary.py FILE...`` prints them.

Decodes every batch payload (msgpack, as vLLM's ``KVEventBatch``: [ts, events,
data_parallel_rank], each event a tagged array) and reports, per scenario:
batches; BlockStored / BlockRemoved counts and hashes per (group, medium);
AllBlocksCleared; the shapes stores take (hashes per event, token_ids per event,
block_size); how many stored hashes the engine already held (a second
physical block with the same content, or a kv_cache_report_mode="full"
re-announcement); how many stores name a parent that the same engine's same
(group, medium) does not hold at that point (a hash is held while it was
stored more often than removed; AllBlocksCleared drops everything the engine
holds); and the probes' hit figures (with offloading, how many probes are
``external_pending``).

For CPU stores of group 0 it also compares, per engine and in stream order,
each CPU BlockStored with that engine's GPU holds; here AllBlocksCleared
(vLLM's GPU block pool publishes it) empties the GPU holds only, since a reset
with ``reset_connector=False`` keeps the CPU chunks. It counts the CPU stores
naming a hash the GPU did not hold at that point (a block evicted before the
store was announced); the CPU stores whose parent neither the GPU nor any CPU
store announced so far held, and where that parent's CPU chunk (the CPU store
whose last hash it is) came: later in the same batch, in a later batch, or
not at all; and the batches in which a CPU store comes before the CPU store
of its parent's chunk.
"""

import base64
import json
import sys
from collections import Counter, defaultdict

import msgspec

# Field order of vLLM's BlockStored / BlockRemoved as encoded (tag first).
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window", "locality", "ownership", "session_id",
                 "lookahead_token_ids")
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx", "locality", "ownership")


def decode_event(raw):
    """A vLLM KV event as a dict; ``kind`` is the msgspec tag."""
    if isinstance(raw, dict):
        event = dict(raw)
        event["kind"] = event.pop("type")
        return event
    tag, *values = raw
    fields = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS}.get(tag, ())
    event = dict(zip(fields, values))
    event["kind"] = tag
    return event


class CpuAgainstGpu:
    """CPU stores of group 0 against the same engine's GPU blocks, in stream order."""

    def __init__(self):
        self.gpu = defaultdict(Counter)  # engine -> hash -> stores minus removals
        self.cpu = defaultdict(Counter)
        self.batch = 0
        self.stores = 0
        self.gpu_gone = 0  # CPU stores naming a hash the GPU no longer held
        self.with_parent = 0
        self.unseen = {}  # (engine, parent) -> batch of the CPU stores naming it, not announced
        self.unseen_then = Counter()  # where the parent's chunk came: same/later batch
        self.unseen_total = 0
        self.batch_ends = {}  # last hash of a CPU store in this batch -> its position
        self.batch_parents = []  # (position, parent) of this batch's CPU stores
        self.child_first_batches = 0

    def event(self, engine, position, event):
        """``position``: the event's index in its batch."""
        kind = event["kind"]
        if kind == "AllBlocksCleared":
            self.gpu[engine].clear()
            return
        if event.get("group_idx", 0) != 0 or event.get("medium") not in ("GPU", "CPU"):
            return
        hashes = event["block_hashes"]
        held = self.gpu[engine] if event["medium"] == "GPU" else self.cpu[engine]
        if kind == "BlockRemoved":
            held.subtract(hashes)
            return
        if kind != "BlockStored":
            return
        if event["medium"] == "CPU":
            self._cpu_store(engine, event, position)
        held.update(hashes)

    def _cpu_store(self, engine, event, position):
        hashes = event["block_hashes"]
        self.stores += 1
        self.gpu_gone += any(self.gpu[engine][h] <= 0 for h in hashes)
        if hashes:
            named = self.unseen.pop((engine, hashes[-1]), None)
            if named is not None:
                for batch in named:
                    self.unseen_then["same batch" if batch == self.batch else "later batch"] += 1
            self.batch_ends.setdefault(hashes[-1], position)
        parent = event["parent_block_hash"]
        if parent is None:
            return
        self.with_parent += 1
        self.batch_parents.append((position, parent))
        if self.gpu[engine][parent] <= 0 and self.cpu[engine][parent] <= 0:
            self.unseen_total += 1
            self.unseen.setdefault((engine, parent), []).append(self.batch)

    def end_batch(self):
        self.child_first_batches += any(self.batch_ends.get(parent, -1) > position
                                        for position, parent in self.batch_parents)
        self.batch += 1
        self.batch_ends = {}
        self.batch_parents = []

    def lines(self):
        if not self.stores:
            return []
        never = sum(len(batches) for batches in self.unseen.values())
        return [
            f"  CPU stores against the GPU: {self.stores} CPU BlockStored, "
            f"{self.gpu_gone} naming a block the GPU no longer held; "
            f"{self.unseen_total}/{self.with_parent} name a parent neither the GPU nor an "
            f"announced CPU chunk held (its chunk came later in the same batch "
            f"{self.unseen_then['same batch']}, in a later batch "
            f"{self.unseen_then['later batch']}, not at all {never}); "
            f"batches with a CPU chunk before its parent's chunk: {self.child_first_batches}"]


def summarize(path, stream=sys.stdout):
    stored = Counter()
    stored_hashes = Counter()
    removed_hashes = Counter()
    shapes = Counter()
    cleared = 0
    orphan_parents = Counter()
    restored_held = Counter()
    batches_by_engine = Counter()
    parents_checked = Counter()
    # (endpoint, rank, group, medium) -> hash -> how many stores minus removals
    holds = defaultdict(Counter)
    probes = []
    header = end = None
    batches = 0
    offload = CpuAgainstGpu()
    with open(path) as f:
        for line in f:
            obj = json.loads(line)
            kind = obj["kind"]
            if kind == "header":
                header = obj
            elif kind == "end":
                end = obj
            elif kind == "reset":
                pass
            elif kind == "probe":
                probes.append(obj)
            elif kind == "batch":
                batches += 1
                batch = msgspec.msgpack.decode(base64.b64decode(obj["payload"]))
                rank = batch[2] if len(batch) > 2 else None
                engine = (obj["endpoint"], rank)
                batches_by_engine[engine] += 1
                for index, raw in enumerate(batch[1]):
                    event = decode_event(raw)
                    offload.event(engine, index, event)
                    if event["kind"] == "AllBlocksCleared":
                        cleared += 1
                        for key in [k for k in holds if k[:2] == engine]:
                            holds[key].clear()
                        continue
                    where = (event.get("group_idx"), event.get("medium"))
                    held = holds[engine + where]
                    if event["kind"] == "BlockStored":
                        stored[where] += 1
                        stored_hashes[where] += len(event["block_hashes"])
                        shapes[(where, len(event["block_hashes"]), len(event["token_ids"]),
                                event["block_size"])] += 1
                        parent = event["parent_block_hash"]
                        if parent is not None:
                            parents_checked[where] += 1
                            if held[parent] <= 0:
                                orphan_parents[where] += 1
                        restored_held[where] += sum(held[h] > 0 for h in event["block_hashes"])
                        held.update(event["block_hashes"])
                    elif event["kind"] == "BlockRemoved":
                        removed_hashes[where] += len(event["block_hashes"])
                        held.subtract(event["block_hashes"])
                offload.end_batch()
    assert header is not None and end is not None, f"{path} is incomplete"
    assert end["batches"] == batches and end["probes"] == len(probes), "end line disagrees"

    def where_name(where):
        group, medium = where
        return f"g{group}/{medium}"

    labels = " | ".join(f"{e['endpoint']}/{e['rank']}: {e['label']}" for e in header["engines"])
    out = [f"== {header['scenario']} ({labels})",
           f"  batches {batches} (per endpoint/data_parallel_rank: "
           f"{', '.join(f'{e}/{r}: {n}' for (e, r), n in sorted(batches_by_engine.items()))}), "
           f"AllBlocksCleared {cleared}"]
    for where in sorted(set(stored) | set(removed_hashes), key=str):
        out.append(
            f"  {where_name(where)}: {stored[where]} BlockStored ({stored_hashes[where]} hashes), "
            f"{removed_hashes[where]} hashes removed, {restored_held[where]} hashes stored again "
            f"while held; stores naming a parent this engine's {where_name(where)} did not hold: "
            f"{orphan_parents[where]}/{parents_checked[where]}")
    common = sorted(shapes.items(), key=lambda item: -item[1])[:6]
    out.append("  store shapes (group/medium, hashes, token_ids, block_size) x count: " + ", ".join(
        f"({where_name(w)},{h},{t},{b})x{n}" for (w, h, t, b), n in common))
    if probes:
        hits = [p["hit_tokens"] for p in probes]
        external = [p["external_hit_tokens"] for p in probes]
        nonzero = sum(1 for h in hits if h)
        pending = ""
        if any(e["offload"] is not None for e in header["engines"]):
            pending = (f" ({sum(1 for p in probes if p.get('external_pending'))} "
                       f"external_pending)")
        out.append(
            f"  probes {len(probes)}{pending}: mean hit {sum(hits) / len(hits):.1f} tokens, "
            f"mean external {sum(external) / len(external):.1f}, {nonzero} with a hit, "
            f"{sum(1 for e in external if e)} with an external hit, "
            f"{sum(1 for p in probes if len(p['tokens']) % 16 == 0)} block-aligned prompts")
    out += offload.lines()
    stream.write("\n".join(out) + "\n")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        summarize(name)
