"""What the test process made on an API server that outlives a scenario (the ``apiserver`` target), so that the
harness removes exactly that instead of guessing by name.

Every client the harness and the simulated cluster use there (``c.kube``, NodeSim's, the busy writer's, the
simulated GPU Operator's and agents') is a ``Ledger.client_class()``: each object it creates is noted (group,
version, resource, namespace, name, uid), in memory and in a file, one JSON line each, so a run that was killed
before its scenario ended leaves a ledger the next start reads. What the controller makes is not noted here (it is
another process): the harness sweeps it by its labels (e2e.harness.clean_world).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import Resource

LEDGER_ENV = "GPUREMEDIATE_E2E_LEDGER"  # a file of one's choosing; default: one per server in the temp folder


@dataclass(frozen=True)
class Made:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    namespace: str
    name: str
    uid: str

    @property
    def resource(self) -> Resource:
        return Resource(self.group, self.version, self.plural, self.kind, self.namespaced)

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._made: list[Made] = []
        if path.exists():  # what an earlier run made and did not remove (killed before its scenario ended)
            for line in path.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(ValueError, TypeError):
                    self._made.append(Made(**json.loads(line)))

    def note(self, res: Resource, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        made = Made(res.group, res.version, res.plural, res.kind, res.namespaced,
                    str(meta.get("namespace") or "") if res.namespaced else "", str(meta.get("name") or ""),
                    str(meta.get("uid") or ""))
        with self._lock:
            self._made.append(made)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as out:
                out.write(json.dumps(asdict(made)) + "\n")

    def made(self) -> list[Made]:
        """Everything noted and not forgotten yet, oldest first."""
        with self._lock:
            return list(self._made)

    def forget(self, gone: Iterable[Made]) -> None:
        """``gone`` was removed from the server: the ledger (and its file) keeps the rest."""
        drop = set(gone)
        with self._lock:
            self._made = [m for m in self._made if m not in drop]
            if self._made:
                self.path.write_text("".join(json.dumps(asdict(m)) + "\n" for m in self._made), encoding="utf-8")
            else:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()

    def client_class(self) -> type[KubeClient]:
        """A KubeClient whose successful creates (not dry runs) this ledger notes."""
        note = self.note

        class RecordingClient(KubeClient):
            def create(self, res: Resource, body: dict[str, Any], namespace: str | None = None, *,
                       dry_run: bool = False) -> dict[str, Any]:
                made = super().create(res, body, namespace, dry_run=dry_run)
                if not dry_run:
                    note(res, made)
                return made

        return RecordingClient


def ledger_path(server: str) -> Path:
    """The ledger file of the API server at ``server`` (``GPUREMEDIATE_E2E_LEDGER`` if set)."""
    chosen = os.environ.get(LEDGER_ENV)
    if chosen:
        return Path(chosen)
    digest = hashlib.sha256(server.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "gpuremediate-e2e" / f"{digest}.jsonl"


Keep = Callable[[Made], bool]
