"""Request parsing answers a client, never a 5xx: the guard around every protocol's field parser.

The parsers raise field-specific `ApiError`s for every input they anticipate. Any other exception
while reading a client's fields is a parser defect triggered by that client's bytes: it is logged
with its traceback (so the defect is seen and fixed) and answered as a 400 `invalid_request` in
the route's envelope, because the request, not the server's state, is what failed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from ninfer.api.errors import ApiError, invalid

P = ParamSpec("P")
R = TypeVar("R")

LOGGER = "ninfer.api.parse"


def guarded(parse: Callable[P, R]) -> Callable[P, R]:
    """`parse` with every exception but `ApiError` turned into a logged 400."""

    @functools.wraps(parse)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return parse(*args, **kwargs)
        except ApiError:
            raise
        except Exception as exc:
            logging.getLogger(LOGGER).exception("request parser %s failed", parse.__qualname__)
            raise invalid(None, f"the request could not be parsed ({type(exc).__name__})") from exc

    return run
