"""Where the API server is and how to authenticate: in-cluster service account or kubeconfig files."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import ssl
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from gpuremediate.kube import miniyaml
from gpuremediate.kube.errors import ConfigError

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class TokenSource(Protocol):
    def token(self) -> str | None: ...

    def invalidate(self) -> None: ...


class StaticToken:
    def __init__(self, value: str) -> None:
        self._value = value

    def token(self) -> str | None:
        return self._value

    def invalidate(self) -> None:
        """A static token cannot be refreshed."""


class FileToken:
    """A token file (bound service-account tokens rotate): re-read when its mtime changes or after a 401."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._value: str | None = None
        self._mtime: int | None = None

    def token(self) -> str | None:
        with self._lock:
            try:
                mtime = self.path.stat().st_mtime_ns
            except OSError as exc:
                raise ConfigError(f"cannot read token file {self.path}: {exc}") from exc
            if self._value is None or mtime != self._mtime:
                self._value = self._read()
                self._mtime = mtime
            return self._value

    def _read(self) -> str:
        try:
            value = self.path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"cannot read token file {self.path}: {exc}") from exc
        if not value:
            raise ConfigError(f"token file {self.path} is empty")
        return value

    def invalidate(self) -> None:
        with self._lock:
            self._value = None


class ExecToken:
    """A client-go `exec` credential plugin; its ExecCredential is cached until status.expirationTimestamp."""

    def __init__(self, spec: dict[str, Any], base_dir: Path | None = None, timeout: float = 60.0) -> None:
        command = spec.get("command")
        if not isinstance(command, str) or not command:
            raise ConfigError("kubeconfig user.exec needs a 'command'")
        api_version = spec.get("apiVersion")
        if api_version not in EXEC_API_VERSIONS:
            raise ConfigError(f"user.exec.apiVersion {api_version!r} is not one of {', '.join(EXEC_API_VERSIONS)}")
        if base_dir is not None and os.sep in command and not os.path.isabs(command):
            command = str(base_dir / command)
        self.command = [command, *[str(a) for a in spec.get("args") or []]]
        self.api_version = str(api_version)
        self.env = {str(e["name"]): str(e["value"]) for e in spec.get("env") or []}
        self.timeout = timeout
        self._lock = threading.Lock()
        self._value: str | None = None
        self._expires: float | None = None

    def token(self) -> str | None:
        with self._lock:
            if self._value is None or (self._expires is not None and time.time() >= self._expires):
                self._value, self._expires = self._run()
            return self._value

    def invalidate(self) -> None:
        with self._lock:
            self._value = None

    def _run(self) -> tuple[str, float | None]:
        info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            done = subprocess.run(self.command, env=env, capture_output=True, timeout=self.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"exec credential plugin {self.command[0]!r} failed: {exc}") from exc
        if done.returncode != 0:
            stderr = done.stderr.decode("utf-8", "replace").strip()[:500]
            raise ConfigError(f"exec credential plugin {self.command[0]!r} exited {done.returncode}: {stderr}")
        return parse_exec_credential(done.stdout, self.api_version)


def parse_exec_credential(stdout: bytes, api_version: str) -> tuple[str, float | None]:
    """(token, expiry as a Unix time or None) from an ExecCredential printed by a plugin."""
    try:
        cred = json.loads(stdout)
    except ValueError as exc:
        raise ConfigError(f"exec credential plugin printed invalid JSON: {exc}") from exc
    if not isinstance(cred, dict) or cred.get("kind") != "ExecCredential":
        raise ConfigError("exec credential plugin did not print an ExecCredential")
    if cred.get("apiVersion") != api_version:
        got = cred.get("apiVersion")
        raise ConfigError(f"exec credential plugin answered apiVersion {got!r}, want {api_version!r}")
    status = cred.get("status") or {}
    token = status.get("token")
    if not isinstance(token, str) or not token:
        raise ConfigError("ExecCredential.status.token is missing (client certificates from exec are not supported)")
    expiry = status.get("expirationTimestamp")
    return token, parse_rfc3339(expiry) if expiry else None


def parse_rfc3339(value: str) -> float:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise ConfigError(f"bad timestamp {value!r}: {exc}") from exc


