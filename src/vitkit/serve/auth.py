"""API keys for `vitkit serve`: which keys are acceptable, the key file, which addresses are this machine
only, and the FastAPI dependency that checks `Authorization: Bearer KEY` on a request.

A key is never echoed: messages name the line or the source of a bad key, not the key."""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from fastapi import Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from ..errors import ConfigError

KEY_ENV = "VITKIT_API_KEY"  # the environment variable `vitkit serve` reads a key from
MIN_KEY_LENGTH = 16  # there is no rate limit on guesses, so a key must be long enough not to be guessed
MAKE_KEY = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
LOOPBACK_NAMES = ("localhost",)


def check_key(key: str, source: str) -> str:
    """`key` if it can be a key: printable ASCII without spaces (it travels in an HTTP header) and at least
    MIN_KEY_LENGTH characters; else a ConfigError naming `source`, never the key."""
    if not all("!" <= ch <= "~" for ch in key):
        raise ConfigError(f"{source}: an API key may hold only printable ASCII characters, without spaces "
                          f"(make one with {MAKE_KEY})")
    if len(key) < MIN_KEY_LENGTH:
        raise ConfigError(f"{source}: an API key must be at least {MIN_KEY_LENGTH} characters (got {len(key)}); "
                          f"make one with {MAKE_KEY}")
    return key


def check_keys(keys: Iterable[str], source: str = "api_keys") -> tuple[str, ...]:
    """The keys, each checked by `check_key`, duplicates dropped; refused if there are none."""
    checked = tuple(dict.fromkeys(check_key(k, f"{source} #{i + 1}") for i, k in enumerate(keys)))
    if not checked:
        raise ConfigError(f"{source}: no API key given")
    return checked


def read_key_file(path: str | os.PathLike) -> tuple[str, ...]:
    """The keys in a key file: one a line, surrounding spaces stripped, blank lines and `#` comments ignored.
    Refused in one line if it is missing, not a file, unreadable, holds no key, holds a bad key, or (on POSIX)
    can be read by every user of the machine: a secret there is no secret."""
    path = Path(path)
    where = f"API key file {path}"
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{where}: not a file")
        if os.name == "posix" and mode & stat.S_IROTH:
            raise ConfigError(f"{where}: every user of this machine can read it; make it private: chmod 600 {path}")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except PermissionError:
        raise ConfigError(f"{where}: permission denied") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not a text file (UTF-8)") from None
    keys = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)]
    keys = [(n, line) for n, line in keys if line and not line.startswith("#")]
    if not keys:
        raise ConfigError(f"{where}: no API key in it (one key a line; blank lines and # comments are ignored)")
    return tuple(dict.fromkeys(check_key(key, f"{where} line {n}") for n, key in keys))


def is_loopback(host: str) -> bool:
    """Whether listening on `host` serves this machine only: 127.0.0.0/8, ::1 (also as ::ffff:127.x.y.z) and
    'localhost'. Any other name may resolve to an address other machines reach, so it is not."""
    if host.lower().rstrip(".") in LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # Python < 3.13 does not call ::ffff:127.0.0.1 loopback
    return (mapped or address).is_loopback


# auto_error off: a missing key gets the same JSON error, with its own words, as a wrong one
_BEARER = HTTPBearer(auto_error=False, scheme_name="apiKey",
                     description="an API key the server was started with (--api-key, VITKIT_API_KEY, --api-key-file)")


class BearerKeyCheck:
    """A FastAPI dependency: the request must carry `Authorization: Bearer KEY` with one of `keys`, else an
    HTTPException 401 with `WWW-Authenticate: Bearer` (the app answers it as its usual JSON error).

    Each key is compared through its SHA-256 digest with `hmac.compare_digest`, and every key is compared
    whatever the outcome: the time taken tells neither how much of a guess was right nor which key, nor (the
    digests all having one length) how long the keys are."""

    def __init__(self, keys: Iterable[str]):
        self._digests = tuple(_digest(k) for k in check_keys(keys))

    async def __call__(self, credentials: HTTPAuthorizationCredentials | None = Security(_BEARER)):
        if credentials is None:  # no header, another scheme than Bearer, or an empty key
            raise _unauthorized("this server needs an API key: send the header 'Authorization: Bearer KEY'")
        given = _digest(credentials.credentials)
        matched = False
        for digest in self._digests:
            matched |= hmac.compare_digest(digest, given)
        if not matched:
            raise _unauthorized("wrong API key")


def _digest(key: str) -> bytes:
    # surrogateescape: a header decoded as latin-1 is any str, and a strange one must be a wrong key, not a 500
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": "Bearer"})
