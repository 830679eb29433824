"""Every hosted platform's webhook authentication, in one place: Vapi, Retell, Bland, ElevenLabs, Ultravox.

Each check runs on the raw request before anything is parsed, and answers a plain yes or no: a
missing, malformed or foreign credential (non-ASCII bytes, a truncated digest, an odd encoding) is
"no", never an exception. Comparisons are constant-time over bytes: header values are taken as the
bytes they arrived as (HTTP servers hand them over decoded as Latin-1, which maps bytes 1:1), secrets
as their UTF-8 bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Mapping

__all__ = [
    "ELEVENLABS_TOLERANCE_S",
    "FIVE_MINUTES_MS",
    "sign_elevenlabs",
    "sign_retell",
    "sign_ultravox",
    "verify_bland_signature",
    "verify_elevenlabs_signature",
    "verify_retell_signature",
    "verify_ultravox_signature",
    "verify_vapi_request",
]

FIVE_MINUTES_MS = 5 * 60 * 1000
"""How far a Retell signature's timestamp may be from now."""

_RETELL_SIGNATURE = re.compile(rb"v=(\d{1,15}),d=([0-9a-f]{64})")


def header_bytes(value: str | bytes | None) -> bytes:
    """A header value as the bytes that travelled (Latin-1 is how ASGI servers decode them)."""
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:  # a caller's own str beyond Latin-1: its UTF-8 bytes
        return value.encode("utf-8", "surrogateescape")


