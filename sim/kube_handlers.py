"""The REST verbs on one resource: get, list, watch, create, update, patch (4 kinds), delete."""

from __future__ import annotations

import base64
import binascii
import copy
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuremediate.kube import miniyaml
from sim import kube_admission as adm
from sim import kube_dra, kube_protobuf, kube_schema, kube_tables
from sim import kube_errors as errs
from sim import kube_patch as kp
from sim.kube_http import Handler, Request
from sim.kube_nodes import add_not_ready_taint
from sim.kube_resources import ResourceType, prune
from sim.kube_selectors import fields_match, labels_match, parse_field_selector, parse_label_selector
from sim.kube_store import Obj, Store, WatchEvent, now_time, shape

if TYPE_CHECKING:
    from sim.kube_host import VerbsHost

PATCH_TYPES = {"application/json-patch+json": "json", "application/merge-patch+json": "merge",
               "application/strategic-merge-patch+json": "strategic", "application/apply-patch+yaml": "apply"}
CORE_MEDIA = "application/json, application/yaml, application/vnd.kubernetes.protobuf"
CR_PATCH_MEDIA = "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"


class Target:
    """One request's resource coordinates."""

    def __init__(self, rt: ResourceType, namespace: str, name: str, subresource: str) -> None:
        self.rt, self.namespace, self.name, self.subresource = rt, namespace, name, subresource


