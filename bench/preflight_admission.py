"""Admission latency of the preflight webhook (issue 46): pod creations at a steady rate through the API emulator,
which calls the controller's webhook server (``gpuremediate.webhook.server``, HTTPS with a test certificate made by
openssl) from the kustomize component's MutatingWebhookConfiguration, as kube-apiserver would.

    .venv/bin/python bench/preflight_admission.py                  # 100 creations/s for 10 s
    .venv/bin/python bench/preflight_admission.py --rate 200 --seconds 20

Printed: P50 / P99 / max of (a) the webhook call as the emulator times it (connect, TLS handshake, the review, the
answer: what kube-apiserver adds to a pod's create, bounded by timeoutSeconds = 3), (b) the whole pod create seen
by the client, with the webhook, and (c) without any webhook (the baseline, the same rate). Everything runs in one
process on this machine: the figures include its CPU contention (the emulator, the webhook and the client).
"""

from __future__ import annotations

import argparse
import base64
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuremediate.kube import miniyaml  # noqa: E402
from gpuremediate.kube.client import KubeClient  # noqa: E402
from gpuremediate.kube.config import load_config  # noqa: E402
from gpuremediate.kube.resources import NAMESPACES, PODS, Resource  # noqa: E402
from gpuremediate.webhook.mutate import Settings  # noqa: E402
from gpuremediate.webhook.server import CertificateFiles, WebhookServer  # noqa: E402
from sim.kubeapi import KubeAPIServer  # noqa: E402

CONFIGS = Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                   "MutatingWebhookConfiguration", False)
SERVICE = "gpuremediate-preflight.gpuremediate-system.svc"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def line(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (f"{name:<34} n={len(ms):5d}  P50 {percentile(ms, 0.50):7.2f} ms  P99 {percentile(ms, 0.99):7.2f} ms  "
            f"max {max(ms):7.2f} ms")


def drive(client: KubeClient, namespace: str, rate: float, seconds: float) -> tuple[list[float], int]:
    """Open loop: a create every 1/rate s whatever the answers' pace; each create's latency."""
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()

    def create(i: int) -> None:
        nonlocal errors
        pod = {"metadata": {"name": f"p-{i}"},
               "spec": {"containers": [{"name": "train", "image": "trainer:1",
                                        "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
        started = time.perf_counter()
        try:
            client.create(PODS, pod, namespace)
        except Exception:  # counted, not raised: the bench reports them
            with lock:
                errors += 1
            return
        with lock:
            latencies.append(time.perf_counter() - started)

    total = int(rate * seconds)
    begin = time.perf_counter()
    with ThreadPoolExecutor(max_workers=32) as pool:
        for i in range(total):
            delay = begin + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(create, i)
    return latencies, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100.0, help="pod creations a second (default 100)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long (default 10)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-preflight-"))
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={SERVICE}",
                    "-addext", f"subjectAltName=DNS:{SERVICE}", "-keyout", str(tmp / "tls.key"),
                    "-out", str(tmp / "tls.crt")], check=True, capture_output=True)
    api = KubeAPIServer(watch_history=100_000).start()
    webhook = WebhookServer(lambda: Settings(image="gpuremediate:bench"),
                            CertificateFiles(str(tmp / "tls.crt"), str(tmp / "tls.key")), "127.0.0.1", 0).start()
    api.webhooks.routes["gpuremediate-system/gpuremediate-preflight:443"] = f"127.0.0.1:{webhook.port}"
    client = KubeClient(load_config(api.write_kubeconfig(tmp / "kubeconfig")))
    try:
        for ns, labels in (("baseline", {}), ("train", {"gpuremediate.io/preflight": "enabled"})):
            client.create(NAMESPACES, {"metadata": {"name": ns, "labels": labels}})
        config: dict[str, Any] = miniyaml.loads(
            (ROOT / "manifests/components/preflight/mutatingwebhookconfiguration.yaml").read_text())
        config["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode((tmp / "tls.crt").read_bytes()).decode()
        client.create(CONFIGS, config)
        time.sleep(1.0)  # the namespaces' default ServiceAccounts
        print(f"{args.rate:g} pod creations/s for {args.seconds:g} s each; emulator + webhook + client in one process")
        base, base_errors = drive(client, "baseline", args.rate, args.seconds)
        print(line("create, no webhook (baseline)", base) + f"  errors {base_errors}")
        api.webhooks.calls.clear()
        hooked, hooked_errors = drive(client, "train", args.rate, args.seconds)
        print(line("create, through the webhook", hooked) + f"  errors {hooked_errors}")
        calls = [seconds for _, outcome, seconds in api.webhooks.calls]
        outcomes = sorted({outcome for _, outcome, _ in api.webhooks.calls})
        print(line("webhook call (emulator-timed)", calls) + f"  outcomes {outcomes}")
    finally:
        client.close()
        webhook.stop()
        api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