@dataclass
class ClusterConfig:
    server: str
    ca_file: str | None = None
    ca_data: str | None = None  # PEM text
    client_cert_file: str | None = None
    client_key_file: str | None = None
    client_cert_data: bytes | None = None
    client_key_data: bytes | None = None
    token_source: TokenSource | None = None
    insecure_skip_tls_verify: bool = False
    namespace: str = "default"
    tls_server_name: str | None = None
    _ssl: ssl.SSLContext | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"server {self.server!r} must be an http(s) URL with a host")

    @property
    def scheme(self) -> str:
        return urlsplit(self.server).scheme

    @property
    def host(self) -> str:
        return urlsplit(self.server).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.server)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def path_prefix(self) -> str:
        return urlsplit(self.server).path.rstrip("/")

    def authorization(self) -> str | None:
        token = self.token_source.token() if self.token_source else None
        return f"Bearer {token}" if token else None

    def on_unauthorized(self) -> None:
        """A 401: drop cached credentials so that the next request reads fresh ones."""
        if self.token_source:
            self.token_source.invalidate()

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.scheme != "https":
            return None
        if self._ssl is None:
            self._ssl = self._build_ssl()
        return self._ssl

    def _build_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if self.insecure_skip_tls_verify:
            log.warning("TLS verification of %s is OFF (insecure-skip-tls-verify in the kubeconfig)", self.server)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.ca_file:
            ctx.load_verify_locations(cafile=self.ca_file)
        if self.ca_data:
            ctx.load_verify_locations(cadata=self.ca_data)
        if self.client_cert_file or self.client_cert_data:
            self._load_client_cert(ctx)
        return ctx

    def _load_client_cert(self, ctx: ssl.SSLContext) -> None:
        if self.client_cert_file and not self.client_cert_data:
            ctx.load_cert_chain(self.client_cert_file, self.client_key_file)
            return
        # ssl only loads certificates from files: write the data to private temp files, load, remove.
        with tempfile.TemporaryDirectory(prefix="gpuremediate-tls-") as tmp:
            cert = Path(tmp) / "client.crt"
            key = Path(tmp) / "client.key"
            _write_private(cert, self.client_cert_data or Path(str(self.client_cert_file)).read_bytes())
            key_file = Path(self.client_key_file) if self.client_key_file else None
            key_bytes = self.client_key_data or (key_file.read_bytes() if key_file else b"")
            if not key_bytes:
                raise ConfigError("a client certificate needs a client key")
            _write_private(key, key_bytes)
            ctx.load_cert_chain(str(cert), str(key))


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def in_cluster_config(sa_dir: str | os.PathLike[str] = SERVICE_ACCOUNT_DIR) -> ClusterConfig:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError("not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set")
    directory = Path(sa_dir)
    token_file = directory / "token"
    if not token_file.is_file():
        raise ConfigError(f"service-account token {token_file} does not exist")
    host_part = f"[{host}]" if ":" in host else host
    namespace_file = directory / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else "default"
    ca_file = directory / "ca.crt"
    return ClusterConfig(
        server=f"https://{host_part}:{port}",
        ca_file=str(ca_file) if ca_file.is_file() else None,
        token_source=FileToken(token_file),
        namespace=namespace or "default",
    )


def load_config(kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> ClusterConfig:
    """An explicit kubeconfig, else $KUBECONFIG (merged), else in-cluster, else ~/.kube/config."""
    if kubeconfig:
        return kubeconfig_config([Path(kubeconfig)], context)
    env = os.environ.get("KUBECONFIG")
    if env:
        paths = [Path(p) for p in env.split(os.pathsep) if p]
        return kubeconfig_config(paths, context)
    if os.environ.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT_DIR / "token").is_file():
        return in_cluster_config()
    home = Path.home() / ".kube" / "config"
    if home.is_file():
        return kubeconfig_config([home], context)
    raise ConfigError("no kubeconfig given, KUBECONFIG unset, not in a cluster, and ~/.kube/config missing")


def kubeconfig_config(paths: list[Path], context: str | None = None) -> ClusterConfig:
    merged = merge_kubeconfigs(paths)
    return config_from_kubeconfig(merged, context)