class Verbs:
    def __init__(self, store: Store, api: VerbsHost) -> None:
        self.api = api
        self.store = store

    # --- rendering ---------------------------------------------------------------------------------
    def render(self, rt: ResourceType, obj: Obj) -> Obj:
        if rt.key == "events" and rt.group == "events.k8s.io":
            obj = adm.event_from_core(obj)
        elif rt.key == "events":
            obj = dict(obj)
        obj["apiVersion"] = rt.group_version
        obj["kind"] = rt.kind
        return shape(rt, obj)

    def _item(self, rt: ResourceType, obj: Obj) -> Obj:
        out = self.render(rt, obj)
        if not rt.custom:
            out.pop("kind")
            out.pop("apiVersion")
        return out

    # --- reads -------------------------------------------------------------------------------------
    def get(self, h: Handler, req: Request, t: Target) -> None:
        view, version = kube_tables.negotiate(req.headers.get("accept", ""))
        obj = self.render(t.rt, self._existing(t))
        if view != kube_tables.PLAIN:
            obj = kube_tables.view_of_one(t.rt, obj, view, version, req.query.get("includeObject", ""))
        h.send_json(200, obj)

    def _existing(self, t: Target) -> Obj:
        obj = self.store.get(t.rt.key, t.namespace, t.name)
        if obj is None:
            raise errs.not_found(t.rt.resource, t.rt.group, t.name)
        return obj

    def _selectors(self, req: Request, rt: ResourceType) -> tuple[Any, Any]:
        labels = parse_label_selector(req.query.get("labelSelector", ""))
        fields = parse_field_selector(req.query.get("fieldSelector", ""), rt.resource,
                                      f"{rt.group_version}, Kind={rt.kind}")
        return labels, fields

    def _matches(self, obj: Obj, t: Target, labels: Any, fields: Any) -> bool:
        meta = obj["metadata"]
        if t.namespace and meta.get("namespace", "") != t.namespace:
            return False
        view = adm.event_to_core(obj) if t.rt.key == "events" else obj
        return labels_match(labels, meta.get("labels")) and fields_match(fields, view, t.rt.resource)

    def list_(self, h: Handler, req: Request, t: Target) -> None:
        view, version = kube_tables.negotiate(req.headers.get("accept", ""))
        listed = self.list_object(req, t)
        if view != kube_tables.PLAIN:
            listed = kube_tables.view_of_list(t.rt, listed, view, version, req.query.get("includeObject", ""))
        h.send_json(200, listed)

    def list_object(self, req: Request, t: Target) -> Obj:
        labels, fields = self._selectors(req, t.rt)
        rv_text, match = req.query.get("resourceVersion", ""), req.query.get("resourceVersionMatch", "")
        self._check_list_rv(rv_text, match)
        start, token_rv = self._decode_continue(req.query.get("continue", ""), t)
        limit = int(req.query.get("limit") or 0)
        if rv_text == "0" and not req.query.get("continue"):
            limit = 0
        with self.store.lock:
            list_rv = token_rv or self.store.current_rv()
            items, remaining = self.store.select_page(t.rt.key, t.namespace,
                                                      lambda o: self._matches(o, t, labels, fields),
                                                      lambda o: _list_key(o, t), start, limit)
        meta: dict[str, Any] = {"resourceVersion": str(list_rv)}
        if remaining:
            meta["continue"] = _encode_continue(list_rv, _list_key(items[-1], t))
            if not req.query.get("labelSelector") and not req.query.get("fieldSelector"):
                meta["remainingItemCount"] = remaining
        rendered = [self._item(t.rt, o) for o in items]
        if t.rt.custom:
            return {"apiVersion": t.rt.group_version, "items": rendered, "kind": t.rt.kind + "List",
                    "metadata": meta}
        return {"kind": t.rt.kind + "List", "apiVersion": t.rt.group_version, "metadata": meta, "items": rendered}

    def _check_list_rv(self, rv_text: str, match: str) -> None:
        if match and not rv_text:
            raise errs.invalid_options("ListOptions", "resourceVersionMatch", "FieldValueForbidden",
                                       "Forbidden: resourceVersionMatch is forbidden unless resourceVersion "
                                       "is provided")
        if match == "Exact" and rv_text == "0":
            raise errs.invalid_options("ListOptions", "resourceVersionMatch", "FieldValueForbidden",
                                       'Forbidden: resourceVersionMatch "exact" is forbidden for '
                                       'resourceVersion "0"')
        if not rv_text:
            return
        rv = _parse_rv(rv_text)
        if match == "Exact" and rv <= self.store.compacted_rv:
            raise errs.gone("The resourceVersion for the provided list is too old.")
        if rv > self.store.current_rv():
            self._wait_for_rv(rv)

    def _wait_for_rv(self, rv: int) -> None:
        deadline = time.monotonic() + self.api.too_large_rv_wait_s
        with self.store.changed:
            while self.store.rv < rv and time.monotonic() < deadline:
                self.store.changed.wait(max(0.0, deadline - time.monotonic()))
            if self.store.rv >= rv:
                return
            current = self.store.rv
        body = errs.status(504, f"Timeout: Too large resource version: {rv}, current: {current}", "Timeout",
                           {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                            "retryAfterSeconds": 1})
        raise errs.ApiError(504, body, {"Retry-After": "1"})

    def _decode_continue(self, token: str, t: Target) -> tuple[str, int]:
        if not token:
            return "", 0
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError) as exc:
            raise errs.bad_request(f"invalid continue token: {exc}") from None
        try:
            data = json.loads(raw.decode("utf-8"))
            rv, start = int(data["rv"]), str(data["start"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise errs.bad_request(f"invalid continue token: continue key is not valid: {_json_error(raw)}") from None
        if 0 < rv <= self.store.compacted_rv:
            fresh = _encode_continue(-1, start.rstrip("\x00"))
            raise errs.gone(_CONTINUE_TOO_OLD, metadata={"continue": fresh})
        return start.rstrip("\x00"), max(rv, 0)

    # --- watch -------------------------------------------------------------------------------------
    def watch(self, h: Handler, req: Request, t: Target, cut_after: float | None) -> None:
        labels, fields = self._selectors(req, t.rt)
        rv_text = req.query.get("resourceVersion", "")
        if rv_text not in ("", "0") and not rv_text.isdigit():
            msg = f'resourceVersion: Invalid value: "{rv_text}": strconv.ParseUint: parsing "{rv_text}": invalid syntax'
            raise errs.internal(msg)
        timeout = float(req.query.get("timeoutSeconds") or 1800)
        stream = _WatchStream(self, h, t, labels, fields, req.flag("allowWatchBookmarks"))
        h.start_stream()
        start = time.monotonic()
        deadline = start + timeout
        if rv_text in ("", "0"):
            since = stream.send_initial()
        else:
            since = int(rv_text)
            if since < self.store.compacted_rv:
                stream.send_expired(since)
                h.end_chunks()
                return
        stream.follow(since, deadline, cut_at=None if cut_after is None else start + cut_after)

    # --- writes ------------------------------------------------------------------------------------
    def decode(self, req: Request, rt: ResourceType) -> Obj:
        if req.content_type == kube_protobuf.MEDIA_TYPE and not rt.custom:  # Helm's release Secrets (kube_protobuf)
            try:
                obj = kube_protobuf.decode(req.body)
            except (kube_protobuf.ProtobufError, UnicodeDecodeError) as exc:
                raise errs.bad_request(f"the object provided is unrecognized (must be of type {rt.kind}): {exc}") \
                    from None
            self._check_kind(obj, rt)
            return obj
        if req.content_type not in ("application/json", "application/yaml", ""):
            raise errs.unsupported_body(CORE_MEDIA if not rt.custom else "application/json, application/yaml")
        text = req.body.decode("utf-8", errors="replace")
        try:
            obj = json.loads(text) if req.content_type != "application/yaml" else miniyaml.loads(text)
        except (ValueError, json.JSONDecodeError) as exc:
            snippet = text[:30] + (" ..." if len(text) > 30 else "")
            reason = "unexpected end of JSON input" if "Expecting" in str(exc) and _at_end(exc, text) \
                else "invalid character looking for beginning of value"
            raise errs.bad_request(f"the object provided is unrecognized (must be of type {rt.kind}): couldn't "
                                   f"get version/kind; json parse error: {reason} ({snippet})") from None
        if not isinstance(obj, dict):
            raise errs.bad_request(f"the object provided is unrecognized (must be of type {rt.kind})")
        self._check_kind(obj, rt)
        bad_time = adm.micro_time_error(rt, obj)
        if bad_time:
            raise errs.bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {bad_time}')
        return self._drop_unknown(req, rt, obj)

    def _check_kind(self, obj: Obj, rt: ResourceType) -> None:
        kind = obj.get("kind", rt.kind)
        if kind != rt.kind:
            version = obj.get("apiVersion", rt.group_version)
            internal = "core" if not rt.group else rt.group.split(".")[0]
            raise errs.bad_request(f'{kind} in version "{version}" cannot be handled as a {rt.kind}: converting '
                                   f'({version.split("/")[-1]}.{kind}) to ({internal}.{rt.kind}): unknown conversion')

    def _drop_unknown(self, req: Request, rt: ResourceType, obj: Obj) -> Obj:
        if rt.custom:
            dropped: list[str] = []
            body = {k: v for k, v in obj.items() if k in ("apiVersion", "kind", "metadata")}
            pruned = prune({k: v for k, v in obj.items() if k not in body}, rt.schema, "", dropped)
            body.update(pruned)
            self._unknown_fields(req, rt, dropped)
            return body
        if rt.top_fields is None:
            return obj
        unknown = [k for k in obj if k not in rt.top_fields]
        kept = {k: v for k, v in obj.items() if k not in unknown}
        self._unknown_fields(req, rt, unknown + kube_dra.prune(rt, kept))
        return kept

    def _unknown_fields(self, req: Request, rt: ResourceType, names: list[str]) -> None:
        if not names:
            return
        if req.query.get("fieldValidation") == "Strict":
            listed = ", ".join(f'unknown field "{n}"' for n in names)
            raise errs.bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                                   f"strict decoding error: {listed}")
        if req.query.get("fieldValidation") != "Ignore":
            req.warnings += [f'unknown field "{n}"' for n in names]

    def dry_run(self, req: Request, options_kind: str) -> bool:
        value = req.query.get("dryRun")
        if value is None:
            return False
        if value != "All":
            raise errs.invalid_options(options_kind, "dryRun", "FieldValueNotSupported",
                                       f'Unsupported value: []string{{"{value}"}}: supported values: "All"')
        return True

    def create(self, h: Handler, req: Request, t: Target) -> None:
        dry = self.dry_run(req, "CreateOptions")
        obj = self.decode(req, t.rt)
        if t.rt.custom:
            self.api.wait_for_cr_storage(t.rt)
        created = self.create_object(req, t, obj, dry, manager=self.manager(req), operation="Update")
        h.send_json(201, self.render(t.rt, created), self._warning_headers(req))

    def create_object(self, req: Request, t: Target, obj: Obj, dry: bool, manager: str, operation: str) -> Obj:
        meta = obj.setdefault("metadata", {})
        if t.rt.namespaced and meta.get("namespace") not in (None, "", t.namespace):
            raise errs.bad_request("the namespace of the provided object does not match the namespace sent "
                                   "on the request")
        if t.rt.key == "events":
            obj = self._to_event_storage(t, obj)
        obj = adm.prepare_create(t.rt, obj, self.api.default_toleration_s)
        kube_dra.default(t.rt, obj, None)
        if t.rt.custom:
            _structural(t.rt, obj)
        adm.drop_omitted(t.rt, obj)
        if t.rt.resource == "nodes" and not t.rt.custom:
            add_not_ready_taint(obj)
        if t.rt.resource == "pods" and not t.rt.custom:
            adm.check_service_account(self.store, self.api.type_for("", "serviceaccounts"), obj, t.namespace)
        obj = self._mutating_webhooks(req, t, obj, dry)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            obj["metadata"]["name"] = meta["generateName"] + "xxxxx"
            adm.validate(t.rt, obj, None, kube_dra.validate)
            del obj["metadata"]["name"]
        else:
            adm.validate(t.rt, obj, None, kube_dra.validate)
        obj["apiVersion"], obj["kind"] = t.rt.group_version, t.rt.kind

        def mutate(o: Obj) -> None:
            if t.rt.resource == "jobs":
                adm.label_job(o)
            if t.rt.resource == "customresourcedefinitions":
                adm.establish_crd(o)
            _set_managed(o, {}, manager, operation, t.rt.group_version, set(kp.leaf_paths(o)))

        created = self.store.create(t.rt, obj, t.namespace, dry_run=dry, mutate=mutate)
        if dry:
            created["metadata"].pop("resourceVersion", None)
        return created

    def _mutating_webhooks(self, req: Request, t: Target, obj: Obj, dry: bool) -> Obj:
        """MutatingAdmissionWebhook (after the built-in mutating plugins), then defaulting again on a patched
        object, as the API server's mutation dispatcher does."""
        admitted = self.api.webhooks.admit(
            self.store, self.api.type_for("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
            self.api.type_for("", "namespaces"), t.rt, obj, t.namespace, "CREATE", req.user, req.groups, dry)
        if admitted is obj:
            return obj
        return adm.prepare_create(t.rt, admitted, self.api.default_toleration_s)

    def _to_event_storage(self, t: Target, obj: Obj) -> Obj:
        obj.setdefault("metadata", {})["namespace"] = t.namespace
        if t.rt.group == "events.k8s.io":
            name = obj["metadata"].get("name", "")
            adm.raise_invalid(t.rt, name, adm.validate_events_v1(obj))
            obj = adm.event_to_core(obj)
        return obj

    def update(self, h: Handler, req: Request, t: Target) -> None:
        dry = self.dry_run(req, "UpdateOptions")
        body = self.decode(req, t.rt)
        body_name = body.get("metadata", {}).get("name", "")
        if body_name and body_name != t.name:
            raise errs.bad_request(f"the name of the object ({body_name}) does not match the name on the URL "
                                   f"({t.name})")
        rv = body.get("metadata", {}).get("resourceVersion")
        if not rv and t.rt.custom:  # customResourceStrategy.AllowUnconditionalUpdate() is false
            cause = errs.cause("FieldValueInvalid", "Invalid value: 0x0: must be specified for an update",
                               "metadata.resourceVersion")
            raise errs.invalid(errs.qualified(t.rt.resource, t.rt.group), t.name, t.rt.group, t.rt.resource,
                               [cause])
        if t.rt.key == "events":
            body = self._to_event_storage(t, body)

        def attempt() -> Obj:
            old = self._existing(t)
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise errs.stale(t.rt.resource, t.rt.group, t.name)
            return self.commit_update(req, t, old, copy.deepcopy(body), dry, self.manager(req), "Update")

        new = _retry_on_race(attempt)
        h.send_json(200, self.render(t.rt, new), self._warning_headers(req))

    def commit_update(self, req: Request, t: Target, old: Obj, body: Obj, dry: bool, manager: str,
                      operation: str, owned: set[kp.Path] | None = None) -> Obj:
        new = _merge_subresource(t.rt, old, body, t.subresource)
        kube_dra.default(t.rt, new, old)
        adm.drop_omitted(t.rt, new)
        new["apiVersion"], new["kind"] = t.rt.group_version, t.rt.kind
        _keep_system_metadata(new, old)
        if t.rt.generation and _spec_changed(old, new):
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if t.rt.custom:
            _structural(t.rt, new)
        adm.validate(t.rt, new, old, kube_dra.validate)
        if operation == "Apply":
            _set_managed(new, new, manager, operation, t.rt.group_version, owned or set(), replace=True)
        else:
            _set_managed(new, old, manager, operation, t.rt.group_version, kp.changed_paths(old, new))
        stored = self.store.update(t.rt, new, old, dry_run=dry)
        if t.rt.resource == "customresourcedefinitions" and not dry:
            self.api.register_crd(stored)
        return stored

    def patch(self, h: Handler, req: Request, t: Target) -> None:
        kind = PATCH_TYPES.get(req.content_type)
        if kind is None:
            raise errs.unsupported_patch()
        if kind == "strategic" and t.rt.custom:
            raise errs.unsupported_body(CR_PATCH_MEDIA)
        dry = self.dry_run(req, "PatchOptions")
        if req.query.get("force") and kind != "apply":
            raise errs.invalid_options("PatchOptions", "force", "FieldValueForbidden",
                                       "Forbidden: may not be specified for non-apply patch")
        if kind == "apply":
            self._apply(h, req, t, dry)
            return

        def attempt() -> Obj:
            old = self._existing(t)
            new = self._patched(req, old, kind)
            bad_time = adm.micro_time_error(t.rt, new)
            if bad_time:
                raise _patch_decode_invalid(new, bad_time)
            if new.get("metadata", {}).get("resourceVersion") != old["metadata"]["resourceVersion"]:
                raise errs.stale(t.rt.resource, t.rt.group, t.name)
            return self.commit_update(req, t, old, new, dry, self.manager(req), "Update")

        stored = _retry_on_race(attempt)
        h.send_json(200, self.render(t.rt, stored))

    def _patched(self, req: Request, old: Obj, kind: str) -> Obj:
        try:
            patch = json.loads(req.body.decode("utf-8"))
        except ValueError:
            raise errs.bad_request("error decoding patch: invalid JSON") from None
        if kind == "json":
            if not isinstance(patch, list):
                raise errs.bad_request("error decoding patch: json: cannot unmarshal object into Go value of "
                                       "type []handlers.jsonPatchOp")
            try:
                return kp.json_patch(old, patch)
            except (kp.PatchError, IndexError, KeyError, TypeError):
                raise errs.generic_invalid() from None
        if not isinstance(patch, dict):
            raise errs.bad_request("error decoding patch: json: cannot unmarshal into Go value of type "
                                   "map[string]interface {}")
        merged = kp.merge_patch(old, patch) if kind == "merge" else kp.strategic_merge(old, patch)
        return merged

    def _apply(self, h: Handler, req: Request, t: Target, dry: bool) -> None:
        manager = req.query.get("fieldManager", "")
        if not manager:
            raise errs.invalid_options("PatchOptions", "fieldManager", "FieldValueRequired",
                                       "Required value: is required for apply patch")
        text = req.body.decode("utf-8", errors="replace")
        try:
            applied = json.loads(text)
        except ValueError:
            applied = miniyaml.loads(text)
        if not isinstance(applied, dict) or not applied.get("apiVersion") or not applied.get("kind"):
            raise errs.bad_request("invalid object type: /, Kind=")
        self._check_kind(applied, t.rt)
        applied = self._drop_unknown(req, t.rt, applied)
        applied.setdefault("metadata", {})["name"] = t.name
        old = self.store.get(t.rt.key, t.namespace, t.name)
        if old is None:
            created = self.create_object(req, t, applied, dry, manager=manager, operation="Apply")
            h.send_json(201, self.render(t.rt, created))
            return
        new, owned = _server_side_apply(old, applied, manager, req.flag("force"), t.rt.group_version)
        stored = self.commit_update(req, t, old, new, dry, manager, "Apply", owned)
        h.send_json(200, self.render(t.rt, stored))

    def manager(self, req: Request) -> str:
        if req.query.get("fieldManager"):
            return req.query["fieldManager"]
        agent = req.headers.get("user-agent", "")
        return agent.split("/")[0] if agent else "unknown"

    @staticmethod
    def _warning_headers(req: Request) -> dict[str, str]:
        if not req.warnings:
            return {}
        return {"Warning": ", ".join('299 - "' + w.replace('"', '\\"') + '"' for w in req.warnings)}

    # --- delete ------------------------------------------------------------------------------------
    def delete_options(self, req: Request) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if req.body:
            try:
                opts = kube_protobuf.decode(req.body) if req.content_type == kube_protobuf.MEDIA_TYPE else \
                    json.loads(req.body.decode("utf-8")) or {}
            except ValueError:
                raise errs.bad_request("invalid DeleteOptions body") from None
        if "gracePeriodSeconds" in req.query:
            opts["gracePeriodSeconds"] = int(req.query["gracePeriodSeconds"])
        if "propagationPolicy" in req.query:
            opts["propagationPolicy"] = req.query["propagationPolicy"]
        if opts.get("orphanDependents") is True:
            opts.setdefault("propagationPolicy", "Orphan")
        elif opts.get("orphanDependents") is False:
            opts.setdefault("propagationPolicy", "Background")
        if "dryRun" in req.query or opts.get("dryRun"):
            value = req.query.get("dryRun") or (opts.get("dryRun") or [""])[0]
            req.query["dryRun"] = value
            opts["dryRun"] = self.dry_run(req, "DeleteOptions")
        return opts

    def delete(self, h: Handler, req: Request, t: Target) -> None:
        opts = self.delete_options(req)
        obj, removed = self.store.delete(
            t.rt, t.namespace, t.name, grace=opts.get("gracePeriodSeconds"),
            propagation=opts.get("propagationPolicy"), preconditions=opts.get("preconditions"),
            dry_run=bool(opts.get("dryRun")))
        if (removed or obj["metadata"].get("deletionTimestamp") is None) and not t.rt.returns_object_on_delete:
            details: dict[str, Any] = {"name": t.name}
            if t.rt.group:
                details["group"] = t.rt.group
            details.update(kind=t.rt.resource, uid=obj["metadata"]["uid"])
            h.send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                              "details": details})
            return
        h.send_json(200, self.render(t.rt, obj))

    def delete_collection(self, h: Handler, req: Request, t: Target) -> None:
        opts = self.delete_options(req)
        listing = self.list_object(req, t)
        for item in listing["items"]:
            try:
                self.store.delete(t.rt, item["metadata"].get("namespace", ""), item["metadata"]["name"],
                                  grace=opts.get("gracePeriodSeconds"), propagation=opts.get("propagationPolicy"),
                                  dry_run=bool(opts.get("dryRun")))
            except errs.ApiError:
                continue
        h.send_json(200, listing)


