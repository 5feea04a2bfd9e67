"""Pod eviction through the Eviction API (policy/v1), one attempt per call, outcome recorded.

A drain calls this once per pod per reconcile and requeues (Cluster API's shape): a PDB refusal is
an outcome with the blocking PDB named, not an exception and not a blocking wait.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuremediate.actions.pods import Pod, pod_key
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient

EVICTED = "evicted"
BLOCKED = "blocked"  # a PodDisruptionBudget refused (429)
GONE = "gone"  # the pod no longer exists
FAILED = "failed"  # any other API error (e.g. 500 for a pod covered by two PDBs)

_PDB_NAME = re.compile(r"disruption budget (\S+)")


@dataclass(frozen=True)
class EvictionOutcome:
    namespace: str
    name: str
    result: str
    pdb: str = ""
    message: str = ""
    retry_after: float | None = None


def blocking_pdb(err: errors.ApiError) -> str:
    """The PDB named in a 429 eviction refusal (details.causes[].message), or ""."""
    for cause in (err.details or {}).get("causes") or []:
        match = _PDB_NAME.search(str(cause.get("message", "")))
        if match:
            return match.group(1)
    return ""


def evict(
    client: KubeClient, pod: Pod, *, dry_run: bool = False, grace_period_seconds: int | None = None
) -> EvictionOutcome:
    """Ask the API server to evict ``pod``. With ``dry_run`` the server checks PDBs and changes nothing."""
    namespace, name = pod_key(pod)
    try:
        client.evict(name, namespace, grace_period_seconds=grace_period_seconds, dry_run=dry_run)
    except errors.NotFound:
        return EvictionOutcome(namespace, name, GONE)
    except errors.TooManyRequests as err:
        return EvictionOutcome(namespace, name, BLOCKED, blocking_pdb(err), err.message, err.retry_after)
    except errors.ApiError as err:
        return EvictionOutcome(namespace, name, FAILED, message=f"{err.code} {err.reason}: {err.message}")
    return EvictionOutcome(namespace, name, EVICTED)
