"""Webhook authentication: malformed credentials are a plain "no", never an exception (issue 17, 8)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from calltape.adapters import bland, retell, vapi
from calltape.adapters.webhook_auth import (
    header_bytes,
    sign_retell,
    verify_bland_signature,
    verify_retell_signature,
    verify_vapi_request,
)

BODY = b'{"message": {"type": "status-update", "call": {"id": "c"}}}'

# What an ASGI server hands over for raw header bytes: Latin-1 decoded, so non-ASCII characters.
MALFORMED = ["caf\u00e9", "\u00ff\u00fe\u0000", "s\u00e9cret", "\u00e9" * 64, "", " ", "sha256=\u00e9"]


@pytest.mark.parametrize("value", MALFORMED)
def test_malformed_vapi_credentials_are_refused(value: str) -> None:
    assert not verify_vapi_request({"X-Vapi-Secret": value}, BODY, secret="s3cret")
    assert not verify_vapi_request({"Authorization": value}, BODY, bearer="tok")
    assert not verify_vapi_request({"X-Vapi-Signature": value}, BODY, hmac_secret="h")


@pytest.mark.parametrize("value", MALFORMED)
def test_malformed_bland_and_retell_signatures_are_refused(value: str) -> None:
    assert not verify_bland_signature(BODY, "whsec", value)
    assert not verify_retell_signature(BODY, "key", value)
    assert not verify_retell_signature(BODY, "key", f"v=1,d={value}")


def test_non_ascii_secrets_match_the_bytes_that_travelled() -> None:
    secret = "s\u00e9same"  # configured as text; the platform sends its UTF-8 bytes
    on_the_wire = secret.encode("utf-8").decode("latin-1")  # how Starlette hands the header over
    assert verify_vapi_request({"x-vapi-secret": on_the_wire}, BODY, secret=secret)
    assert verify_vapi_request({"x-vapi-secret": "\u20acuro"}, BODY, secret="\u20acuro")  # beyond Latin-1: UTF-8
    assert not verify_vapi_request({"x-vapi-secret": secret + "x"}, BODY, secret=secret)
    digest = hmac.new(secret.encode(), BODY, hashlib.sha256).hexdigest()
    assert verify_bland_signature(BODY, secret, digest) and verify_bland_signature(BODY, secret, digest.upper())
    assert verify_vapi_request({"x-vapi-signature": f"sha256={digest}"}, BODY, hmac_secret=secret)
    assert verify_retell_signature(BODY, secret, sign_retell(BODY, secret))
    assert verify_retell_signature(BODY, "k", sign_retell(BODY, "k").encode())  # bytes accepted too


def test_unicode_digits_are_not_a_retell_timestamp() -> None:
    good = sign_retell(BODY, "key", timestamp_ms=1_700_000_000_000)
    ts, digest = good.removeprefix("v=").split(",d=")
    arabic = "".join(chr(0x0660 + int(c)) for c in ts)  # int() would parse these
    assert verify_retell_signature(BODY, "key", good, now_ms=1_700_000_000_000)
    assert not verify_retell_signature(BODY, "key", f"v={arabic},d={digest}", now_ms=1_700_000_000_000)


def test_one_module_the_platform_modules_re_export() -> None:
    assert vapi.verify_vapi_request is verify_vapi_request
    assert retell.verify_retell_signature is verify_retell_signature and retell.sign_retell is sign_retell
    assert bland.verify_bland_signature is verify_bland_signature
    assert header_bytes(None) == b"" and header_bytes(b"\xff") == b"\xff" and header_bytes("\u20ac") == "€".encode()