RACE_RETRIES = 5


def _retry_on_race(attempt: Callable[[], Obj]) -> Obj:
    """GuaranteedUpdate: a write whose read went stale in the meantime is computed again from the newer
    object; only a resourceVersion the client pinned (checked inside ``attempt``) answers 409."""
    for _ in range(RACE_RETRIES):
        try:
            return attempt()
        except errs.ApiError as err:
            if not err.raced:
                raise
    return attempt()


def _structural(rt: ResourceType, obj: Obj) -> None:
    """A custom resource as stored: unknown fields pruned (a patch may add them too), schema defaults set."""
    body = prune({k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}, rt.schema, "", [])
    for key in [k for k in obj if k not in ("apiVersion", "kind", "metadata")]:
        del obj[key]
    obj.update(body)
    kube_schema.apply_defaults(obj, rt.schema)


def _patch_decode_invalid(patched: Obj, why: str) -> errs.ApiError:
    """A patch whose result does not decode (e.g. a Lease MicroTime without microseconds): 422 naming
    the whole patched object, with no kind or name (exchange 25)."""
    value = json.dumps(patched, separators=(",", ":"))
    text = f"Invalid value: {json.dumps(value)}: {why}"
    body = errs.status(422, f' "" is invalid: patch: {text}', "Invalid",
                       {"causes": [errs.cause("FieldValueInvalid", text, "patch")]})
    return errs.ApiError(422, body)