def read_kubeconfig(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"kubeconfig {path} is not UTF-8 text (a binary file?): {exc.reason} at byte "
                          f"{exc.start}") from None
    try:
        data = miniyaml.loads(text)
    except miniyaml.YamlError as exc:
        raise ConfigError(f"kubeconfig {path}: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"kubeconfig {path}: nested too deeply to be a kubeconfig") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"kubeconfig {path} is not a mapping")
    for section in ("clusters", "contexts", "users"):
        if data.get(section) is not None and not isinstance(data[section], list):
            raise ConfigError(f"kubeconfig {path}: {section} must be a list")
    _resolve_relative_paths(data, path.parent)
    return data


def _resolve_relative_paths(data: dict[str, Any], base: Path) -> None:
    def fix(section: Any, keys: tuple[str, ...]) -> None:
        if not isinstance(section, dict):
            return
        for key in keys:
            value = section.get(key)
            if isinstance(value, str) and value and not os.path.isabs(value):
                section[key] = str(base / value)

    for entry in data.get("clusters") or []:
        fix(entry.get("cluster") if isinstance(entry, dict) else None, ("certificate-authority",))
    for entry in data.get("users") or []:
        user = entry.get("user") if isinstance(entry, dict) else None
        fix(user, ("client-certificate", "client-key", "tokenFile"))
        if isinstance(user, dict) and isinstance(user.get("exec"), dict):
            user["exec"]["_base_dir"] = str(base)


def merge_kubeconfigs(paths: list[Path]) -> dict[str, Any]:
    """kubectl's rules: the first file to set a value (or name a cluster/context/user) wins.

    Missing files are skipped, as kubectl does; all of them missing is an error."""
    merged: dict[str, Any] = {"clusters": [], "contexts": [], "users": []}
    seen: dict[str, set[str]] = {"clusters": set(), "contexts": set(), "users": set()}
    existing = [p for p in paths if p.exists()]
    if not existing:
        raise ConfigError(f"none of the kubeconfig files exist: {', '.join(map(str, paths))}")
    for path in existing:
        data = read_kubeconfig(path)
        for section in ("clusters", "contexts", "users"):
            for entry in data.get(section) or []:
                name = entry.get("name") if isinstance(entry, dict) else None
                if not isinstance(name, str):
                    raise ConfigError(f"kubeconfig {path}: an entry of {section} has no name")
                if name not in seen[section]:
                    seen[section].add(name)
                    merged[section].append(entry)
        if data.get("current-context") and "current-context" not in merged:
            merged["current-context"] = data["current-context"]
    return merged


def _named(data: dict[str, Any], section: str, name: str, field_name: str) -> dict[str, Any]:
    for entry in data.get(section) or []:
        if entry.get("name") == name:
            value = entry.get(field_name)
            return value if isinstance(value, dict) else {}
    raise ConfigError(f"kubeconfig has no {section[:-1]} named {name!r}")


def config_from_kubeconfig(data: dict[str, Any], context: str | None = None) -> ClusterConfig:
    context_name = context or data.get("current-context")
    if not context_name:
        raise ConfigError("kubeconfig has no current-context and no context was chosen")
    ctx = _named(data, "contexts", str(context_name), "context")
    cluster = _named(data, "clusters", str(ctx.get("cluster") or ""), "cluster")
    user = _named(data, "users", str(ctx.get("user")), "user") if ctx.get("user") else {}
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise ConfigError(f"cluster {ctx.get('cluster')!r} has no server")
    insecure = cluster.get("insecure-skip-tls-verify") is True
    return ClusterConfig(
        server=server,
        ca_file=cluster.get("certificate-authority"),
        ca_data=_b64_text(cluster.get("certificate-authority-data"), "certificate-authority-data"),
        client_cert_file=user.get("client-certificate"),
        client_key_file=user.get("client-key"),
        client_cert_data=_b64(user.get("client-certificate-data"), "client-certificate-data"),
        client_key_data=_b64(user.get("client-key-data"), "client-key-data"),
        token_source=_token_source(user),
        insecure_skip_tls_verify=insecure,
        namespace=str(ctx.get("namespace") or "default"),
        tls_server_name=cluster.get("tls-server-name"),
    )


def _token_source(user: dict[str, Any]) -> TokenSource | None:
    if user.get("token"):
        return StaticToken(str(user["token"]))
    if user.get("tokenFile"):
        return FileToken(str(user["tokenFile"]))
    spec = user.get("exec")
    if isinstance(spec, dict):
        base = spec.get("_base_dir")
        return ExecToken(spec, Path(base) if base else None)
    if user.get("auth-provider"):
        raise ConfigError("kubeconfig auth-provider plugins are not supported; use an exec plugin")
    return None


def _b64(value: Any, what: str) -> bytes | None:
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigError(f"kubeconfig {what} is not valid base64: {exc}") from exc


def _b64_text(value: Any, what: str) -> str | None:
    raw = _b64(value, what)
    return raw.decode("ascii", "replace") if raw else None
