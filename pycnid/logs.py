"""JSON-lines logging to stderr (journald keeps it; `jq` reads it)."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonLines(logging.Formatter):
    _second = -1
    _stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": f"{self.render_second(int(record.created))}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}) or {})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)

    def render_second(self, second: int) -> str:
        """UTC 'YYYY-mm-ddTHH:MM:SS', formatted once a second (one line a request)."""
        if second != self._second:
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return self._stamp


def setup_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
