"""Parser defects answer a logged 400, and an error body always encodes."""

from __future__ import annotations

import json
import logging

import pytest

from ninfer.api.errors import ApiError, invalid, unknown_parameter
from ninfer.api.parse_guard import LOGGER, guarded


@guarded
def parser(body: dict[str, object]) -> str:
    if "bad" in body:
        raise invalid("bad", "anticipated")
    return body["name"].upper()  # type: ignore[attr-defined]  # a defect for a non-string name


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_anticipated_errors_pass_through_and_defects_become_a_logged_400() -> None:
    log, seen = logging.getLogger(LOGGER), Records()
    log.addHandler(seen)  # on the guard's own logger: a console setup may stop propagation
    try:
        assert parser({"name": "x"}) == "X"
        with pytest.raises(ApiError) as info:
            parser({"bad": 1})
        assert (info.value.code, info.value.param, info.value.message) == (
            "invalid_request",
            "bad",
            "anticipated",
        )
        assert not seen.records
        with pytest.raises(ApiError) as info:
            parser({"name": 5})
    finally:
        log.removeHandler(seen)
    err = info.value
    assert (err.status, err.code, err.param) == (400, "invalid_request", None)
    assert err.message == "the request could not be parsed (AttributeError)"
    assert isinstance(err.__cause__, AttributeError)
    [record] = seen.records
    assert "parser" in record.getMessage() and record.exc_info is not None


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_an_error_quoting_a_lone_surrogate_still_encodes(dialect: str) -> None:
    body = unknown_parameter("a\ud800b").body_bytes(dialect)  # type: ignore[arg-type]
    decoded = json.loads(body)  # valid JSON: the surrogate went out as an escape
    assert "\\ud800" in body.decode("ascii")
    message = decoded["error"]["message"]
    assert message == "unknown parameter: 'a\\ud800b'"
