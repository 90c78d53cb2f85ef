"""The Idempotency-Key request header: read bare (Stripe) or as an RFC 8941
sf-string (IETF draft), and the key policy that maps a key outside the
extension's rule to one inside it, or refuses it."""

import base64
import hashlib
import re
from typing import List, Optional

KEY_RULE = re.compile(r"[A-Za-z0-9_-]{1,255}")
# RFC 8941 parameters: *( ";" *SP key [ "=" bare-item ] ), a bare item being a
# string, a token, a number, a boolean or a byte sequence
SF_PARAMETERS = re.compile(r'(;[ ]*[a-z*][a-z0-9_.*-]*(=("([^"\\]|\\["\\])*"|[A-Za-z*][A-Za-z0-9!#$%&\'*+.^_`|~:/-]*'
                           r'|-?[0-9]+(\.[0-9]+)?|\?[01]|:[A-Za-z0-9+/=]*:))?)*')


class IdempotencyKeyError(ValueError):
    """The Idempotency-Key header cannot be used."""


# the name of 0.3.0, kept for applications that catch it
KeyError_ = IdempotencyKeyError


def _parse_sf_string(text: str) -> str:
    out: List[str] = []
    i = 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 1
            if i >= len(text) or text[i] not in '"\\':
                raise IdempotencyKeyError("invalid escape in the Idempotency-Key string")
            out.append(text[i])
        elif c == '"':
            # RFC 8941 section 3.1.2: an Item may carry parameters, which do
            # not belong to the key
            if not SF_PARAMETERS.fullmatch(text[i + 1:]):
                raise IdempotencyKeyError("characters after the end of the Idempotency-Key string")
            return "".join(out)
        else:
            if not 0x20 <= ord(c) <= 0x7E:
                raise IdempotencyKeyError("invalid character in the Idempotency-Key string")
            out.append(c)
        i += 1
    raise IdempotencyKeyError("unterminated Idempotency-Key string")


def _from_header_bytes(text: str) -> str:
    """A header's bytes read as Latin-1 (as ASGI servers hand them over) read
    again as the UTF-8 they were sent in, so that key policy 'hash' hashes the
    bytes the client sent; a key that is not UTF-8 is refused."""
    if text.isascii():
        return text
    try:
        raw = text.encode("latin-1")
    except UnicodeEncodeError:
        return text
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise IdempotencyKeyError("the Idempotency-Key is not UTF-8") from None


def parse_key_header(values: Optional[List[str]]) -> Optional[str]:
    """The key of a request from its Idempotency-Key header values (a list
    of str), or None when it has none."""
    if not values:
        return None
    if len(values) != 1:
        raise IdempotencyKeyError("more than one Idempotency-Key header")
    text = values[0].strip()
    if text == "":
        raise IdempotencyKeyError("empty Idempotency-Key header")
    key = _parse_sf_string(text) if text.startswith('"') else _from_header_bytes(text)
    if key == "":
        raise IdempotencyKeyError("empty Idempotency-Key")
    return key


def apply_key_policy(key: str, policy: str) -> str:
    """A key within the extension's rule passes unchanged; any other is
    refused ('refuse') or replaced ('hash') by "h_" and the base64url
    SHA-256 of its UTF-8 bytes."""
    if KEY_RULE.fullmatch(key):
        return key
    if policy == "hash":
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        return "h_" + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")
    raise IdempotencyKeyError("an Idempotency-Key is 1 to 255 characters from A-Z a-z 0-9 - _")