_CONTINUE_TOO_OLD = ("The provided continue parameter is too old to display a consistent list result. You can "
                     "start a new list without the continue parameter, or use the continue token in this response "
                     "to retrieve the remainder of the results. Continuing with the provided token results in an "
                     "inconsistent list - objects that were created, modified, or deleted between the time the "
                     "first chunk was returned and now may show up in the list.")


def _list_key(obj: Obj, t: Target) -> str:
    meta = obj["metadata"]
    if t.rt.namespaced and not t.namespace:
        return f"{meta.get('namespace', '')}/{meta['name']}"
    return str(meta["name"])


def _encode_continue(rv: int, last: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": last + "\x00"}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _json_error(raw: bytes) -> str:
    stripped = raw.lstrip()
    if not stripped:
        return "unexpected end of JSON input"
    first = stripped[0]
    shown = chr(first) if 32 <= first < 127 else f"\\x{first:02x}"
    return f"invalid character '{shown}' looking for beginning of value"


def _at_end(exc: Exception, text: str) -> bool:
    pos = getattr(exc, "pos", 0)
    return bool(pos >= len(text.rstrip()))


def _parse_rv(text: str) -> int:
    if not text.isdigit():
        raise errs.bad_request(f'invalid resource version "{text}"')
    return int(text)


def _merge_subresource(rt: ResourceType, old: Obj, body: Obj, sub: str) -> Obj:
    if not rt.has_status:
        return copy.deepcopy(body)
    if sub == "status":
        new = copy.deepcopy(old)
        if "status" in body:
            new["status"] = copy.deepcopy(body["status"])
        else:
            new.pop("status", None)
        new["metadata"]["resourceVersion"] = body.get("metadata", {}).get("resourceVersion",
                                                                          old["metadata"]["resourceVersion"])
        return new
    new = copy.deepcopy(body)
    if "status" in old:
        new["status"] = copy.deepcopy(old["status"])
    else:
        new.pop("status", None)
    return new


_SYSTEM_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
                "namespace", "name")


