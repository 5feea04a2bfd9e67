"""The failed preflight's notice (issue 46): the pod whose preflight init container failed a GPU, and its owner (its
controller, the JobSet of its Job), get a Warning Event ``GPUFault`` (the workload notice's reason) naming the node,
the GPU and what the controller does about it, so the job's owner sees why the pod never started. Nothing is
written in a dry run (as the workload notice)."""

from __future__ import annotations

from gpuremediate.actions.events import WARNING, EventRecorder, ObjectRef
from gpuremediate.actions.workload_notice import REASON
from gpuremediate.signals.workload import Failure
from gpuremediate.vocab.findings import Finding


def tell(events: EventRecorder, failure: Failure, finding: Finding) -> None:
    """Events on the pod and each owner."""
    if events.dry_run:
        return
    namespace, _, name = failure.pod.partition("/")
    what = f"node {failure.node}: {failure.text}. The node is taken out of scheduling ({finding.action})"
    events.object_event(ObjectRef("v1", "Pod", namespace, name, failure.uid), REASON,
                        f"{what}; this pod never started its containers there.", WARNING)
    for api_version, kind, owner, uid in failure.owners:
        events.object_event(ObjectRef(api_version, kind, namespace, owner, uid), REASON,
                            f"its pod {name}'s preflight failed on {what}.", WARNING)
