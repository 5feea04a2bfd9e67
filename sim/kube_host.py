"""What the emulator's parts need of the server that hosts them (``sim.kubeapi.KubeAPIServer`` implements each):
the verbs (``sim.kube_handlers``), the controllers (``sim.kube_controllers``), the node lifecycle
(``sim.kube_nodes``) and the event recorder (``sim.kube_events``) each take the store and one of these narrow
interfaces, never the server, so none of them imports ``sim.kubeapi`` (which imports them all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sim.kube_http import Request
    from sim.kube_resources import ResourceType
    from sim.kube_store import Obj, Store
    from sim.kube_webhooks import Dispatcher


class Types(Protocol):
    """The served resource types, by group and plural."""

    def type_for(self, group: str, resource: str) -> ResourceType: ...


class EventHost(Types, Protocol):
    """What recording an Event needs: the store (its lock), the events type, and the recorder's memory of the
    Events it wrote ((namespace, uid, reason, message, component, host) → the Event's name)."""

    @property
    def store(self) -> Store: ...

    @property
    def recorded_events(self) -> dict[tuple[str, ...], str]: ...


class CrdRegistry(Types, Protocol):
    """Serving the resources a CustomResourceDefinition defines."""

    @property
    def types(self) -> dict[tuple[str, str, str], ResourceType]: ...

    def register_crd(self, crd: Obj) -> None: ...

    def unregister_crd(self, crd: Obj) -> None: ...


class DryRun(Protocol):
    def dry_run(self, req: Request, options_kind: str) -> bool: ...


class VerbsHost(EventHost, CrdRegistry, Protocol):
    """What the REST verbs need beyond the store."""

    @property
    def default_toleration_s(self) -> int: ...

    @property
    def too_large_rv_wait_s(self) -> float: ...

    @property
    def bookmark_interval_s(self) -> float: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def webhooks(self) -> Dispatcher: ...

    def wait_for_cr_storage(self, rt: ResourceType) -> None: ...


class ControllersHost(EventHost, CrdRegistry, Protocol):
    """What the built-in controllers need beyond the store: the CRDs they serve, the pods' default tolerations and
    the verbs' dry-run rule (an eviction's DeleteOptions)."""

    @property
    def default_toleration_s(self) -> int: ...

    @property
    def verbs(self) -> DryRun: ...