def _keep_system_metadata(new: Obj, old: Obj) -> None:
    meta = new.setdefault("metadata", {})
    for key in _SYSTEM_META:
        if key in old["metadata"]:
            meta[key] = old["metadata"][key]
        else:
            meta.pop(key, None)
    meta["resourceVersion"] = old["metadata"]["resourceVersion"]


def _spec_changed(old: Obj, new: Obj) -> bool:
    def body(o: Obj) -> Obj:
        return {k: v for k, v in o.items() if k not in ("metadata", "status", "apiVersion", "kind")}
    return body(old) != body(new)


# --- managedFields (simplified: leaf paths per manager and operation) --------------------------------

def _ownership(obj: Obj) -> dict[tuple[str, str], tuple[str, set[kp.Path]]]:
    out: dict[tuple[str, str], tuple[str, set[kp.Path]]] = {}
    for entry in obj.get("metadata", {}).get("managedFields") or []:
        paths = kp.paths_from_fields_v1(entry.get("fieldsV1") or {})
        out[(entry.get("manager", ""), entry.get("operation", "Update"))] = (entry.get("apiVersion", ""), paths)
    return out


def _set_managed(new: Obj, old: Obj, manager: str, operation: str, api_version: str, paths: set[kp.Path],
                 replace: bool = False) -> None:
    owners = _ownership(old)
    if not replace and not paths and (manager, operation) not in owners:
        new["metadata"]["managedFields"] = old.get("metadata", {}).get("managedFields", [])
        if not new["metadata"]["managedFields"]:
            new["metadata"].pop("managedFields")
        return
    if operation == "Update":
        owners = {k: (v, ps - paths) for k, (v, ps) in owners.items()}
    mine = paths if replace else owners.get((manager, operation), (api_version, set()))[1] | paths
    owners[(manager, operation)] = (api_version, mine)
    entries = [{"manager": m, "operation": op, "apiVersion": v, "time": now_time(), "fieldsType": "FieldsV1",
                "fieldsV1": kp.fields_v1(ps)} for (m, op), (v, ps) in owners.items() if ps]
    if entries:
        new["metadata"]["managedFields"] = entries
    else:
        new["metadata"].pop("managedFields", None)


