"""Passwords out of everything the broker prints, logs or stores as text: route addresses,
DSNs and the driver errors that quote them.

Every form a password takes in a libpq connection string is masked: a URI's user information
(``postgresql://user:pw@host``, percent-encoded or malformed, ``@`` inside included), a URI
query parameter (``?password=pw``, ``&password=pw``) and a key/value pair (``password=pw``,
``password = 'p w'``), and the token libpq quotes when it cannot percent-decode one.
"""

from __future__ import annotations

import re

MASK = "***"

_USERINFO = re.compile(
    # scheme://user:PASSWORD@ ; an '@' belongs to the password while another follows it
    # before the host's end (malformed, unencoded passwords)
    r"(?i)(\b[a-z][a-z0-9+.-]*://[^/@\s:?#]*:)(?:[^\s@]|@(?=[^\s/?#]*@))*(@)")
_QUERY = re.compile(r"(?i)([?&]password=)[^&#\s]*")
# libpq quotes the token it cannot decode, which is the password when that is malformed.
_BAD_TOKEN = re.compile(r'(?i)(invalid percent-encoded token: )"[^"]*"')
_KEY_VALUE = re.compile(r"(?i)((?<![?&\w])password\s*=\s*)(?!\*\*\*)('(?:[^'\\]|\\.)*'?|\S+)")


def redact(text: str) -> str:
    """``text`` with every password of a connection string in it replaced by ``***``."""
    text = _USERINFO.sub(rf"\g<1>{MASK}\g<2>", text)
    text = _QUERY.sub(rf"\g<1>{MASK}", text)
    text = _BAD_TOKEN.sub(rf'\g<1>"{MASK}"', text)
    return _KEY_VALUE.sub(rf"\g<1>{MASK}", text)