def _secret(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


def _same(given: bytes, expected: bytes) -> bool:
    return hmac.compare_digest(given, expected)


def _bytes(body: bytes | str) -> bytes:
    """A body to sign as bytes (a str as UTF-8), as the ``sign_*`` helpers take either."""
    return body.encode() if isinstance(body, str) else body


def _hmac_hex(secret: str, message: bytes) -> str:
    """The hex HMAC-SHA256 of ``message`` under ``secret``: the digest every platform here signs with."""
    return hmac.new(_secret(secret), message, hashlib.sha256).hexdigest()


def _outside(when: float, now: float, tolerance: float) -> bool:
    """Whether a signed timestamp is older than ``tolerance`` or further ahead than the clock skew allows."""
    return when < now - tolerance or when > now + _CLOCK_SKEW_S


def _hex_digest(value: str | bytes | None) -> bytes:
    """A hex digest header, trimmed and lower-cased (ASCII only: other bytes are left as they are)."""
    return header_bytes(value).strip().lower()


def verify_vapi_request(
    headers: Mapping[str, str],
    body: bytes,
    *,
    secret: str | None = None,
    bearer: str | None = None,
    hmac_secret: str | None = None,
) -> bool:
    """Checks Vapi's server authentications; whichever are configured must all pass.

    ``secret``: the legacy ``X-Vapi-Secret`` header; ``bearer``: a Bearer-token credential
    (``Authorization: Bearer …``); ``hmac_secret``: an HMAC credential (hex SHA-256 of the raw body in
    ``X-Vapi-Signature``, optionally prefixed ``sha256=``).
    """
    lower = {k.lower(): v for k, v in headers.items()}
    checks: list[bool] = []
    if secret is not None:
        checks.append(_same(header_bytes(lower.get("x-vapi-secret")), _secret(secret)))
    if bearer is not None:
        checks.append(_same(header_bytes(lower.get("authorization")), b"Bearer " + _secret(bearer)))
    if hmac_secret is not None:
        given = _hex_digest(lower.get("x-vapi-signature")).removeprefix(b"sha256=")
        expected = _hmac_hex(hmac_secret, body).encode()
        checks.append(_same(given, expected))
    return bool(checks) and all(checks)


def sign_retell(body: bytes | str, api_key: str, timestamp_ms: int | None = None) -> str:
    """The ``X-Retell-Signature`` Retell would send (for tests and local replays)."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    raw = _bytes(body)
    return f"v={ts},d={_hmac_hex(api_key, raw + str(ts).encode())}"


def verify_retell_signature(
    body: bytes,
    api_key: str,
    signature: str | bytes | None,
    *,
    now_ms: int | None = None,
    tolerance_ms: int = FIVE_MINUTES_MS,
) -> bool:
    """Checks ``X-Retell-Signature: v=<ms>,d=<hex>``: HMAC-SHA256 over ``body + <ms>`` with the API key
    (the scheme of ``retell.Retell.verify``), within ``tolerance_ms`` of now."""
    match = _RETELL_SIGNATURE.fullmatch(header_bytes(signature).strip())
    if not match:
        return False
    ts, digest = int(match.group(1)), match.group(2)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if abs(now - ts) > tolerance_ms:
        return False
    expected = _hmac_hex(api_key, body + str(ts).encode()).encode()
    return _same(expected, digest)


def verify_bland_signature(body: bytes, secret: str, signature: str | bytes | None) -> bool:
    """``X-Webhook-Signature``: hex HMAC-SHA256 of the raw body with the account's signing secret."""
    given = _hex_digest(signature)
    if not given:
        return False
    expected = _hmac_hex(secret, body).encode()
    return _same(expected, given)


ELEVENLABS_TOLERANCE_S = 30 * 60
"""How old an ``ElevenLabs-Signature`` timestamp may be (the tolerance of the SDK's ``construct_event``)."""

_CLOCK_SKEW_S = 5 * 60
"""How far in the future a signed timestamp may be (the sender's clock running ahead)."""


def sign_elevenlabs(body: bytes | str, secret: str, timestamp_s: int | None = None) -> str:
    """The ``ElevenLabs-Signature`` ElevenLabs would send (for tests and local replays)."""
    ts = int(time.time()) if timestamp_s is None else timestamp_s
    raw = _bytes(body)
    return f"t={ts},v0={_hmac_hex(secret, str(ts).encode() + b'.' + raw)}"


def verify_elevenlabs_signature(
    body: bytes,
    secret: str,
    signature: str | bytes | None,
    *,
    now_s: int | None = None,
    tolerance_s: int = ELEVENLABS_TOLERANCE_S,
) -> bool:
    """Checks ``ElevenLabs-Signature: t=<unix s>,v0=<hex>``: HMAC-SHA256 over ``"<t>.<body>"`` with the
    webhook secret (the scheme of the SDK's ``construct_event``), ``t`` at most ``tolerance_s`` old."""
    ts: int | None = None
    digests: list[bytes] = []
    for part in header_bytes(signature).split(b","):
        key, _, value = part.strip().partition(b"=")
        if key == b"t" and value.isdigit() and len(value) <= 12:
            ts = int(value)
        elif key == b"v0":
            digests.append(value.lower())
    if ts is None or not digests:
        return False
    now = int(time.time()) if now_s is None else now_s
    if _outside(ts, now, tolerance_s):
        return False
    expected = _hmac_hex(secret, str(ts).encode() + b"." + body).encode()
    return any(_same(expected, d) for d in digests)


def _iso_seconds(value: bytes) -> float | None:
    """An RFC 3339 / ISO 8601 timestamp header as Unix seconds (naive means UTC); None when unreadable."""
    from datetime import UTC, datetime

    try:
        parsed = datetime.fromisoformat(value.decode("ascii").strip().replace("Z", "+00:00"))
    except (UnicodeDecodeError, ValueError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def sign_ultravox(body: bytes | str, secret: str, timestamp: str | None = None) -> tuple[str, str]:
    """The ``(X-Ultravox-Webhook-Timestamp, X-Ultravox-Webhook-Signature)`` pair Ultravox would send."""
    from datetime import UTC, datetime

    ts = timestamp if timestamp is not None else datetime.now(UTC).isoformat()
    raw = _bytes(body)
    return ts, _hmac_hex(secret, raw + ts.encode())


def verify_ultravox_signature(
    body: bytes,
    secret: str,
    signature: str | bytes | None,
    timestamp: str | bytes | None,
    *,
    now_s: float | None = None,
    tolerance_s: float = FIVE_MINUTES_MS / 1000,
) -> bool:
    """Checks Ultravox's webhook signature: ``X-Ultravox-Webhook-Signature`` holds one or more
    comma-separated hex HMAC-SHA256 digests (several while a secret is rotated) of the raw body followed
    by the ``X-Ultravox-Webhook-Timestamp`` value, which must be within ``tolerance_s`` of now."""
    ts = header_bytes(timestamp).strip()
    when = _iso_seconds(ts) if ts else None
    if when is None:
        return False
    now = time.time() if now_s is None else now_s
    if _outside(when, now, tolerance_s):
        return False
    expected = _hmac_hex(secret, body + ts).encode()
    return any(_same(expected, d.strip().lower()) for d in header_bytes(signature).split(b","))