def _server_side_apply(old: Obj, applied: Obj, manager: str, force: bool,
                       api_version: str) -> tuple[Obj, set[kp.Path]]:
    # An empty map in the applied config claims nothing where the object already has that map.
    applied_leaves = {p: v for p, v in kp.leaf_paths(applied).items()
                      if not (v == {} and isinstance(kp.get_path(old, p), dict))}
    owners = _ownership(old)
    conflicts: list[tuple[str, str, kp.Path]] = []
    for (other, op), (version, paths) in owners.items():
        if other == manager:
            continue
        for path in sorted(paths & set(applied_leaves)):
            if kp.get_path(old, path) != applied_leaves[path]:
                conflicts.append((other, op if op == "Apply" else f"Update:{version}", path))
    if conflicts and not force:
        raise _apply_conflict(conflicts)
    new = copy.deepcopy(old)
    previously = owners.get((manager, "Apply"), ("", set()))[1]
    others = set().union(*(ps for (m, _), (_, ps) in owners.items() if m != manager)) if owners else set()
    for path in previously - set(applied_leaves) - others:
        kp.delete_path(new, path)
    for path, value in applied_leaves.items():
        _set_path(new, path, copy.deepcopy(value))
    if force and conflicts:
        lost = {c[2] for c in conflicts}
        kept = [e for e in new["metadata"].get("managedFields") or []]
        for entry in kept:
            remaining = kp.paths_from_fields_v1(entry.get("fieldsV1") or {}) - lost
            entry["fieldsV1"] = kp.fields_v1(remaining)
        new["metadata"]["managedFields"] = [e for e in kept if e["fieldsV1"]]
    return new, set(applied_leaves)


