"""The request body as the fingerprint sees it: JSON as sent, a
form-encoded body mapped to JSON (the same mapping as the Node client,
documented in the README), any other body by its type and SHA-256, no body
as SQL NULL."""

import hashlib
import json
import re
from typing import Any, Dict, List, Optional, Tuple, Union
from urllib.parse import unquote_plus

JSONNode = Union[str, List[Any], Dict[str, Any]]

_NAME = re.compile(r"([^\[\]]+)((?:\[[^\[\]]*\])*)")
_BRACKET = re.compile(r"\[([^\[\]]*)\]")


class BodyError(ValueError):
    """The request body cannot be read for a fingerprint."""


def _clash(name: str) -> BodyError:
    return BodyError(f"form field {name} is used both as a value and as a structure")


def _set_path(root: Dict[str, Any], path: List[str], value: str, name: str) -> None:
    node: Any = root
    for i, token in enumerate(path):
        if i == len(path) - 1:
            if token == "":
                if not isinstance(node, list):
                    raise _clash(name)
                node.append(value)
                return
            have = node.get(token)
            if have is None:
                node[token] = value
            elif isinstance(have, str):
                node[token] = [have, value]
            elif isinstance(have, list) and all(isinstance(x, str) for x in have):
                have.append(value)
            else:
                raise _clash(name)
            return
        want_list = path[i + 1] == ""
        if token == "":
            if not isinstance(node, list):
                raise _clash(name)
            child: Any = [] if want_list else {}
            node.append(child)
            node = child
            continue
        if isinstance(node, list):
            raise _clash(name)
        have = node.get(token)
        if have is None:
            node[token] = have = [] if want_list else {}
        elif not isinstance(have, list if want_list else dict):
            raise _clash(name)
        node = have


def form_to_json(text: str) -> Dict[str, Any]:
    """"a[b][c]=v" sets a.b.c, "a[]=v" appends to the list a, "a=v" sets a;
    values stay strings; a name repeated without [] becomes a list of its
    values in order; a name used both as a value and as a structure is
    refused."""
    root: Dict[str, Any] = {}
    for pair in text.split("&"):
        if pair == "":
            continue
        raw_name, _, raw_value = pair.partition("=")
        try:
            name = unquote_plus(raw_name, errors="strict")
            value = unquote_plus(raw_value, errors="strict")
        except UnicodeDecodeError:
            raise BodyError("malformed percent-encoding in the form body") from None
        if re.search(r"%(?![0-9A-Fa-f]{2})", raw_name + raw_value):
            raise BodyError("malformed percent-encoding in the form body")
        m = _NAME.fullmatch(name)
        path = [m.group(1)] + _BRACKET.findall(m.group(2)) if m else [name]
        _set_path(root, path, value, name)
    return root


def fingerprint_body(content_type: str, raw: bytes) -> Tuple[Optional[str], Any]:
    """(json text or None for the fingerprint, what the handler may read)."""
    media = content_type.split(";")[0].strip().lower()
    if not raw:
        return None, None
    if media == "application/json" or media.endswith("+json"):
        try:
            text = raw.decode("utf-8")
            parsed = json.loads(text)
        except (UnicodeDecodeError, ValueError):
            raise BodyError("the request body is not valid JSON") from None
        return text, parsed
    if media == "application/x-www-form-urlencoded":
        try:
            parsed = form_to_json(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise BodyError("the form body is not UTF-8") from None
        return json.dumps(parsed, ensure_ascii=False), parsed
    return json.dumps({"content_type": media, "sha256": hashlib.sha256(raw).hexdigest()}), raw
