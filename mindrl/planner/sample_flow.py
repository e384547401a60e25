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
    metadata = float(g * n * controllers * METADATA_SCALARS * SCALAR_BYTES)
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
