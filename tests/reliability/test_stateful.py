"""The controller's loops against the emulator, under random GPU faults, workloads and PDBs, API
errors, controller kills and a person cordoning, uncordoning and releasing nodes.

Each example starts a fresh SimCluster (4 nodes, 2 GPUs each) and a controller in-process with
short intervals and leader election (its Lease renewals are stalled at times), then runs random
steps. The invariants (see ``harness``) are checked after every single node/Job change and eviction
by a checker thread (every 50 ms) and after every step.

More exploration locally: ``RELIABILITY_EXAMPLES=60 RELIABILITY_SHRINK=1 pytest tests/reliability``.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from gpuremediate import fleet
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import NODES, PDBS
from sim.cluster import SimCluster, node_name

from .harness import (
    PERSON_TOKEN,
    PERSON_USER,
    RENEW_DEADLINE_S,
    Checker,
    Controllers,
    Recorder,
    reliability_policy,
    reliability_settings,
)

NODES_IN_CLUSTER = 4
GPUS_PER_NODE = 2
NODE_NAMES = [node_name(i) for i in range(1, NODES_IN_CLUSTER + 1)]

# Violation codes of controller bugs already reported and not fixed yet, with the reason; an example
# that finds only these ends as xfail (a focused regression test in test_regressions.py pins each one).
# Empty: the two the test found (a timed-out Job re-created after its own delete; a person's cordon
# on a quarantined node removed after release) are fixed and pinned by test_regressions.py.
KNOWN_BUGS: dict[str, str] = {}

KNOWN_HITS: dict[str, str] = {}  # code -> first violation text, this run

GPU_FAULTS = [
    ("xid", 79.0),  # reboot
    ("xid", 48.0),  # reset-gpu
    ("xid", 13.0),  # none: a notice only
    ("xid", 94.0),  # none: a notice only
    ("dbe", 1.0),  # reset-gpu
    ("row-remap-failure", None),  # quarantine
    ("row-remap-pending", None),  # reset-gpu
    ("temp", 95.0),  # thermal cordon after the hold time
    ("temp", 40.0),  # cool again: the cordon clears after the clear hold time
]
DRAINING_FAULTS = [("xid", 79.0), ("xid", 48.0), ("dbe", 1.0), ("row-remap-pending", None)]

# (method, path regex, action, status, retry_after)
API_FAULTS = [
    ("PATCH", r"^/api/v1/nodes/", "status", 409, None),
    ("PATCH", r"^/api/v1/nodes/", "status", 500, None),
    ("PATCH", r"^/api/v1/nodes/", "reset", 500, None),
    ("POST", r"/eviction", "status", 500, None),
    ("POST", r"/eviction", "status", 429, 1),
    ("POST", r"/eviction", "reset", 500, None),
    ("POST", r"/jobs", "status", 500, None),
    ("POST", r"/jobs", "reset", 500, None),
    ("GET", r"/jobs/", "status", 500, None),
    ("GET", r"/jobs/", "status", 429, 1),
    ("DELETE", r"/jobs/", "status", 500, None),
    ("GET", r"^/api/v1/pods\?", "status", 500, None),
    ("GET", r"^/api/v1/nodes\?.*watch", "cut-watch", 500, None),
    ("*", r"^/api/v1/nodes", "delay", 500, None),
    ("GET", r"/configmaps/", "status", 500, None),
    ("POST", r"/events", "status", 500, None),
]

STEP_PAUSE_S = 0.15


def _examples() -> int:
    return int(os.environ.get("RELIABILITY_EXAMPLES", "8"))


def _phases() -> list[Phase]:
    if os.environ.get("RELIABILITY_SHRINK"):
        return [Phase.explicit, Phase.generate, Phase.shrink]
    return [Phase.explicit, Phase.generate]  # a failing run is printed step by step; shrinking re-runs it


def traced(method: Any) -> Any:
    """Keep the steps of an example (printed with RELIABILITY_VERBOSE=1 and in a failure's report)."""
    def step(self: ControllerUnderFire, **kwargs: Any) -> None:
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        self.trace.append(f"{method.__name__}({args})")
        method(self, **kwargs)

    step.__name__ = method.__name__
    step.__doc__ = method.__doc__
    return step


nodes = st.sampled_from(NODE_NAMES)
gpus = st.integers(min_value=0, max_value=GPUS_PER_NODE - 1)


class ControllerUnderFire(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cluster: SimCluster | None = None
        self.recorder: Recorder | None = None
        self.checker: Checker | None = None
        self.controllers: Controllers | None = None
        self.person_client: KubeClient | None = None
        self.pods = 0
        self.pdbs: list[str] = []
        self.steps = 0
        self.trace: list[str] = []

    # ---- setup and teardown -------------------------------------------------------------------

    @initialize(
        limit=st.sampled_from([1, 2]),
        first_faults=st.lists(st.tuples(nodes, gpus, st.sampled_from(DRAINING_FAULTS)), min_size=1, max_size=3),
    )
    def start(self, limit: int, first_faults: list[tuple[str, int, tuple[str, float | None]]]) -> None:
        """The cluster, a GPU pod on every node, the controller, and a first fault or three (so that even
        the simplest example has flows to disturb)."""
        cluster = self.cluster = SimCluster(nodes=NODES_IN_CLUSTER, gpus=GPUS_PER_NODE, job_duration_s=0.2,
                                            reboot_down_s=0.3)
        self.recorder = Recorder(cluster.api).install()
        cluster.start()
        cluster.api.add_token(PERSON_TOKEN, PERSON_USER)
        path = cluster.api.write_kubeconfig(cluster.kubeconfig + "-person", token=PERSON_TOKEN)
        self.person_client = KubeClient(load_config(path), qps=500, burst=1000, timeout=10.0)
        self.checker = Checker(self.recorder, limit, [], renew_deadline=RENEW_DEADLINE_S).start()
        for node in NODE_NAMES:  # every drain has something to evict
            cluster.workload(f"base-{node}", node, gpus=1)
        self.controllers = Controllers(cluster, reliability_policy(limit),
                                       reliability_settings(cluster, leader_elect=True))
        self.controllers.start()
        for node, gpu, (fault, value) in first_faults:
            cluster.gpusim.inject(node, gpu, fault, value)
        self.trace.append(f"start(limit={limit}, first_faults={first_faults})")

    def teardown(self) -> None:
        try:
            if self.checker is not None:
                time.sleep(0.3)  # let the last step's effects land
                self.checker.stop()
                if os.environ.get("RELIABILITY_VERBOSE"):
                    print(self._summary())
                self._assert_no_violations()
        finally:
            if self.controllers is not None:
                self.controllers.close()
            if self.person_client is not None:
                self.person_client.close()
            if self.cluster is not None:
                self.cluster.stop()

    def _summary(self) -> str:
        assert self.recorder is not None and self.checker is not None and self.controllers is not None
        rec = self.recorder
        states_seen = sorted({str((c.obj["metadata"].get("labels") or {}).get("gpuremediate.io/state", "-"))
                              for c in rec.node_changes})
        return (f"example: {'; '.join(self.trace)}\n  {self.steps} steps, {self.checker.changes_seen} node changes, "
                f"{len(rec.jobs)} Jobs, "
                f"{len(rec.evictions)} evictions, {self.controllers.generation} controller(s), states {states_seen}")

    @property
    def sim(self) -> SimCluster:
        assert self.cluster is not None
        return self.cluster

    # ---- the world: GPUs, workloads, Jobs ---------------------------------------------------------

    @rule(node=nodes, gpu=gpus, fault=st.sampled_from(GPU_FAULTS))
    @traced
    def gpu_fault(self, node: str, gpu: int, fault: tuple[str, float | None]) -> None:
        self.sim.gpusim.inject(node, gpu, fault[0], fault[1])
        time.sleep(STEP_PAUSE_S)

    @rule(node=nodes, gpu=gpus, fault=st.sampled_from(DRAINING_FAULTS))
    @traced
    def repairable_fault(self, node: str, gpu: int, fault: tuple[str, float | None]) -> None:
        """A fault that takes the node through drain and repair (the busiest path)."""
        self.sim.gpusim.inject(node, gpu, fault[0], fault[1])
        time.sleep(STEP_PAUSE_S)

    @rule(node=nodes, gpu_request=st.sampled_from([0, 1]), pdb=st.sampled_from(["none", "blocking", "remove-all"]))
    @traced
    def workload(self, node: str, gpu_request: int, pdb: str) -> None:
        """A pod on the node; with a PDB that refuses every eviction of it; or the PDBs removed."""
        if pdb == "remove-all":
            self._remove_pdbs()
            return
        self.pods += 1
        name = f"w{self.pods}"
        with contextlib.suppress(errors.ApiError, errors.TransportError):
            self.sim.workload(name, node, gpus=gpu_request)
            if pdb == "blocking":  # the only pod it selects must stay: its evictions are refused
                self.sim.pdb(f"pdb-{name}", {"app": name}, min_available=1)
                self.pdbs.append(f"pdb-{name}")
        time.sleep(STEP_PAUSE_S)

    def _remove_pdbs(self) -> None:
        for name in self.pdbs:
            with contextlib.suppress(errors.ApiError, errors.TransportError):
                self.sim.kube.delete(PDBS, name, "workloads")
        self.pdbs = []
        time.sleep(STEP_PAUSE_S)

    @rule(node=nodes, succeed=st.booleans(), duration=st.sampled_from([0.2, 3.0]), validation_ok=st.booleans())
    @traced
    def job_behaviour(self, node: str, succeed: bool, duration: float, validation_ok: bool) -> None:
        """Repair Jobs that fail or outlast their 2 s timeout; validations that fail."""
        assert self.sim.nodesim is not None
        self.sim.nodesim.set_job_outcome(node, succeed=succeed, duration_s=duration)
        self.sim.set_validation(node, validation_ok)
        time.sleep(STEP_PAUSE_S)

    # ---- the API server misbehaves -----------------------------------------------------------------

    @rule(fault=st.sampled_from(API_FAULTS), count=st.integers(min_value=1, max_value=3))
    @traced
    def api_fault(self, fault: tuple[str, str, str, int, int | None], count: int) -> None:
        method, path, action, status, retry_after = fault
        self.sim.api.inject(method, path, count=count, status=status, retry_after=retry_after, action=action,
                            delay_s=0.4)
        time.sleep(STEP_PAUSE_S)

    # ---- the controller dies -------------------------------------------------------------------------

    @rule(graceful=st.booleans())
    @traced
    def restart_controller(self, graceful: bool) -> None:
        assert self.controllers is not None
        self.controllers.kill(graceful=graceful)
        self.controllers.start()

    @rule(seconds=st.sampled_from([1.0, RENEW_DEADLINE_S + 1.0]))
    @traced
    def stall_leader(self, seconds: float) -> None:
        """The controller's Lease renewals hang (a paused process, a GC pause) while its loops run on:
        past the renew deadline none of its writes may reach the server."""
        assert self.controllers is not None
        client = self.controllers.client
        if client is None:
            return
        client.stall()
        time.sleep(seconds)
        client.resume()

    # ---- a person --------------------------------------------------------------------------------------

    @rule(node=nodes, action=st.sampled_from(["cordon", "uncordon", "release"]))
    @traced
    def person(self, node: str, action: str) -> None:
        """kubectl cordon / uncordon (only when it flips the node, guarded by its resourceVersion), or
        ``gpuremediate release``."""
        assert self.person_client is not None
        with contextlib.suppress(fleet.FleetError, errors.ApiError, errors.TransportError):
            if action == "release":
                fleet.release(self.person_client, node, by=PERSON_USER)
            else:
                self._person_sets_unschedulable(node, action == "cordon")
        time.sleep(STEP_PAUSE_S)

    def _person_sets_unschedulable(self, node: str, value: bool) -> None:
        assert self.person_client is not None
        obj: dict[str, Any] = self.person_client.get(NODES, node)
        if bool((obj.get("spec") or {}).get("unschedulable")) == value:
            return
        patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "spec": {"unschedulable": value}}
        self.person_client.patch(NODES, node, patch)

    # ---- time passes -------------------------------------------------------------------------------------

    @rule(seconds=st.sampled_from([0.3, 0.8, 1.5]))
    @traced
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    # ---- invariants ----------------------------------------------------------------------------------------

    @invariant()
    def invariants_hold(self) -> None:
        self.steps += 1
        if self.checker is None:
            return
        assert self.checker.running, "the invariant checker thread died"
        self.checker.process()
        self._assert_no_violations()

    def _assert_no_violations(self) -> None:
        assert self.checker is not None and self.recorder is not None
        found = self.checker.violations
        if not found:
            return
        unknown = [v for v in found if v.code not in KNOWN_BUGS]
        if unknown:
            raise AssertionError(f"invariant violated\nsteps: {'; '.join(self.trace)}\n"
                                 f"{self.checker.report(self.recorder)}")
        for violation in found:  # a known bug: noted, and every other invariant is still checked
            KNOWN_HITS.setdefault(violation.code, violation.text)


def test_controller_under_fire() -> None:
    KNOWN_HITS.clear()
    run_state_machine_as_test(ControllerUnderFire, settings=RELIABILITY_SETTINGS)
    if KNOWN_HITS:
        pytest.xfail("only known bugs found: " + "; ".join(f"{KNOWN_BUGS[code]} — e.g. {text}"
                                                            for code, text in KNOWN_HITS.items()))


RELIABILITY_SETTINGS = settings(
    max_examples=_examples(),
    stateful_step_count=25,
    deadline=None,
    database=None,
    phases=_phases(),
    suppress_health_check=[HealthCheck.too_slow],
)
