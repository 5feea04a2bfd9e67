"""A Kubernetes API server emulator (kube-apiserver v1.28 semantics) on a real threaded HTTP(S) server.

Serves discovery, the built-in resources a GPU-remediation controller touches, CRDs and their custom
resources (structural schema, defaults, pruning and CEL rules: sim.kube_schema, sim.kube_cel), watches
(chunked, bookmarks, 410 on a too-old resourceVersion), four patch types, eviction with
PodDisruptionBudgets, bearer-token auth with optional per-user RBAC, and fault injection. Admission as
the default plugins do it: ServiceAccount, DefaultTolerationSeconds, TaintNodesByCondition. It also runs
the controllers kube-controller-manager would: Job -> pods (FailedCreate, SuccessCriteriaMet), owner-
reference GC (absent owners too), PDB status, ServiceAccounts, node lifecycle (sim.kube_nodes), device-taint
eviction (sim.kube_dra_eviction). resource.k8s.io (DRA) is served as v1.36.2 with DRADeviceTaintRules and
resource.k8s.io/v1beta2 on serves it (sim.kube_dra; ``dra=``, ``device_taint_rule_versions=``); how that differs
from the real server is listed in sim.kube_dra, sim.kube_dra_eviction and docs/dra.md.

Behaviour follows v1.28 (shared/data/kube-apiserver) where v1.36 (shared/data/kube-apiserver-1.36) does
not differ, and v1.36 where it does (Job conditions, CEL message text, the mux's plain-text 404).
Tables (``kubectl get``'s columns) and PartialObjectMetadata for get and list: sim.kube_tables.
Mutating admission webhooks are called on create (sim.kube_webhooks; ``webhooks.routes`` says where a Service
listens). Not implemented: protobuf answers; validating admission webhooks; CEL beyond the subset in
sim.kube_cel.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import secrets
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim import kube_errors as errs
from sim.kube_controllers import Controllers
from sim.kube_dra_eviction import STATUS_PERIOD_S
from sim.kube_handlers import Target, Verbs
from sim.kube_http import HANG_UPS, Handler, Request, Server
from sim.kube_nodes import DEFAULT_GRACE_S
from sim.kube_resources import ResourceType, builtin_types, dra_types, from_crd
from sim.kube_store import Obj, Store
from sim.kube_webhooks import Dispatcher

VERSION_INFO = {"major": "1", "minor": "28", "gitVersion": "v1.28.7-sim", "gitTreeState": "clean",
                "goVersion": "go1.21.7", "compiler": "gc", "platform": "linux/amd64"}
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
AuditRecord = tuple[str, str, str, str, str, "str | None", "str | None"]


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    count: int
    status: int
    retry_after: int | None
    action: str
    delay_s: float


class KubeAPIServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, tls: bool = False, watch_history: int = 1000,
                 bookmark_interval_s: float = 60.0, anonymous: bool = False, *,
                 node_monitor_grace_s: float = DEFAULT_GRACE_S, default_toleration_s: int = 300,
                 first_cr_create_delay_s: float = 0.0, dra: bool = True,
                 device_taint_rule_versions: tuple[str, ...] = ("v1beta2",),
                 device_taint_status_period_s: float = STATUS_PERIOD_S) -> None:
        """``node_monitor_grace_s``: how long a Node's Lease may go unrenewed before it is Unknown;
        ``default_toleration_s``: how long pods tolerate not-ready / unreachable (then they are evicted);
        ``first_cr_create_delay_s``: how long after its CRD a custom resource's first create is held;
        ``dra``: serve resource.k8s.io (ResourceSlice, ResourceClaim, DeviceClass at v1 and v1beta2, as v1.36 with
        ``--runtime-config=resource.k8s.io/v1beta2=true``); ``device_taint_rule_versions``: where DeviceTaintRule
        is served: ("v1beta2",) as v1.36 with ``--feature-gates=DRADeviceTaintRules=true``, () as a cluster
        without that gate or a 1.35 one (404, not in discovery), ("v1", "v1beta2") as 1.37;
        ``device_taint_status_period_s``: how often at most the eviction controller rewrites a DeviceTaintRule's
        EvictionInProgress condition (upstream: 10 s)."""
        self.host, self.port, self.tls = host, port, tls
        self.store = Store(history=watch_history)
        self.bookmark_interval_s = bookmark_interval_s
        self.too_large_rv_wait_s = 3.0
        self.anonymous = anonymous
        self.admin_token = secrets.token_hex(16)
        self.tokens: dict[str, tuple[str, tuple[str, ...]]] = {
            self.admin_token: ("kubernetes-admin", ("system:masters", "system:authenticated"))}
        self.rbac: dict[str, list[dict[str, Any]]] = {}
        self.rbac_namespaced: dict[str, dict[str, list[dict[str, Any]]]] = {}
        self.faults: list[Fault] = []
        self.requests: list[AuditRecord] = []
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.stopping = False
        self.ca_file: str | None = None
        # A real server's first create of a custom resource right after its CRD is Established takes ~2 s
        # (captures 36): with a delay set, creates wait until that long after the CRD was registered.
        self.first_cr_create_delay_s = first_cr_create_delay_s
        self.default_toleration_s = default_toleration_s  # DefaultTolerationSeconds: not-ready/unreachable
        # The emulated components' event recorder: (namespace, uid, reason, message, component, host) ->
        # the Event's name, so a repeat bumps its count without scanning every Event (sim.kube_events).
        self.recorded_events: dict[tuple[str, ...], str] = {}
        self._cr_storage_ready: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._httpd: Server | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        for rt in builtin_types() + (dra_types(taint_rule_versions=device_taint_rule_versions) if dra else []):
            self.types[(rt.group, rt.version, rt.resource)] = rt
        self.webhooks = Dispatcher()
        self.verbs = Verbs(self.store, self)
        self.controllers = Controllers(self.store, self)
        self.controllers.nodes.grace_s = node_monitor_grace_s
        self.controllers.device_taints.status_period_s = device_taint_status_period_s
        for ns in SYSTEM_NAMESPACES:
            self.store.create(self.type_for("", "namespaces"),
                              {"metadata": {"name": ns}, "spec": {"finalizers": ["kubernetes"]},
                               "status": {"phase": "Active"}}, "")

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> KubeAPIServer:
        handler = type("BoundHandler", (Handler,), {"api": self})
        self._httpd = Server((self.host, self.port), handler)
        if self.tls:
            self._wrap_tls(self._httpd)
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="kubeapi", daemon=True).start()
        self.controllers.start()
        return self

    def stop(self) -> None:
        self.stopping = True
        self.controllers.stop()
        with self.store.changed:
            self.store.changed.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _wrap_tls(self, httpd: Server) -> None:
        openssl = shutil.which("openssl")
        if openssl is None:
            raise RuntimeError("tls=True needs the openssl command to make a self-signed certificate")
        self._tmp = tempfile.TemporaryDirectory(prefix="kubeapi-tls-")
        cert, key = Path(self._tmp.name) / "tls.crt", Path(self._tmp.name) / "tls.key"
        subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={self.host}",
                        "-addext", f"subjectAltName=IP:{self.host}"], check=True, capture_output=True)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        # The handshake runs in the connection's thread (on its first read), not in accept(): a client that connects
        # and never speaks TLS holds up only itself, and its failure is a hang-up (one debug line), not the server's.
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.ca_file = str(cert)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    # --- identities, RBAC, faults --------------------------------------------------------------------
    def add_token(self, token: str, user: str, groups: tuple[str, ...] | list[str] = ()) -> None:
        self.tokens[token] = (user, tuple(groups))

    def enforce_rbac(self, user: str, rules: list[dict[str, Any]],
                     namespaced: dict[str, list[dict[str, Any]]] | None = None) -> None:
        """``rules``: a ClusterRole's rules (everywhere); ``namespaced``: namespace -> a Role's rules,
        which allow requests inside that namespace only (never cluster-scoped or all-namespace ones)."""
        self.rbac[user] = rules
        self.rbac_namespaced[user] = dict(namespaced or {})

    def inject(self, method: str = "GET", path: str = r".*", count: int = 1, status: int = 500,
               retry_after: int | None = None, action: str = "status", delay_s: float = 0.2) -> None:
        if action not in ("status", "reset", "delay", "cut-watch"):
            raise ValueError(f"unknown fault action {action!r}: use status, reset, delay or cut-watch")
        with self._lock:
            self.faults.append(Fault(method.upper(), re.compile(path), count, status, retry_after, action, delay_s))

    def write_kubeconfig(self, path: str | Path, token: str | None = None, embed_ca: bool = False) -> str:
        """A kubeconfig for this server (the admin token unless ``token``); with TLS it names the CA file, or
        with ``embed_ca`` carries it as certificate-authority-data (kubectl, other machines' tools)."""
        ca = f"\n    certificate-authority: {self.ca_file}" if self.ca_file else ""
        if self.ca_file and embed_ca:
            ca = "\n    certificate-authority-data: " + base64.b64encode(Path(self.ca_file).read_bytes()).decode()
        text = (f"apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {self.url}{ca}\n"
                f"users:\n- name: sim-user\n  user:\n    token: {token or self.admin_token}\n"
                "contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim-user\n"
                "current-context: sim\n")
        Path(path).write_text(text, encoding="utf-8")
        return str(path)

    # --- types -------------------------------------------------------------------------------------
    def type_for(self, group: str, resource: str) -> ResourceType:
        for (g, _, r), rt in self.types.items():
            if g == group and r == resource:
                return rt
        raise KeyError(f"{resource}.{group}")

    def register_crd(self, crd: Obj) -> None:
        for rt in from_crd(crd):
            self.types[(rt.group, rt.version, rt.resource)] = rt
            self._cr_storage_ready.setdefault((rt.group, rt.resource),
                                              time.monotonic() + self.first_cr_create_delay_s)

    def wait_for_cr_storage(self, rt: ResourceType) -> None:
        """Hold a custom resource create until the (injected) storage start-up delay has passed."""
        ready = self._cr_storage_ready.get((rt.group, rt.resource), 0.0)
        remaining = ready - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)

    def unregister_crd(self, crd: Obj) -> None:
        spec = crd["spec"]
        self._cr_storage_ready.pop((spec["group"], spec["names"]["plural"]), None)
        for key in [k for k in self.types if k[0] == spec["group"] and k[2] == spec["names"]["plural"]]:
            del self.types[key]

    # --- request handling --------------------------------------------------------------------------
    def handle(self, h: Handler, req: Request) -> None:
        fault = self._take_fault(req)
        if fault is not None and fault.action in ("status", "reset"):
            self._fail(h, fault)
            return
        if fault is not None and fault.action == "delay":
            time.sleep(fault.delay_s)
        try:
            self._authenticate(req)
            self._route(h, req, cut_after=fault.delay_s if fault is not None and fault.action == "cut-watch"
                        else None)
        except errs.ApiError as err:
            h.send_error_status(err)
        except HANG_UPS:
            raise  # the client went away (Handler._dispatch says so in one debug line): nobody to answer
        except Exception as exc:  # a bug in the emulator must still answer like a server would
            h.send_error_status(errs.internal(f"Internal error occurred: {type(exc).__name__}: {exc}"))

    def _take_fault(self, req: Request) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.count > 0 and fault.method in (req.method, "*") and fault.path.search(req.raw_path):
                    fault.count -= 1
                    return fault
        return None

    def _fail(self, h: Handler, fault: Fault) -> None:
        if fault.action == "reset":
            h.reset()
            return
        reason = errs.REASONS.get(fault.status, "InternalError")
        details: dict[str, Any] = {"retryAfterSeconds": fault.retry_after} if fault.retry_after else {}
        message = "Internal error occurred: injected fault" if fault.status >= 500 else "injected fault"
        body = errs.status(fault.status, message, reason, details)
        headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
        h.send_json(fault.status, body, headers)

    def _authenticate(self, req: Request) -> None:
        auth = req.headers.get("authorization", "")
        if auth.startswith("Bearer ") and auth[7:].strip() in self.tokens:
            req.user, req.groups = self.tokens[auth[7:].strip()]
            return
        if not auth and self.anonymous:
            req.user, req.groups = "system:anonymous", ("system:unauthenticated",)
            return
        if req.path in ("/version", "/healthz", "/livez", "/readyz") and not auth:
            req.user = "system:anonymous"
            return
        raise errs.unauthorized()

    def _route(self, h: Handler, req: Request, cut_after: float | None) -> None:
        parts = [p for p in req.path.split("/") if p]
        if not parts or parts[0] not in ("api", "apis"):
            self._non_resource(h, req)
            return
        group: str | None = ""
        rest = parts[1:]
        if parts[0] == "apis":
            group, rest = (parts[1] if len(parts) > 1 else None), parts[2:]
        if group is None or not rest:
            self._audit(req, "get", "", "", "", None, req.path)
            h.send_json(200, self._discovery_root(parts[0], group))
            return
        version, rest = rest[0], rest[1:]
        if not rest:
            self._audit(req, "get", "", "", "", None, req.path)
            h.send_json(200, self._resource_list(group, version))
            return
        self._resource_request(h, req, self._target(group, version, rest), cut_after)

    def _target(self, group: str, version: str, rest: list[str]) -> Target:
        namespace = ""
        if rest[0] == "namespaces" and len(rest) >= 3 and (group, version, rest[2]) in self.types:
            namespace, rest = rest[1], rest[2:]
        if not any(g == group and v == version for (g, v, _) in list(self.types)):
            raise errs.page_not_found()
        rt = self.types.get((group, version, rest[0]))
        if rt is None or len(rest) > 3 or (len(rest) == 3 and rest[2] not in rt.subresources):
            raise errs.unknown_resource()
        if rt.namespaced != bool(namespace) and len(rest) > 1 and rt.namespaced:
            raise errs.unknown_resource()
        return Target(rt, namespace, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else "")

    def _resource_request(self, h: Handler, req: Request, t: Target, cut_after: float | None) -> None:
        verb = _verb(req, t)
        named = t.name or (_selected_name(req) if verb in ("list", "watch") else "")
        self._audit(req, verb, t.rt.group, t.rt.resource, t.subresource, t.namespace or None, named or None)
        self._authorize(req, verb, t)
        if t.subresource == "eviction":
            if verb != "create":
                raise errs.ApiError(405, errs.status(405, "the server does not allow this method on the "
                                                     "requested resource", "MethodNotAllowed", {}))
            self.controllers.evict(h, req, t)
            return
        handler = {"get": self.verbs.get, "list": self.verbs.list_, "create": self.verbs.create,
                   "update": self.verbs.update, "patch": self.verbs.patch, "delete": self.verbs.delete,
                   "deletecollection": self.verbs.delete_collection}.get(verb)
        if verb == "watch":
            self.verbs.watch(h, req, t, cut_after)
        elif handler is not None:
            handler(h, req, t)

    def _audit(self, req: Request, verb: str, group: str, resource: str, sub: str, ns: str | None,
               name: str | None) -> None:
        with self._lock:
            self.requests.append((req.user, verb, group, resource, sub, ns, name))

    def _authorize(self, req: Request, verb: str, t: Target) -> None:
        if "system:masters" in req.groups:
            return
        rules = self.rbac.get(req.user)
        if rules is None and req.user != "system:anonymous":
            return
        resource = f"{t.rt.resource}/{t.subresource}" if t.subresource else t.rt.resource
        scoped = self.rbac_namespaced.get(req.user, {}).get(t.namespace, []) if t.namespace else []
        name = t.name or (_selected_name(req) if verb in ("list", "watch") else "")
        if not any(_rule_allows(rule, verb, t.rt.group, resource, name) for rule in [*(rules or []), *scoped]):
            raise errs.forbidden(req.user, verb, resource, t.rt.group, t.namespace or None, t.name or None)

    # --- non-resource and discovery ----------------------------------------------------------------
    def _non_resource(self, h: Handler, req: Request) -> None:
        self._audit(req, "get", "", "", "", None, req.path)
        if req.path == "/version":
            h.send_bytes(200, _pretty(VERSION_INFO))
        elif req.path in ("/healthz", "/livez", "/readyz"):
            h.send_bytes(200, b"ok", {"Content-Type": "text/plain; charset=utf-8"})
        else:
            raise errs.page_not_found()

    def _discovery_root(self, prefix: str, group: str | None) -> dict[str, Any]:
        if prefix == "api":
            address = {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [address]}
        groups = self._groups()
        if group is None:
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": list(groups.values())}
        if group not in groups:
            raise errs.page_not_found()
        return {"kind": "APIGroup", "apiVersion": "v1", **groups[group]}

    def _groups(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for (group, version, _) in list(self.types):
            if not group:
                continue
            entry = out.setdefault(group, {"name": group, "versions": []})
            gv = {"groupVersion": f"{group}/{version}", "version": version}
            if gv not in entry["versions"]:
                entry["versions"].append(gv)
            entry["preferredVersion"] = entry["versions"][0]
        return out

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        resources = [e for (g, v, _), rt in list(self.types.items()) if g == group and v == version
                     for e in rt.discovery()]
        if not resources:
            raise errs.page_not_found()
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _verb(req: Request, t: Target) -> str:
    if req.method == "GET":
        if t.name:
            return "get"
        return "watch" if req.flag("watch") else "list"
    if req.method == "DELETE":
        return "delete" if t.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(req.method, req.method.lower())


def _selected_name(req: Request) -> str:
    """kube-apiserver's RequestInfo: a list/watch with fieldSelector metadata.name=X is authorized as for X."""
    for term in (req.query.get("fieldSelector") or "").split(","):
        key, sep, value = term.partition("=")
        if sep and key.strip() == "metadata.name":  # "=" or "=="; "!=" leaves "metadata.name!" as the key
            return value.removeprefix("=").strip()
    return ""


def _rule_allows(rule: dict[str, Any], verb: str, group: str, resource: str, name: str) -> bool:
    def has(values: Any, item: str) -> bool:
        return "*" in (values or []) or item in (values or [])
    names = rule.get("resourceNames") or []
    return has(rule.get("apiGroups"), group) and has(rule.get("resources"), resource) \
        and has(rule.get("verbs"), verb) and (not names or name in names)


def _pretty(obj: Any) -> bytes:
    return json.dumps(obj, indent=2).encode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Kubernetes API server emulator")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tls", action="store_true")
    parser.add_argument("--kubeconfig-out", default=None)
    args = parser.parse_args(argv)
    srv = KubeAPIServer(host=args.host, port=args.port, tls=args.tls).start()
    if args.kubeconfig_out:
        srv.write_kubeconfig(args.kubeconfig_out)
    print(srv.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        srv.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
