"""Sample-flow volume of one iteration: centralized buffer vs the transfer dock.

Paper Eq. 1-2 as decoded in docs/architecture.md §4 (Table 1's six rows fitted):
``V_central = G * N * (8 * L_p + 12 * n_l * L_r)`` bytes per iteration through the one
buffer endpoint, dispatched at 100 MB/s between hosts: ``T = V / 2^30 * 1024 / 100`` s.
With ``n_w`` warehouses each endpoint carries ``V / n_w`` plus metadata: a few 8-byte
scalars (index, warehouse, lengths, consumed flag) per sample for each controller.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

INTER_HOST_MB_PER_S = 100.0
METADATA_SCALARS = 4
SCALAR_BYTES = 8


@dataclass(frozen=True)
class SampleFlow:
    central_bytes: float
    central_seconds: float
    warehouses: int
    controllers: int
    dock_endpoint_bytes: float
    dock_metadata_bytes: float
    dock_endpoint_seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def central_volume_bytes(g: int, n: int, prompt_len: int, n_items: int, response_len: int) -> float:
    """Paper Eq. 2: bytes through a centralized replay buffer in one GRPO iteration."""
    return float(g * n * (8 * prompt_len + 12 * n_items * response_len))


def stored_sample_flow(
    samples: int, sample_bytes: float, warehouses: int, controllers: int
) -> SampleFlow:
    """The same volumes for samples of a known size, each put once and fetched once (an
    embodied run's chunk steps: mindrl/workers/embodied.py): ``2 * samples *
    sample_bytes`` through a centralized buffer, that over ``warehouses`` plus the
    controllers' metadata through each dock endpoint."""
    return flow_of(2.0 * samples * sample_bytes, samples, warehouses, controllers)


def flow_of(central: float, samples: int, warehouses: int, controllers: int) -> SampleFlow:
    """The flow of ``samples`` whose payloads put ``central`` bytes through a centralized
    buffer: the same over ``warehouses`` dock endpoints, plus each controller's metadata."""
    metadata = float(samples * controllers * METADATA_SCALARS * SCALAR_BYTES)
    endpoint = central / warehouses + metadata / warehouses
    return SampleFlow(
        central_bytes=central,
        central_seconds=dispatch_seconds(central),
        warehouses=warehouses,
        controllers=controllers,
        dock_endpoint_bytes=endpoint,
        dock_metadata_bytes=metadata,
        dock_endpoint_seconds=dispatch_seconds(endpoint),
    )


def dispatch_seconds(volume_bytes: float, mb_per_s: float = INTER_HOST_MB_PER_S) -> float:
    """Paper's dispatch time: GB (2^30 B) * 1024 / (MB/s)."""
    return volume_bytes / 2**30 * 1024 / mb_per_s


def sample_flow(
    g: int,
    n: int,
    prompt_len: int,
    response_len: int,
    n_items: int,
    warehouses: int,
    controllers: int,
) -> SampleFlow:
    """Volumes for a centralized buffer and for a dock with ``warehouses`` endpoints."""
    central = central_volume_bytes(g, n, prompt_len, n_items, response_len)
    return flow_of(central, g * n, warehouses, controllers)


# ---- bytes on each node's link, for a layout ----------------------------------------------


@dataclass(frozen=True)
class CallBytes:
    """Bytes one remote dock call adds to its payload on the wire: Ray's task request and
    reply (ids, function descriptor, argument framing), gRPC, TCP/IP headers and ACKs,
    plus what each field adds (its numpy arrays and name)."""

    request: float
    reply: float
    request_per_field: float = 0.0
    reply_per_field: float = 0.0


#: Measured on a 2-node shaped cluster (``python -m benchmarks.cluster.probe --calls``: 20
#: calls of each kind, 1 and 32 samples x 1 and 3 fields, the dock's traffic class of the
#: links' counters); every case lay within 40 bytes of these plus its payload. Measured
#: again at bf3d57a, a put's request runs 10-70 bytes over and an announcement's reply
#: about 25, so a link that carries mostly framing reads a few percent above the model.
#: An announcement is the metadata a warehouse sends a controller after a put.
CALL_BYTES = {
    "put": CallBytes(request=1296, reply=238, request_per_field=112),
    "fetch": CallBytes(request=950, reply=407, request_per_field=6, reply_per_field=111),
    "announce": CallBytes(request=1352, reply=216),
    "claim": CallBytes(request=1057, reply=462),
    "clear": CallBytes(request=700, reply=251),
}
INDEX_BYTES = 8  # an index, a length: int64 on the wire


@dataclass(frozen=True)
class StageWorkers:
    """One stage as its workers meet the dock: the node and data-parallel part of each
    worker, and which of them put the stage's results (a replica's first rank);
    ``by_warehouse``: each part takes whatever the warehouse on its node stores, and part
    0 what no part sits beside (the group-local advantage stage), not an even split."""

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    nodes: tuple[int, ...]
    parts: tuple[int, ...]
    writers: tuple[bool, ...]
    by_warehouse: bool = False


@dataclass(frozen=True)
class DockLayout:
    """Where the dock's pieces and the run's processes sit: a warehouse on each of
    ``warehouse_nodes`` (contiguous, equal shares of the samples), each stage's controller
    on ``controller_nodes[stage]``, the driver (which puts the prompt fields and claims
    every stage) on ``driver_node``; ``local_claims``: claims split beside each part's
    warehouse (``dock.local_claims``), else by length alone."""

    nodes: int
    warehouse_nodes: tuple[int, ...]
    controller_nodes: dict[str, int]
    driver_node: int = 0
    local_claims: bool = True


@dataclass
class LinkFlow:
    """Bytes one iteration puts on each node's link (up: leaving the node, down:
    entering it), and how many of them are payload (the rest is the calls' framing)."""

    up: list[float]
    down: list[float]
    payload: float = 0.0
    calls: int = 0

    def send(self, src: int, dst: int, payload: float, framing: float) -> None:
        if src == dst:
            return
        self.up[src] += payload + framing
        self.down[dst] += payload + framing
        self.payload += payload

    def as_dict(self) -> dict:
        return asdict(self)


def part_composition(
    part_nodes: list[int],
    shares: list[float],
    warehouse_nodes: tuple[int, ...],
    local_claims: bool = True,
) -> list[list[float]]:
    """Expected samples of each part from each warehouse when a claim is split with each
    part's warehouse preferred (mindrl.dock.controller.balance_by_length): a warehouse's
    samples fill the parts beside it first, and what is left spreads over the parts with
    room. With every part beside one warehouse (or none), or without ``local_claims``, the
    plain split: each part takes every warehouse's share in proportion."""
    total = sum(shares)
    room = [total / len(part_nodes)] * len(part_nodes)
    out = [[0.0] * len(shares) for _ in part_nodes]
    left = list(shares)
    beside = [[p for p, n in enumerate(part_nodes) if n == node] for node in warehouse_nodes]
    beside_warehouses = {
        warehouse_nodes.index(n) if n in warehouse_nodes else -1 for n in part_nodes
    }
    if local_claims and len(beside_warehouses) > 1:
        for w, parts in enumerate(beside):
            for p in parts:
                take = min(room[p], left[w] / len(parts))
                out[p][w] += take
            for p in parts:
                room[p] -= out[p][w]
            left[w] -= sum(out[p][w] for p in parts)
    spare = sum(room)
    for w, amount in enumerate(left):
        for p, space in enumerate(room):
            if spare > 0:
                out[p][w] += amount * space / spare
    return out


def warehouse_composition(
    part_nodes: list[int], shares: list[float], warehouse_nodes: tuple[int, ...]
) -> list[list[float]]:
    """Samples of each part from each warehouse when each part takes what the warehouse
    on its node stores and part 0 the rest (:attr:`StageWorkers.by_warehouse`)."""
    out = [[0.0] * len(shares) for _ in part_nodes]
    for w, node in enumerate(warehouse_nodes):
        part = part_nodes.index(node) if node in part_nodes else 0
        out[part][w] = shares[w]
    return out


def link_flow(
    stages: list[StageWorkers],
    prompt_fields: tuple[str, ...],
    samples: int,
    layout: DockLayout,
    stored_bytes: dict[str, float],
    fetched_bytes: dict[str, float] | None = None,
    prompt_repeat: int = 1,
) -> LinkFlow:
    """The bytes one iteration's sample flow puts on each node's link.

    Args:
        stages: in iteration order, each with its workers (:class:`StageWorkers`).
        prompt_fields: what the driver puts per sample before the first stage.
        samples: G x N.
        layout: where the warehouses, controllers and the driver are.
        stored_bytes: per field, the bytes of one sample as put (unpadded values).
        fetched_bytes: per field, the bytes of one sample as fetched (padded to the
            longest of the request); default ``stored_bytes``.
        prompt_repeat: samples sharing one prompt the driver sends once (its group, N:
            ``DockClient.put``'s ``repeat``).

    Every message between two nodes counts its payload (values, one int64 length per
    sample and field, one int64 index per sample) and its framing (:data:`CALL_BYTES`):
    the driver's prompt puts; each worker's fetch from and put to every warehouse holding
    part of its share; each put's announcement to the controllers tracking its fields;
    the driver's claims and the end-of-iteration clear.
    """
    fetched = fetched_bytes or stored_bytes
    flow = LinkFlow([0.0] * layout.nodes, [0.0] * layout.nodes)
    shares = [samples / len(layout.warehouse_nodes)] * len(layout.warehouse_nodes)
    tracking = {s.name: set(s.reads) for s in stages}

    def call(kind: str, src: int, dst: int, out: float, back: float, fields: int = 0) -> None:
        cost = CALL_BYTES[kind]
        if src != dst:
            flow.calls += 1
        flow.send(src, dst, out, cost.request + cost.request_per_field * fields)
        flow.send(dst, src, back, cost.reply + cost.reply_per_field * fields)

    def put(src: int, w: int, k: float, fields: tuple[str, ...], repeat: int = 1) -> None:
        node, rows = layout.warehouse_nodes[w], k / repeat
        values = sum(stored_bytes[f] * rows for f in fields) + INDEX_BYTES * (
            k + rows * len(fields)
        )
        call("put", src, node, values, 0.0, len(fields))
        for stage, tracked in tracking.items():
            if tracked & set(fields):
                call("announce", node, layout.controller_nodes[stage], 2 * INDEX_BYTES * k, 0.0)

    for w, share in enumerate(shares):
        put(layout.driver_node, w, share, prompt_fields, prompt_repeat)
    for stage in stages:
        controller = layout.controller_nodes[stage.name]
        call("claim", layout.driver_node, controller, 0.0, INDEX_BYTES * samples)
        part_nodes = [stage.nodes[stage.parts.index(p)] for p in sorted(set(stage.parts))]
        if stage.by_warehouse:
            composition = warehouse_composition(part_nodes, shares, layout.warehouse_nodes)
        else:
            composition = part_composition(
                part_nodes, shares, layout.warehouse_nodes, layout.local_claims
            )
        for node, part, writes in zip(stage.nodes, stage.parts, stage.writers, strict=True):
            for w, k in enumerate(composition[part]):
                if k <= 0:
                    continue
                reply = sum(fetched[f] * k for f in stage.reads) + INDEX_BYTES * k * len(
                    stage.reads
                )
                call(
                    "fetch",
                    node,
                    layout.warehouse_nodes[w],
                    INDEX_BYTES * k,
                    reply,
                    len(stage.reads),
                )
                if writes and stage.writes:
                    put(node, w, k, stage.writes)
    for node in [*layout.warehouse_nodes, *layout.controller_nodes.values()]:
        call("clear", layout.driver_node, node, 0.0, 0.0)
    return flow
