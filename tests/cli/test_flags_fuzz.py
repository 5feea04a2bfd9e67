"""Start-time flags: a bad value is one clear line naming the flag and exit 2, never a traceback, and a value
that is accepted is harmless (every duration finite, above 0 and short enough for a thread to wait on)."""

from __future__ import annotations

import argparse
import math
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuremediate import cli
from gpuremediate.config import Settings, SettingsError
from gpuremediate.kube.errors import KubeError
from gpuremediate.policy.config import PolicyError

KUBECONFIG = ("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n"
              "users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n"
              "    user: u\ncurrent-context: x\n")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("flags")
    made = {
        "kubeconfig": KUBECONFIG,
        "binary": None,
        "deep_toml": "x = " + "[" * 2000 + "]" * 2000 + "\n",
        "ca_pem": "not a certificate\n",
        "token": "secret\n",
    }
    paths: dict[str, str] = {}
    for name, text in made.items():
        path = root / name
        if text is None:
            path.write_bytes(bytes(range(256)) * 4)
        else:
            path.write_text(text)
        paths[name] = str(path)
    return paths


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``cli.main`` up to the point where the controller would start (the whole of start-time checking)."""
    parser = cli.build_parser()
    try:
        args = parser.parse_args(["run", *argv])
    except SystemExit as exc:  # argparse's own usage error
        return int(exc.code or 0), capsys.readouterr().err
    try:
        settings, _policy, _config = cli.prepare_run(args)
    except (SettingsError, PolicyError, KubeError) as exc:
        return 2, f"gpuremediate run: {exc}\n"
    _assert_harmless(settings)
    return 0, ""


def _assert_harmless(settings: Settings) -> None:
    for name in ("scrape_timeout_s", "scrape_interval_s", "resync_s", "lease_duration_s", "renew_deadline_s",
                 "retry_period_s"):
        value = getattr(settings, name)
        assert math.isfinite(value) and 0 < value < threading.TIMEOUT_MAX / 1000, f"{name} accepted as {value}"


def _one_clear_line(err: str, names: str) -> None:
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("usage:")
             and not line.startswith(" ")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert names in lines[0], f"{names!r} not named in {lines[0]!r}"


@pytest.mark.parametrize(("flags", "named"), [
    (["--scrape-timeout", "0"], "--scrape-timeout: must be above 0"),
    (["--scrape-interval", "1e10"], "--scrape-interval: at most 1d"),
    (["--scrape-interval", "inf"], "--scrape-interval: expected a finite duration"),
    (["--scrape-interval", "nan"], "--scrape-interval: expected a finite duration"),
    (["--resync", "300000d"], "--resync: at most 1d"),
    (["--resync", "nan"], "--resync: expected a finite duration"),
    (["--resync=-1s"], "--resync: must not be negative"),
    (["--gpu-node-selector", "a in ("], "--gpu-node-selector: not a label selector"),
    (["--exporter-selector", "=x"], "--exporter-selector: not a label selector"),
    (["--source", "prometheus", "--prometheus-url", "ftp://x"], "--prometheus-url: expected an http:// or https://"),
    (["--source", "prometheus", "--prometheus-url", "http://x", "--prometheus-token-file", "/nonexistent/token"],
     "--prometheus-token-file: cannot read '/nonexistent/token'"),
    (["--source", "prometheus", "--prometheus-url", "https://x", "--prometheus-ca-file", "/nonexistent/ca"],
     "--prometheus-ca-file: cannot read '/nonexistent/ca'"),
    (["--source", "prometheus", "--prometheus-url", "https://x", "--prometheus-ca-file", "{ca_pem}"],
     "--prometheus-ca-file: not a PEM CA bundle"),
    (["--metrics-addr", "300.1.1.1:8080"], "--metrics-addr: '300.1.1.1' is not an IP address or a host name"),
    (["--metrics-addr", "127.0.0.1:99999"], "--metrics-addr: port out of range"),
    (["--namespace", "Not_A_Namespace"], "--namespace: expected a DNS label"),
    (["--jobs-namespace", "a" * 64], "--jobs-namespace: expected a DNS label"),
    (["--exporter-port", "0"], "--exporter-port: expected 1-65535"),
    (["--exporter-path", "metrics"], "--exporter-path: expected a URL path starting with /"),
    (["--leader-elect-renew-deadline", "20s"], "--leader-elect-lease-duration > --leader-elect-renew-deadline"),
    (["--shards", "0"], "--shards: expected 1 to 256, got 0"),
    (["--shards", "257"], "--shards: expected 1 to 256, got 257"),
    (["--identity", "two words"], "--identity: no whitespace allowed"),
    (["--kubeconfig", "{binary}"], "is not UTF-8 text"),
    (["--policy", "{deep_toml}"], "nested too deeply"),
])
def test_bad_start_flags_are_one_line_naming_the_flag(flags: list[str], named: str, files: dict[str, str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*(f.format(**files) for f in flags)]
    if "--kubeconfig" not in argv:
        argv += ["--kubeconfig", files["kubeconfig"]]
    code = cli.main(["run", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    _one_clear_line(err, named)


def test_good_start_flags_are_accepted(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(["--kubeconfig", files["kubeconfig"], "--scrape-interval", "500ms", "--resync", "1d",
                      "--metrics-addr", "[::1]:0", "--source", "prometheus", "--prometheus-url",
                      "https://prom.example:9090/", "--prometheus-token-file", files["token"]], capsys)
    assert (code, err) == (0, "")


DURATION_TEXT = st.one_of(
    st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e10", "1e400", "300000d", "15s", "500ms", "5m", "2h", "1d",
                     "", "s", "1.5.5s", "0x10", "1_000", "\u0661\u0665s"]),
    st.builds(lambda n, u: f"{n}{u}", st.floats(allow_nan=True, allow_infinity=True),
              st.sampled_from(["", "ms", "s", "m", "h", "d", "w"])),
    st.text(max_size=8),
)
FLAG_VALUES: dict[str, st.SearchStrategy[str]] = {
    "--scrape-timeout": DURATION_TEXT,
    "--scrape-interval": DURATION_TEXT,
    "--resync": DURATION_TEXT,
    "--leader-elect-lease-duration": DURATION_TEXT,
    "--leader-elect-renew-deadline": DURATION_TEXT,
    "--leader-elect-retry-period": DURATION_TEXT,
    "--gpu-node-selector": st.one_of(st.sampled_from(["a in (", "a,,b", "!", "a notin ()", "x=y,z!=w", "k in (a,b)"]),
                                     st.text(max_size=12)),
    "--exporter-selector": st.text(max_size=12),
    "--metrics-addr": st.one_of(st.sampled_from([":8080", "300.1.1.1:8080", "[::1]:80", "host:1", "a:b", ":-1",
                                                 "1.2.3.4:65536", "::1:80"]), st.text(max_size=12)),
    "--exporter-port": st.one_of(st.integers(-10, 70000).map(str), st.text(max_size=4)),
    "--exporter-path": st.text(max_size=8),
    "--namespace": st.text(max_size=10),
    "--lease-name": st.text(max_size=10),
    "--maintenance-group": st.text(max_size=10),
    "--prometheus-url": st.one_of(st.sampled_from(["ftp://x", "http://", "https://h:99999", "http://h:9090",
                                                   "x"]), st.text(max_size=10)),
}


@settings(max_examples=300, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flags=st.dictionaries(st.sampled_from(sorted(FLAG_VALUES)), st.none(), min_size=1, max_size=4).flatmap(
    lambda keys: st.fixed_dictionaries({k: FLAG_VALUES[k] for k in keys})), prometheus=st.booleans())
def test_fuzzed_flags_are_a_clear_error_or_harmless(flags: dict[str, str], prometheus: bool, files: dict[str, str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--kubeconfig", files["kubeconfig"]]
    if prometheus:
        argv += ["--source", "prometheus"]
    for flag, value in flags.items():
        argv.append(f"{flag}={value}")  # '=': a value starting with '-' stays a value
    code, err = _run(argv, capsys)
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert "Traceback" not in err
        last = err.strip().splitlines()[-1] if err.strip() else ""
        assert last.startswith("gpuremediate run: "), (argv, err)


def test_a_start_error_through_main_is_exit_2_not_a_traceback(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    assert cli.main(["run", "--kubeconfig", str(tmp_path / "missing"), "--resync", "nan"]) == 2
    assert capsys.readouterr().err.strip() == "gpuremediate run: --resync: expected a finite duration, got 'nan'"


def test_parse_args_namespace_type() -> None:
    assert isinstance(cli.build_parser().parse_args(["run"]), argparse.Namespace)


@pytest.mark.parametrize(("flags", "message"), [
    (["--prometheus-query-timeout", "0"], "--prometheus-query-timeout"),
    (["--prometheus-query-timeout", "nan"], "--prometheus-query-timeout"),
    (["--prometheus-max-bytes", "10"], "--prometheus-max-bytes: expected 1024 to 4 GiB"),
])
def test_prometheus_limits_are_checked(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--source", "prometheus", "--prometheus-url", "http://prom:9090", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_prometheus_limits_reach_the_settings() -> None:
    args = cli.build_parser().parse_args(["run", "--source", "prometheus", "--prometheus-url", "http://prom:9090",
                                          "--prometheus-query-timeout", "40s", "--prometheus-max-bytes", "2048"])
    settings = cli.settings_from_args(args)
    assert settings.prometheus_query_timeout_s == 40.0 and settings.prometheus_max_bytes == 2048
    default = cli.settings_from_args(cli.build_parser().parse_args(
        ["run", "--source", "prometheus", "--prometheus-url", "http://prom:9090"]))
    assert default.prometheus_query_timeout_s == 0.0  # the source scales its own with the fleet


def test_the_prometheus_source_gets_its_own_query_timeout_not_the_scrape_timeout() -> None:
    from gpuremediate.controller import build_source
    from gpuremediate.signals.sources import PrometheusSource

    settings = Settings(source="prometheus", prometheus_url="http://prom:9090", scrape_timeout_s=5.0,
                        prometheus_max_bytes=4096)
    view = type("View", (), {"gpu_nodes": lambda self: [], "gpu_count": lambda self: 0})()
    source = build_source(settings, None, None, view)  # type: ignore[arg-type]
    assert isinstance(source, PrometheusSource)
    assert source.query_timeout_s is None and source.max_bytes == 4096  # None: it scales with the fleet
    timed = build_source(Settings(source="prometheus", prometheus_url="http://prom:9090",
                                  prometheus_query_timeout_s=40.0), None, None, view)  # type: ignore[arg-type]
    assert isinstance(timed, PrometheusSource) and timed.query_timeout_s == 40.0
