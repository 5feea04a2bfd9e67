"""Structured logging: one line per record, text or JSON, with key=value context."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

_RESERVED = set(vars(logging.makeLogRecord({})))


def _context(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(_context(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, sort_keys=False)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        ctx = " ".join(f"{k}={v}" for k, v in _context(record).items())
        line = f"{stamp} {record.levelname:<7} {record.getMessage()}" + (f"  {ctx}" if ctx else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def add_log_flags(p: argparse.ArgumentParser) -> None:
    """``--log-format`` and ``--log-level``, the same on every long-running command (run, agent, plugins)."""
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="text for people, json (one object a line) for log collectors")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                   help="the least severe log lines written")


def setup_logging(fmt: str = "text", level: str = "info", stream: Any = None) -> None:
    if fmt not in ("text", "json"):
        raise ValueError(f"--log-format: expected text or json, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
