"""gpu-sim: exposition as dcgm-exporter writes it, fault semantics, HTTP API, down modes, CLI, scenarios."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import gpusim
from sim.gpusim import GpuSim, SimError

DATA = Path("/work/shared/data/dcgm-exporter")
SERIES = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\} (\S+)$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"')


def parse(text: str) -> dict[str, list[tuple[dict[str, str], str]]]:
    """Tiny test-side reader: metric name -> [(labels, raw value)]; checks HELP/TYPE precede series."""
    out: dict[str, list[tuple[dict[str, str], str]]] = {}
    declared: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            declared.add(line.split()[2])
        if not line or line.startswith("#"):
            continue
        m = SERIES.match(line)
        assert m, f"not a series line: {line!r}"
        assert m.group(1) in declared, f"{m.group(1)} has no TYPE line before it"
        out.setdefault(m.group(1), []).append((dict(LABEL.findall(m.group(2))), m.group(3)))
    return out


def value(text: str, metric: str, gpu: int) -> str | None:
    for labels, v in parse(text).get(metric, []):
        if labels["gpu"] == str(gpu):
            return v
    return None


def get(url: str, timeout: float = 3.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post(url: str, body: object) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=3) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def sim() -> Iterator[GpuSim]:
    s = GpuSim(port=0)
    s.add_node("gpu-node-1", gpus=8, ip="127.0.0.11")
    s.add_node("gpu-node-2", gpus=2, ip="127.0.0.12")
    s.start()
    yield s
    s.stop()


def base(s: GpuSim, node: str) -> str:
    return s.url_for(node).removesuffix("/metrics")


# ------------------------------------------------------------------ format


def test_exposition_matches_real_exporter_shape(sim: GpuSim) -> None:
    status, text = get(sim.url_for("gpu-node-1"))
    assert status == 200
    series = parse(text)
    real = parse((DATA / "scrape-L4-default.prom").read_text())
    real_keys = list(real["DCGM_FI_DEV_GPU_TEMP"][0][0])
    for labels, _ in series["DCGM_FI_DEV_GPU_TEMP"]:
        assert list(labels) == real_keys  # same label names, same order as a real scrape
    assert [lb["gpu"] for lb, _ in series["DCGM_FI_DEV_GPU_TEMP"]] == [str(i) for i in range(8)]
    assert {lb["Hostname"] for lb, _ in series["DCGM_FI_DEV_SM_CLOCK"]} == {"gpu-node-1"}
    assert {lb["device"] for lb, _ in series["DCGM_FI_DEV_SM_CLOCK"]} == {f"nvidia{i}" for i in range(8)}
    assert len({lb["UUID"] for lb, _ in series["DCGM_FI_DEV_SM_CLOCK"]}) == 8
    assert re.fullmatch(r"\d+\.\d{6}", series["DCGM_FI_DEV_POWER_USAGE"][0][1])
    assert re.fullmatch(r"\d+", series["DCGM_FI_DEV_GPU_TEMP"][0][1])
    for name in ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING",
                 "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_MEMORY_TEMP"):
        assert len(series[name]) == 8, name


def test_help_and_type_lines_equal_the_real_exporter() -> None:
    real = (DATA / "scrape-L4-default.prom").read_text() + (DATA / "scrape-A100-vgpu-xid-labels.prom").read_text()
    real_meta = {ln for ln in real.splitlines() if ln.startswith(("# HELP", "# TYPE"))}
    node = gpusim.new_node("n", 1, "127.0.0.1")
    node.gpus[0].xid = 13
    ours = {ln for ln in gpusim.render(node).splitlines() if ln.startswith(("# HELP", "# TYPE"))}
    shared = {ln.split()[2] for ln in real_meta} & {ln.split()[2] for ln in ours}
    assert len(shared) >= 15
    for ln in ours:
        if ln.split()[2] in shared:
            assert ln in real_meta, f"differs from the real exporter: {ln!r}"


def test_xid_series_absent_until_first_xid_then_labelled(sim: GpuSim) -> None:
    _, text = get(sim.url_for("gpu-node-1"))
    assert "DCGM_FI_DEV_XID_ERRORS" not in text
    sim.inject_xid("gpu-node-1", 3, 79)
    _, text = get(sim.url_for("gpu-node-1"))
    xid = parse(text)["DCGM_FI_DEV_XID_ERRORS"]
    assert len(xid) == 1
    labels, v = xid[0]
    assert (labels["gpu"], labels["err_code"], labels["err_msg"], v) == ("3", "79", "GPU has fallen off the bus", "79")
    _, other = get(sim.url_for("gpu-node-2"))
    assert "DCGM_FI_DEV_XID_ERRORS" not in other


def test_nodes_share_a_port_on_their_own_ip(sim: GpuSim) -> None:
    u1, u2 = sim.url_for("gpu-node-1"), sim.url_for("gpu-node-2")
    assert u1.startswith("http://127.0.0.11:") and u2.startswith("http://127.0.0.12:")
    assert u1.split(":")[2] == u2.split(":")[2]
    _, text = get(u2)
    assert {lb["Hostname"] for lb, _ in parse(text)["DCGM_FI_DEV_GPU_TEMP"]} == {"gpu-node-2"}
    assert len(parse(text)["DCGM_FI_DEV_GPU_TEMP"]) == 2


def test_a_node_added_after_start_is_served(sim: GpuSim) -> None:
    sim.add_node("late", gpus=1, ip="127.0.0.13")
    status, text = get(sim.url_for("late"))
    assert status == 200 and 'Hostname="late"' in text


def test_newest_exporter_hostname_label(sim: GpuSim) -> None:
    sim.set_hostname_label("gpu-node-2", "hostname")
    _, text = get(sim.url_for("gpu-node-2"))
    assert 'hostname="gpu-node-2"' in text and "Hostname=" not in text


def test_pod_attribution_labels(sim: GpuSim) -> None:
    sim.set_pod("gpu-node-2", 1, "ml", "train-0", "trainer")
    _, text = get(sim.url_for("gpu-node-2"))
    labels = next(lb for lb, _ in parse(text)["DCGM_FI_DEV_GPU_TEMP"] if lb["gpu"] == "1")
    assert (labels["namespace"], labels["pod"], labels["container"]) == ("ml", "train-0", "trainer")


# ------------------------------------------------------------------ fault semantics


def test_reset_clears_volatile_state_but_not_persistent(sim: GpuSim) -> None:
    n = "gpu-node-1"
    sim.inject_xid(n, 2, 48)
    sim.inject_dbe(n, 2, count=3)
    sim.inject_row_remap_pending(n, 2)
    sim.inject_row_remap_failure(n, 2)
    sim.inject(n, 2, "uncorrectable-rows", 2)
    text = sim.metrics(n)
    assert value(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 2) == "3"
    assert value(text, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 2) == "3"
    assert value(text, "DCGM_FI_DEV_ROW_REMAP_PENDING", 2) == "1"
    assert value(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1) == "0"
    sim.reset_gpu(n, 2)
    text = sim.metrics(n)
    assert value(text, "DCGM_FI_DEV_XID_ERRORS", 2) is None
    assert value(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 2) == "0"
    assert value(text, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 2) == "3"
    assert value(text, "DCGM_FI_DEV_ROW_REMAP_PENDING", 2) == "0"
    assert value(text, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 2) == "1"
    assert value(text, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 2) == "2"


def test_temperatures(sim: GpuSim) -> None:
    sim.set_temp("gpu-node-1", 0, 92)
    sim.set_memory_temp("gpu-node-1", 0, 101.4)
    text = sim.metrics("gpu-node-1")
    assert value(text, "DCGM_FI_DEV_GPU_TEMP", 0) == "92"
    assert value(text, "DCGM_FI_DEV_MEMORY_TEMP", 0) == "101"
    sim.reset_gpu("gpu-node-1", 0)  # a reset does not cool a GPU
    assert value(sim.metrics("gpu-node-1"), "DCGM_FI_DEV_GPU_TEMP", 0) == "92"


def test_reboot_resets_every_gpu_and_exporter_restart_only_forgets_xids(sim: GpuSim) -> None:
    n = "gpu-node-1"
    for g in (0, 5):
        sim.inject_xid(n, g, 79)
        sim.inject_dbe(n, g)
    sim.restart_exporter(n)
    text = sim.metrics(n)
    assert "DCGM_FI_DEV_XID_ERRORS" not in text
    assert value(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 5) == "1"
    sim.inject_xid(n, 5, 79)
    sim.reboot(n)
    text = sim.metrics(n)
    assert "DCGM_FI_DEV_XID_ERRORS" not in text
    assert value(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0) == "0"
    assert value(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 5) == "0"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.inject("nope", 0, "xid", 79), "unknown node 'nope'"),
        (lambda s: s.inject("gpu-node-2", 2, "xid", 79), "has no GPU 2"),
        (lambda s: s.inject("gpu-node-2", 0, "melt", 1), "unknown fault 'melt'"),
        (lambda s: s.inject("gpu-node-2", 0, "xid", None), "positive XID code"),
        (lambda s: s.inject("gpu-node-2", 0, "temp", 900), "temperature in Celsius"),
        (lambda s: s.inject("gpu-node-2", 0, "dbe", 0), "count must be >= 1"),
        (lambda s: s.set_down("gpu-node-2", "explode"), "unknown down mode"),
        (lambda s: s.add_node("gpu-node-2"), "already exists"),
        (lambda s: s.add_node("x", ip="127.0.0.11"), "already serves"),
    ],
)
def test_bad_requests_name_what_is_wrong(sim: GpuSim, call: object, message: str) -> None:
    with pytest.raises(SimError, match=re.escape(message)):
        call(sim)  # type: ignore[operator]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("xid", "dbe", "failure", "pending", "reset")), st.integers(0, 1)),
                max_size=12))
def test_fault_state_follows_reset_semantics(ops: list[tuple[str, int]]) -> None:
    s = GpuSim()
    s.add_node("n", gpus=2, ip="127.0.0.1")
    model = {g: {"xid": False, "dbe": 0, "agg": 0, "failure": False, "pending": False} for g in (0, 1)}
    for op, g in ops:
        m = model[g]
        if op == "xid":
            s.inject_xid("n", g, 94)
            m["xid"] = True
        elif op == "dbe":
            s.inject_dbe("n", g)
            m["dbe"] += 1
            m["agg"] += 1
        elif op == "failure":
            s.inject_row_remap_failure("n", g)
            m["failure"] = True
        elif op == "pending":
            s.inject_row_remap_pending("n", g)
            m["pending"] = True
        else:
            s.reset_gpu("n", g)
            m.update(xid=False, dbe=0, pending=False)
    text = s.metrics("n")
    for g, m in model.items():
        assert (value(text, "DCGM_FI_DEV_XID_ERRORS", g) == "94") is m["xid"]
        assert value(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", g) == str(m["dbe"])
        assert value(text, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", g) == str(m["agg"])
        assert value(text, "DCGM_FI_DEV_ROW_REMAP_FAILURE", g) == str(int(bool(m["failure"])))
        assert value(text, "DCGM_FI_DEV_ROW_REMAP_PENDING", g) == str(int(bool(m["pending"])))


# ------------------------------------------------------------------ HTTP API


def test_http_inject_reset_reboot(sim: GpuSim) -> None:
    url = base(sim, "gpu-node-2")  # any node's listener takes faults for any node
    assert post(url + "/inject", {"node": "gpu-node-1", "gpu": 4, "fault": "xid", "value": 31}) == (200, {"ok": True})
    assert post(url + "/inject", {"node": "gpu-node-1", "gpu": 4, "fault": "dbe"})[0] == 200
    text = sim.metrics("gpu-node-1")
    assert value(text, "DCGM_FI_DEV_XID_ERRORS", 4) == "31"
    assert value(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 4) == "1"
    assert post(url + "/reset", {"node": "gpu-node-1", "gpu": 4})[0] == 200
    assert value(sim.metrics("gpu-node-1"), "DCGM_FI_DEV_XID_ERRORS", 4) is None
    sim.inject_xid("gpu-node-1", 0, 43)
    assert post(url + "/reboot", {"node": "gpu-node-1"})[0] == 200
    assert "XID_ERRORS" not in sim.metrics("gpu-node-1")


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/inject", {"node": "gpu-node-1", "gpu": "0", "fault": "xid", "value": 79}, "'gpu' must be an integer"),
        ("/inject", {"node": "gpu-node-1", "gpu": 0, "fault": "xid", "value": "79"}, "'value' must be a number"),
        ("/inject", {"gpu": 0, "fault": "xid"}, "'node' must be a non-empty string"),
        ("/reset", {"node": "ghost", "gpu": 0}, "unknown node 'ghost'"),
        ("/inject", [1, 2], "must be a JSON object"),
    ],
)
def test_http_bad_input_is_400_with_reason(sim: GpuSim, path: str, body: object, message: str) -> None:
    status, reply = post(base(sim, "gpu-node-1") + path, body)
    assert status == 400
    assert message in str(reply["error"])


def test_unknown_paths_are_404(sim: GpuSim) -> None:
    assert get(base(sim, "gpu-node-1") + "/nope")[0] == 404
    assert post(base(sim, "gpu-node-1") + "/explode", {})[0] == 404
    assert get(base(sim, "gpu-node-1") + "/health") == (200, "OK\n")


# ------------------------------------------------------------------ exporter down


def test_down_refuse_then_up(sim: GpuSim) -> None:
    sim.set_down("gpu-node-2", "refuse")
    with pytest.raises(urllib.error.URLError) as info:
        get(sim.url_for("gpu-node-2"))
    assert isinstance(info.value.reason, ConnectionRefusedError)
    assert get(sim.url_for("gpu-node-1"))[0] == 200  # other nodes unaffected
    post(base(sim, "gpu-node-1") + "/down", {"node": "gpu-node-2", "mode": None})
    assert get(sim.url_for("gpu-node-2"))[0] == 200


def test_down_refuse_closes_kept_alive_connections(sim: GpuSim) -> None:
    """A keep-alive scraper must not go on getting 200s on the connection it opened before the exporter went
    down: its connection is closed, and reconnecting is refused."""
    import http.client

    state = sim.node("gpu-node-2")
    conn = http.client.HTTPConnection(state.ip, sim.port, timeout=3)
    try:
        conn.request("GET", "/metrics")
        first = conn.getresponse()
        first.read()
        assert first.status == 200 and not first.will_close
        sim.set_down("gpu-node-2", "refuse")
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError, http.client.BadStatusLine)):
            conn.request("GET", "/metrics")
            conn.getresponse().read()
        conn.close()
        with pytest.raises(ConnectionRefusedError):
            conn.request("GET", "/metrics")  # http.client reconnects: refused, as no listener is left
    finally:
        conn.close()


def test_down_500(sim: GpuSim) -> None:
    sim.set_down("gpu-node-1", "500")
    status, body = get(sim.url_for("gpu-node-1"))
    assert status == 500 and "error" in body


def test_down_hang_blocks_until_up(sim: GpuSim) -> None:
    sim.set_down("gpu-node-1", "hang")
    with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
        get(sim.url_for("gpu-node-1"), timeout=0.3)
    sim.set_down("gpu-node-1", None)
    assert get(sim.url_for("gpu-node-1"))[0] == 200


def test_slow_and_oversized(sim: GpuSim) -> None:
    sim.set_delay("gpu-node-2", 0.4)
    with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
        get(sim.url_for("gpu-node-2"), timeout=0.1)
    sim.set_delay("gpu-node-2", 0)
    sim.set_padding("gpu-node-2", 200_000)
    status, text = get(sim.url_for("gpu-node-2"))
    assert status == 200 and len(text) > 200_000
    assert len(parse(text)["DCGM_FI_DEV_GPU_TEMP"]) == 2  # still valid exposition


# ------------------------------------------------------------------ CLI and scenarios


def test_cli_inject_against_running_sim(sim: GpuSim, capsys: pytest.CaptureFixture[str]) -> None:
    url = base(sim, "gpu-node-1")
    rc = gpusim.main(["inject", "--url", url, "--node", "gpu-node-2", "--gpu", "1", "--fault", "xid", "--value", "79"])
    assert rc == 0
    assert value(sim.metrics("gpu-node-2"), "DCGM_FI_DEV_XID_ERRORS", 1) == "79"
    assert gpusim.main(["reset", "--url", url, "--node", "gpu-node-2", "--gpu", "1"]) == 0
    assert value(sim.metrics("gpu-node-2"), "DCGM_FI_DEV_XID_ERRORS", 1) is None
    assert gpusim.main(["down", "--url", url, "--node", "gpu-node-2", "--mode", "500"]) == 0
    assert get(sim.url_for("gpu-node-2"))[0] == 500
    assert gpusim.main(["inject", "--url", url, "--node", "gpu-node-2", "--gpu", "7", "--fault", "dbe"]) == 1
    assert "has no GPU 7" in capsys.readouterr().err


def test_cli_unreachable_sim_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = gpusim.main(["reboot", "--url", f"http://127.0.0.1:{port}", "--node", "n"])
    assert rc == 1 and "cannot reach" in capsys.readouterr().err


def test_daemonset_mode_takes_node_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "worker-7")
    args = gpusim.build_parser().parse_args(["--port", "0", "--host", "127.0.0.1", "--gpus", "4"])
    s = gpusim.sim_from_args(args).start()
    try:
        assert s.nodes() == ["worker-7"]
        _, text = get(s.url_for("worker-7"))
        assert len(parse(text)["DCGM_FI_DEV_GPU_TEMP"]) == 4
    finally:
        s.stop()
    monkeypatch.delenv("NODE_NAME")
    with pytest.raises(SimError, match="no node name"):
        gpusim.sim_from_args(gpusim.build_parser().parse_args(["--port", "0"]))


def test_control_port_reaches_a_refusing_node() -> None:
    s = GpuSim(port=0, host="127.0.0.1", control_port=0)
    s.add_node("only")
    with s:
        s.set_down("only", "refuse")
        assert s.control_url is not None
        assert post(s.control_url + "/down", {"node": "only", "mode": None})[0] == 200
        assert get(s.url_for("only"))[0] == 200
        assert get(s.control_url + "/metrics")[0] == 404


def test_scenario_plays_in_order(sim: GpuSim, tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps([
        {"at": 0.15, "node": "gpu-node-1", "gpu": 0, "fault": "reset"},
        {"at": 0, "node": "gpu-node-1", "gpu": 0, "fault": "xid", "value": 79},
        {"at": 0, "node": "gpu-node-2", "fault": "down", "mode": "500"},
    ]))
    sim.run_scenario(gpusim.load_scenario(str(path)))
    deadline = time.monotonic() + 2
    while value(sim.metrics("gpu-node-1"), "DCGM_FI_DEV_XID_ERRORS", 0) != "79":
        assert time.monotonic() < deadline, "xid never injected"
        time.sleep(0.01)
    assert get(sim.url_for("gpu-node-2"))[0] == 500
    while value(sim.metrics("gpu-node-1"), "DCGM_FI_DEV_XID_ERRORS", 0) is not None:
        assert time.monotonic() < deadline, "reset never applied"
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"at": 0}, "JSON list"),
        ([{"at": -1, "node": "n", "fault": "xid"}], "'at' must be seconds"),
        ([{"at": 0, "node": "", "fault": "xid"}], "'node' must be"),
        ([{"at": 0, "node": "n", "fault": "boom"}], "'fault' must be one of"),
        ([{"at": 0, "node": "n", "fault": "xid", "gpu": True}], "'gpu' must be an integer"),
        ([{"at": 0, "node": "n", "fault": "xid", "colour": 1}], "unknown keys ['colour']"),
    ],
)
def test_scenario_validation(data: object, message: str) -> None:
    with pytest.raises(SimError, match=re.escape(message)):
        gpusim.parse_scenario(data)


def test_standalone_script_as_in_the_image(tmp_path: Path) -> None:
    """``python gpusim.py`` alone (the Dockerfile copies only this file): NODE_NAME, a scenario, SIGTERM."""
    script = tmp_path / "gpusim.py"
    script.write_text(Path(gpusim.__file__).read_text())
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps([{"at": 0, "node": "worker-3", "gpu": 1, "fault": "xid", "value": 79}]))
    env = {**os.environ, "NODE_NAME": "worker-3", "PYTHONPATH": ""}
    proc = subprocess.Popen(
        [sys.executable, str(script), "--port", "0", "--host", "127.0.0.1", "--gpus", "2", "--scenario", str(scenario)],
        stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("gpu-sim: worker-3 on http://127.0.0.1:"), line
        url = line.split(" on ", 1)[1].strip()
        deadline = time.monotonic() + 3
        while value(get(url)[1], "DCGM_FI_DEV_XID_ERRORS", 1) != "79":
            assert time.monotonic() < deadline, "scenario not applied"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0


def test_down_refuse_posted_to_the_node_itself_is_answered(sim: GpuSim) -> None:
    assert post(base(sim, "gpu-node-2") + "/down", {"node": "gpu-node-2", "mode": "refuse"}) == (200, {"ok": True})
    with pytest.raises(urllib.error.URLError):
        get(sim.url_for("gpu-node-2"))


def _image_layout(root: Path) -> Path:
    """/app as sim/Dockerfile lays it out: the files its COPY lines name (read from the Dockerfile itself)."""
    repo = Path(gpusim.__file__).parents[1]
    copies = [line.split()[2:] for line in (repo / "sim" / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ")]
    for words in copies:
        sources, target = words[:-1], words[-1]
        for source in sources:
            dest = root / target.removeprefix("/app/") / Path(source).name if target.endswith("/") \
                else root / target.removeprefix("/app/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text((repo / source).read_text())
    return root / "gpusim.py"


def test_the_image_layout_plays_nics(tmp_path: Path) -> None:
    """``--nics`` in the image: sim/nic_sysfs.py is shipped beside gpusim.py, and the node's sysfs tree is written."""
    app = tmp_path / "app"
    script = _image_layout(app)
    files = tmp_path / "host"
    env = {**os.environ, "NODE_NAME": "worker-3", "PYTHONPATH": ""}
    proc = subprocess.Popen(
        [sys.executable, "-S", str(script), "--port", "0", "--host", "127.0.0.1", "--gpus", "2", "--nics",
         "--files-dir", str(files)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("gpu-sim: worker-3 on "), (line, proc.stderr.read() if proc.poll() else "")
        ports = sorted(p.relative_to(files) for p in (files / "sys" / "class" / "infiniband").glob("*/ports/1/state"))
        assert len(ports) == 2
        assert (files / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "state").read_text().strip() \
            == "4: ACTIVE"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
