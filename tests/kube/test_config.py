"""Config loading: kubeconfig files (merged, contexts, exec plugins, TLS material) and in-cluster."""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import (
    ClusterConfig,
    FileToken,
    in_cluster_config,
    kubeconfig_config,
    load_config,
)
from gpuremediate.kube.resources import NODES

from .replay import Canned, ReplayServer

KIND_KUBECONFIG = """apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: {ca}
    server: https://127.0.0.1:39999
  name: kind-kind
contexts:
- context:
    cluster: kind-kind
    user: kind-kind
  name: kind-kind
current-context: kind-kind
kind: Config
preferences: {{}}
users:
- name: kind-kind
  user:
    token: kind-token   # a comment
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _ok_node() -> Canned:
    body = json.dumps({"kind": "Node", "apiVersion": "v1", "metadata": {"name": "n"}}).encode()
    return Canned("GET", "/api/v1/nodes/n", 200, "OK", [("Content-Type", "application/json")], body)


@pytest.fixture()
def replay() -> Iterator[ReplayServer]:
    server = ReplayServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-signed CA-capable certificate for 127.0.0.1, and a client certificate, made with openssl."""
    directory = tmp_path_factory.mktemp("tls")
    out = {}
    for name, subject in (("server", "/CN=127.0.0.1"), ("client", "/CN=gpuremediate")):
        key, cert = directory / f"{name}.key", directory / f"{name}.crt"
        ext = "subjectAltName=IP:127.0.0.1" if name == "server" else "basicConstraints=CA:FALSE"
        code = os.system(
            f"openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj {subject} -addext {ext} "
            f"-keyout {key} -out {cert} >/dev/null 2>&1"
        )
        if code != 0:
            pytest.skip("openssl is not available to make test certificates")
        out[f"{name}_key"], out[f"{name}_cert"] = key, cert
    return out


def test_kind_kubeconfig_loads(tmp_path: Path, tls_material: dict[str, Path]) -> None:
    ca = base64.b64encode(tls_material["server_cert"].read_bytes()).decode()
    config = load_config(_write(tmp_path / "config", KIND_KUBECONFIG.format(ca=ca)))
    assert config.server == "https://127.0.0.1:39999"
    assert config.ca_data and config.ca_data.startswith("-----BEGIN CERTIFICATE-----")
    assert config.authorization() == "Bearer kind-token"
    ctx = config.ssl_context()
    assert ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_kubeconfig_list_merges_first_file_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _write(tmp_path / "a", """
current-context: ctx-b
clusters:
- name: c1
  cluster: {server: "http://127.0.0.1:1001"}
users:
- name: u1
  user: {token: first}
contexts:
- name: ctx-a
  context: {cluster: c1, user: u1}
""")
    second = _write(tmp_path / "b", """
current-context: ctx-a
clusters:
- name: c1
  cluster: {server: "http://127.0.0.1:2002"}
- name: c2
  cluster: {server: "http://127.0.0.1:3003"}
users:
- name: u1
  user: {token: second}
contexts:
- name: ctx-b
  context: {cluster: c2, user: u1, namespace: gpu}
""")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(first), str(tmp_path / "missing"), str(second)]))
    config = load_config()
    assert (config.server, config.namespace) == ("http://127.0.0.1:3003", "gpu")  # ctx-b: current from file a
    assert config.authorization() == "Bearer first"  # u1 from the first file
    other = load_config(context="ctx-a")
    assert other.server == "http://127.0.0.1:1001"  # c1 from the first file wins over the second
    with pytest.raises(errors.ConfigError, match="no context named 'nope'"):
        load_config(context="nope")


def test_explicit_path_beats_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "does-not-exist"))
    path = _write(tmp_path / "k", KIND_KUBECONFIG.format(ca=""))
    assert load_config(path).server == "https://127.0.0.1:39999"


def test_json_kubeconfig_and_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "token").write_text("from-file\n")
    doc = {"clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1", "certificate-authority": "ca"}}],
           "users": [{"name": "u", "user": {"tokenFile": "certs/token"}}],
           "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x"}
    config = load_config(_write(tmp_path / "k.json", json.dumps(doc)))
    assert config.ca_file == str(tmp_path / "ca")
    assert config.authorization() == "Bearer from-file"


def test_bad_kubeconfig_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "k", "clusters:\n- name: c\n  cluster: &anchor\n")
    with pytest.raises(errors.ConfigError, match=r"line 3: anchors"):
        load_config(path)


