"""The NVLink fabric reading of one GPU (its parsers and NVIDIA's names: ``signals.fabric``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuFabric:
    """What one GPU says about its NVLink fabric; every field None when not reported."""

    state: str | None = None  # STATE_*
    status: str | None = None  # "Success", "Failure" (DCGM) or the driver's error words; only when completed
    cluster_uuid: str | None = None  # lower case; None for the all-zero UUID of a GPU in no domain
    clique_id: int | None = None
    imex_daemon: int | None = None  # DCGM_FI_IMEX_DAEMON_STATUS
    imex_domain: str | None = None  # DCGM_FI_IMEX_DOMAIN_STATUS

    @property
    def clique(self) -> str | None:
        """``<ClusterUUID>.<CliqueId>``, as GPU Feature Discovery's label writes it; None outside a domain."""
        if self.cluster_uuid is None or self.clique_id is None:
            return None
        return f"{self.cluster_uuid}.{self.clique_id}"

    @property
    def reported(self) -> bool:
        return any(v is not None for v in (self.state, self.cluster_uuid, self.clique_id, self.imex_daemon,
                                           self.imex_domain))