def server_side_apply_and_own(store: Store, rt: ResourceType, old: Obj, applied: Obj, manager: str) -> Obj:
    """A controller's forced server-side apply of ``applied`` over ``old`` (kube-controller-manager's way:
    ``Force: true``), stored with ``manager`` owning what it applied."""
    new, owned = _server_side_apply(old, applied, manager, True, rt.group_version)
    _set_managed(new, new, manager, "Apply", rt.group_version, owned, replace=True)
    return store.update(rt, new, old)


def _set_path(obj: Obj, path: kp.Path, value: Any) -> None:
    cur = obj
    for key in path[:-1]:
        nxt = cur.get(key)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[key] = nxt
        cur = nxt
    cur[path[-1]] = value


def _apply_conflict(conflicts: list[tuple[str, str, kp.Path]]) -> errs.ApiError:
    def who(manager: str, op: str) -> str:
        return f'"{manager}"' if op == "Apply" else f'"{manager}" using {op.split(":", 1)[1]}'
    by_manager: dict[str, list[str]] = {}
    for manager, op, path in conflicts:
        by_manager.setdefault(who(manager, op), []).append(kp.path_text(path))
    parts = []
    for label, paths in by_manager.items():
        parts.append(f"conflict with {label}: {paths[0]}" if len(paths) == 1
                     else f"conflicts with {label}:\n" + "\n".join(f"- {p}" for p in paths))
    count = len(conflicts)
    msg = f"Apply failed with {count} conflict{'s' if count > 1 else ''}: " + "\n".join(parts)
    causes = [{"reason": "FieldManagerConflict", "message": f"conflict with {who(m, op)}",
               "field": kp.path_text(p)} for m, op, p in conflicts]
    return errs.ApiError(409, errs.status(409, msg, "Conflict", {"causes": causes}))


