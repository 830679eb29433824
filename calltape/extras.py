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

from calltape.errors import CalltapeError

EXTRAS: Final[dict[str, str]] = {
    "pipecat": "the Pipecat adapter",
    "livekit": "the LiveKit Agents adapter",
    "realtime": "the OpenAI Realtime adapter",
    "serve": "the webhook receiver (calltape serve)",
    "otel": "OpenTelemetry export",
}
"""Each pip extra and what it enables."""


class MissingExtra(CalltapeError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""

    def __init__(self, extra: str, feature: str | None = None, module: str | None = None) -> None:
        self.extra = extra
        self.feature = feature or EXTRAS.get(extra, f"calltape's {extra} support")
        self.module = module
        missing = f" ({module} is not installed)" if module else ""
        super().__init__(
            f"{self.feature} needs the '{extra}' extra{missing}: pip install 'calltape[{extra}]'",
            name=module,
        )


def missing_extra(extra: str, feature: str | None = None, exc: ImportError | None = None) -> MissingExtra:
    """The error to raise when ``exc`` shows that an optional dependency of ``extra`` is absent."""
    module = (exc.name or None) if exc is not None else None
    if module is not None:
        module = module.split(".")[0]
    return MissingExtra(extra, feature, module)


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
