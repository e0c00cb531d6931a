"""Operator console logging: `[YYYY-MM-DD HH:MM:SS.mmm] [level] message` on stderr, local time."""

from __future__ import annotations

import logging
import sys
import time

LOGGER_NAME = "ninfer"


class ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        local = time.localtime(record.created)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", local) + f".{int(record.msecs):03d}"
        text = f"[{stamp}] [{record.levelname.lower()}] {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup(level: str = "INFO") -> logging.Logger:
    """Route the ninfer and gunicorn error loggers to one stderr handler with the console format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ConsoleFormatter())
    log = logging.getLogger(LOGGER_NAME)
    log.handlers[:] = [handler]
    log.setLevel(level.upper())
    log.propagate = False
    return log


def logger() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)