# --- watch streaming ------------------------------------------------------------------------------

class _WatchStream:
    def __init__(self, verbs: Verbs, h: Handler, t: Target, labels: Any, fields: Any, bookmarks: bool) -> None:
        self.verbs, self.h, self.t = verbs, h, t
        self.labels, self.fields, self.bookmarks = labels, fields, bookmarks
        self.last_rv = 0

    def _send(self, event_type: str, obj: Obj) -> None:
        self.h.write_chunk(errs.encode({"type": event_type, "object": obj}))

    def send_initial(self) -> int:
        store = self.verbs.store
        with store.lock:
            rv = store.current_rv()
            objs = store.select(self.t.rt.key, self.t.namespace,
                                lambda o: self.verbs._matches(o, self.t, self.labels, self.fields))
        for obj in objs:
            self._send("ADDED", self.verbs.render(self.t.rt, obj))
        self.last_rv = rv
        return rv

    def send_expired(self, rv: int) -> None:
        oldest = self.verbs.store.compacted_rv + 1
        self._send("ERROR", errs.status(410, f"too old resource version: {rv} ({oldest})", "Expired"))

    def _translate(self, event: WatchEvent) -> tuple[str, Obj] | None:
        """As the watch cache does: compare the old and new object against the filter."""
        if event.key != self.t.rt.key:
            return None
        now = self.verbs._matches(event.obj, self.t, self.labels, self.fields)
        before = event.prev is not None and self.verbs._matches(event.prev, self.t, self.labels, self.fields)
        if event.type == "DELETED":
            return ("DELETED", event.obj) if now or before else None
        if now:
            return ("MODIFIED" if before else "ADDED"), event.obj
        return ("DELETED", event.obj) if before else None

    def follow(self, since: int, deadline: float, cut_at: float | None) -> None:
        self.last_rv = max(self.last_rv, since)
        interval = self.verbs.api.bookmark_interval_s
        next_bookmark = time.monotonic() + interval
        final_bookmark = deadline - min(2.0, interval / 2)
        store = self.verbs.store
        while True:
            now = time.monotonic()
            if cut_at is not None and now >= cut_at:
                self.h.reset()
                return
            if now >= deadline or self.verbs.api.stopping:
                self.h.end_chunks()
                return
            for event in store.events_after(self.last_rv):
                self.last_rv = event.rv
                out = self._translate(event)
                if out:
                    self._send(out[0], self.verbs.render(self.t.rt, out[1]))
            if self.bookmarks and (now >= next_bookmark or final_bookmark <= now):
                self._bookmark()
                next_bookmark = now + interval
                final_bookmark = float("inf") if final_bookmark <= now else final_bookmark
            wake = min(deadline, next_bookmark if self.bookmarks else deadline, final_bookmark,
                       cut_at if cut_at is not None else deadline)
            with store.changed:
                if store.rv <= self.last_rv:
                    store.changed.wait(max(0.005, min(wake - time.monotonic(), 0.5)))

    def _bookmark(self) -> None:
        rv = str(max(self.last_rv, 0))
        obj: Obj = {"kind": self.t.rt.kind, "apiVersion": self.t.rt.group_version,
                    "metadata": {"resourceVersion": rv, "creationTimestamp": None}}
        if self.t.rt.resource == "pods":
            obj.update(spec={"containers": None}, status={})
        elif not self.t.rt.custom:
            if self.t.rt.has_status or self.t.rt.resource in ("leases",):
                obj["spec"] = {}
            if self.t.rt.has_status:
                obj["status"] = {}
        self._send("BOOKMARK", obj)
