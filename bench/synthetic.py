"""An 8-GPU dcgm-exporter scrape holding every field of dcp-metrics-included.csv, exporter-style."""

from __future__ import annotations

import random
import re
from pathlib import Path

CSV = Path(__file__).resolve().parent / "data" / "dcp-metrics-included.csv"
# "DCGM_FI_X, type, help", commented out or not: the benchmark wants every field the file names
FIELD_LINE = re.compile(r"^#?\s*(DCGM_FI_[A-Z0-9_]+)\s*,\s*(\w+)\s*,\s*(.*)$")


def fields(path: Path = CSV) -> list[tuple[str, str, str]]:
    """(name, type, help) for every field line, once per field (an enabled line beats a commented one);
    type "label" fields become labels on every series."""
    found: dict[str, tuple[str, str, str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = FIELD_LINE.match(line.strip())
        if match and (match.group(1) not in found or not line.lstrip().startswith("#")):
            found[match.group(1)] = (match.group(1), match.group(2).lower(), match.group(3).strip())
    return list(found.values())


def scrape(gpus: int = 8, seed: int = 7) -> str:
    rng = random.Random(seed)
    all_fields = fields()
    extra_labels = "".join(f',{name}="{name.lower()[8:]}-value"' for name, type_, _ in all_fields if type_ == "label")
    per_gpu = [
        f'gpu="{gpu}",UUID="GPU-{gpu:08x}-aaaa-bbbb-cccc-{rng.getrandbits(48):012x}",'
        f'pci_bus_id="00000000:{0x18 + gpu:02X}:00.0",device="nvidia{gpu}",'
        f'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-17"{extra_labels}'
        for gpu in range(gpus)
    ]
    out = []
    for name, type_, help_ in all_fields:
        if type_ == "label":
            continue
        out.append(f"# HELP {name} {help_}\n# TYPE {name} {type_}\n")
        for labels in per_gpu:
            if name == "DCGM_FI_DEV_XID_ERRORS":
                labels += ',err_code="0",err_msg="No Error"'
            value = str(rng.randrange(0, 10**9)) if type_ == "counter" else f"{rng.uniform(0, 1000):.6f}"
            out.append(f"{name}{{{labels}}} {value}\n")
    return "".join(out)


if __name__ == "__main__":
    print(scrape(), end="")