def test_insecure_only_when_explicit_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    text = KIND_KUBECONFIG.format(ca="").replace("    server:", "    insecure-skip-tls-verify: true\n    server:")
    config = load_config(_write(tmp_path / "k", text))
    with caplog.at_level(logging.WARNING):
        ctx = config.ssl_context()
    assert ctx is not None and ctx.verify_mode == ssl.CERT_NONE
    assert "TLS verification" in caplog.text
    quoted = text.replace("insecure-skip-tls-verify: true", 'insecure-skip-tls-verify: "true"')
    strict = load_config(_write(tmp_path / "k2", quoted)).ssl_context()
    assert strict is not None and strict.verify_mode == ssl.CERT_REQUIRED  # a string is not an explicit true


def _plugin(tmp_path: Path, api_version: str, lifetime_s: float | None) -> Path:
    counter = tmp_path / "runs"
    script = tmp_path / "plugin.py"
    script.write_text(f"""
import datetime, json, os, pathlib
counter = pathlib.Path({str(counter)!r})
n = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(n))
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
status = {{"token": "exec-" + str(n) + "-" + os.environ["PLUGIN_ENV"] + "-" + info["kind"]}}
lifetime = {lifetime_s!r}
if lifetime is not None:
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=lifetime)
    status["expirationTimestamp"] = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({{"apiVersion": {api_version!r}, "kind": "ExecCredential", "status": status}}))
""")
    return script


def _exec_kubeconfig(tmp_path: Path, server: str, script: Path, api_version: str) -> Path:
    return _write(tmp_path / "kubeconfig", f"""apiVersion: v1
kind: Config
current-context: x
clusters:
- name: c
  cluster:
    server: {server}
contexts:
- name: x
  context:
    cluster: c
    user: u
users:
- name: u
  user:
    exec:
      apiVersion: {api_version}
      command: {sys.executable}
      args:
      - {script}
      env:
      - name: PLUGIN_ENV
        value: v
      interactiveMode: Never
""")


@pytest.mark.parametrize("api_version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"])
def test_exec_plugin_token_cached_and_rerun_on_401(tmp_path: Path, replay: ReplayServer, api_version: str) -> None:
    script = _plugin(tmp_path, api_version, lifetime_s=3600)
    client = KubeClient(load_config(_exec_kubeconfig(tmp_path, replay.url, script, api_version)))
    replay.add(_ok_node())
    replay.add(_ok_node())
    client.get(NODES, "n")
    client.get(NODES, "n")
    assert [r.headers["Authorization"] for r in replay.requests] == ["Bearer exec-1-v-ExecCredential"] * 2
    unauthorized = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "Unauthorized",
                               "reason": "Unauthorized", "code": 401}).encode()
    replay.add(Canned("GET", "/api/v1/nodes/n", 401, "Unauthorized", [], unauthorized))
    replay.add(_ok_node())
    client.get(NODES, "n")
    assert replay.requests[-1].headers["Authorization"] == "Bearer exec-2-v-ExecCredential"


def test_exec_plugin_rerun_after_expiry(tmp_path: Path) -> None:
    script = _plugin(tmp_path, "client.authentication.k8s.io/v1", lifetime_s=-5)  # already expired
    config = load_config(_exec_kubeconfig(tmp_path, "http://127.0.0.1:1", script, "client.authentication.k8s.io/v1"))
    assert config.authorization() == "Bearer exec-1-v-ExecCredential"
    assert config.authorization() == "Bearer exec-2-v-ExecCredential"


def test_exec_plugin_failure_is_a_clear_error(tmp_path: Path) -> None:
    script = _write(tmp_path / "fail.py", "import sys\nsys.stderr.write('no creds for you')\nsys.exit(3)\n")
    config = load_config(_exec_kubeconfig(tmp_path, "http://127.0.0.1:1", script, "client.authentication.k8s.io/v1"))
    with pytest.raises(errors.ConfigError, match="exited 3: no creds for you"):
        config.authorization()


def test_exec_plugin_api_version_must_be_known(tmp_path: Path) -> None:
    script = _plugin(tmp_path, "client.authentication.k8s.io/v1alpha1", None)
    path = _exec_kubeconfig(tmp_path, "http://127.0.0.1:1", script, "client.authentication.k8s.io/v1alpha1")
    with pytest.raises(errors.ConfigError, match="v1alpha1"):
        load_config(path)


def test_token_file_reread_on_change_and_after_401(tmp_path: Path, replay: ReplayServer) -> None:
    token_file = _write(tmp_path / "token", "one\n")
    client = KubeClient(ClusterConfig(server=replay.url, token_source=FileToken(token_file)))
    replay.add(_ok_node())
    client.get(NODES, "n")
    token_file.write_text("two\n")
    os.utime(token_file, ns=(time.time_ns(), time.time_ns() + 10**9))  # make sure the mtime moves
    replay.add(_ok_node())
    client.get(NODES, "n")
    stamp = token_file.stat().st_mtime_ns
    token_file.write_text("three\n")
    os.utime(token_file, ns=(stamp, stamp))  # rotated, but the mtime looks unchanged: only a 401 reveals it
    unauthorized = b'{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Unauthorized","code":401}'
    replay.add(Canned("GET", "/api/v1/nodes/n", 401, "Unauthorized", [], unauthorized))
    replay.add(_ok_node())
    client.get(NODES, "n")
    seen = [r.headers["Authorization"] for r in replay.requests]
    assert seen == ["Bearer one", "Bearer two", "Bearer two", "Bearer three"]


