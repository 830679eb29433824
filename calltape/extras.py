"""One sentence for a missing optional dependency, the same for every extra.

calltape keeps its framework integrations and the webhook server behind pip extras. When one is
missing, the user should read which feature needs it and the exact install line, not a bare
``ModuleNotFoundError`` from deep inside an import. Everything that imports an optional dependency
(the CLI, the server, the adapters) builds that sentence here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

from calltape.errors import MissingExtra

EXTRAS: Final[dict[str, str]] = {
    "pipecat": "the Pipecat adapter",
    "livekit": "the LiveKit Agents adapter",
    "realtime": "the OpenAI Realtime adapter",
    "serve": "the webhook receiver (calltape serve)",
    "ultravox": "fetching Ultravox call messages (calltape serve's /ultravox with an API key)",
    "otel": "OpenTelemetry export",
}
"""Each pip extra and what it enables."""


def missing_extra(extra: str, feature: str | None = None, exc: ImportError | None = None) -> MissingExtra:
    """The error to raise when ``exc`` shows that an optional dependency of ``extra`` is absent."""
    module = (exc.name or None) if exc is not None else None
    if module is not None:
        module = module.split(".")[0]
    return MissingExtra(extra, feature or EXTRAS.get(extra, f"calltape's {extra} support"), module)


@contextlib.contextmanager
def requires_extra(extra: str, feature: str | None = None) -> Iterator[None]:
    """Wrap the imports of an optional dependency: a missing third-party module becomes
    :class:`MissingExtra`; an import error inside calltape itself stays what it is (a bug)."""
    try:
        yield
    except ImportError as exc:
        if isinstance(exc, MissingExtra) or (exc.name or "").split(".")[0] == "calltape":
            raise
        raise missing_extra(extra, feature, exc) from exc