def test_in_cluster_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "token", "sa-token")
    _write(tmp_path / "namespace", "gpu-system")
    _write(tmp_path / "ca.crt", "")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    config = in_cluster_config(tmp_path)
    assert config.server == "https://[fd00::1]:443"
    assert (config.namespace, config.ca_file) == ("gpu-system", str(tmp_path / "ca.crt"))
    assert config.authorization() == "Bearer sa-token"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(errors.ConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster_config(tmp_path)


def test_tls_verified_with_ca_file_and_client_cert_data(tmp_path: Path, tls_material: dict[str, Path]) -> None:
    server = ReplayServer().start()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tls_material["server_cert"], tls_material["server_key"])
    ctx.load_verify_locations(tls_material["client_cert"])
    ctx.verify_mode = ssl.CERT_REQUIRED  # the server insists on our client certificate
    server._server.socket = ctx.wrap_socket(server._server.socket, server_side=True)
    try:
        url = server.url.replace("http://", "https://")
        config = ClusterConfig(
            server=url,
            ca_file=str(tls_material["server_cert"]),
            client_cert_data=tls_material["client_cert"].read_bytes(),
            client_key_data=tls_material["client_key"].read_bytes(),
        )
        server.add(_ok_node())
        assert KubeClient(config).get(NODES, "n")["metadata"]["name"] == "n"
        untrusted = ClusterConfig(server=url)  # the system CAs do not know our self-signed server
        with pytest.raises(errors.TransportError, match="CERTIFICATE_VERIFY_FAILED"):
            KubeClient(untrusted, max_retries=0).get(NODES, "n")
    finally:
        server.stop()


def test_kubeconfig_config_requires_a_context(tmp_path: Path) -> None:
    path = _write(tmp_path / "k", "clusters: []\nusers: []\ncontexts: []\n")
    with pytest.raises(errors.ConfigError, match="no current-context"):
        kubeconfig_config([path])


def test_tls_server_name_is_the_name_the_certificate_is_checked_for(tls_material: dict[str, Path]) -> None:
    """The kubeconfig's tls-server-name: reach the server by one name, verify its certificate for another."""
    server = ReplayServer().start()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tls_material["server_cert"], tls_material["server_key"])  # names only IP 127.0.0.1
    server._server.socket = ctx.wrap_socket(server._server.socket, server_side=True)
    try:
        url = server.url.replace("http://127.0.0.1", "https://localhost")
        server.add(_ok_node())
        by_host = ClusterConfig(server=url, ca_file=str(tls_material["server_cert"]))
        with pytest.raises(errors.TransportError, match=r"CERTIFICATE_VERIFY_FAILED|match"):
            KubeClient(by_host, max_retries=0).get(NODES, "n")
        named = ClusterConfig(server=url, ca_file=str(tls_material["server_cert"]), tls_server_name="127.0.0.1")
        assert KubeClient(named).get(NODES, "n")["metadata"]["name"] == "n"
    finally:
        server.stop()


# ---- hostile kubeconfigs: a clear ConfigError, never another exception -----------------------------------

def _kubeconfig_values() -> Any:
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5),
                        st.text(alphabet="abcxu:/.-_ 0123456789", max_size=6),
                        st.sampled_from(["c", "u", "x", "http://x", "https://h:1", "ftp://x", "!!!", "/nope"]))
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["name", "cluster", "user", "context", "server", "token", "tokenFile",
                                         "certificate-authority", "certificate-authority-data", "exec",
                                         "command", "client-certificate-data", "insecure-skip-tls-verify"]),
                        inner, max_size=4)), max_leaves=12)


def _kubeconfig_documents() -> Any:
    from hypothesis import strategies as st

    return st.fixed_dictionaries({}, optional={
        "clusters": _kubeconfig_values(), "contexts": _kubeconfig_values(), "users": _kubeconfig_values(),
        "current-context": _kubeconfig_values()})


def test_fuzzed_kubeconfigs_are_a_config_error_or_a_config(tmp_path: Path) -> None:
    from hypothesis import HealthCheck, given, settings

    path = tmp_path / "kubeconfig"

    @settings(max_examples=300, derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(doc=_kubeconfig_documents())
    def check(doc: dict[str, Any]) -> None:
        path.write_text(json.dumps(doc))
        try:
            load_config(str(path))
        except errors.ConfigError as exc:
            assert str(exc) and "\n" not in str(exc).strip()

    check()
