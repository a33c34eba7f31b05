"""Keeping secrets out of everything snapshotter prints: errors, logs, status, tracebacks.

Two layers. URLs are rendered through :func:`mask_url` wherever a message names a server
(the password, and secret query parameters such as libpq's ``?password=``, become ``***``).
And every line the CLI prints or logs passes through a :class:`Redactor` that knows the
configured secrets (the source URL's password, Kafka client passwords, Spark settings named
like secrets) and replaces each occurrence, so a driver message or traceback that quotes one
is masked too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from urllib.parse import quote, unquote

import sqlalchemy as sa

MASK = "***"
# URL query parameters that carry a secret (libpq: password, sslpassword; pymysql takes
# "passwd" too).
SECRET_QUERY_KEYS = frozenset({"password", "sslpassword", "passwd", "pass"})
# Setting names (Kafka client, Spark conf) whose values are secrets.
_SECRET_NAME = re.compile(r"pass(word|wd)?|secret|token|credential", re.I)
# user:password@ in anything that looks like a URL, and password=... in a query or DSN.
# (Not the placeholder of an example, ``USER:PASSWORD@HOST``.)
_URL_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)(?!PASSWORD@)[^@\s]*@")
_KEY_VALUE = re.compile(
    r"(?P<head>\b(?:"
    + "|".join(sorted(SECRET_QUERY_KEYS))
    + r")\s*=\s*)(?P<value>'[^']*'|[^&\s]+)",
    re.I,
)
# Shorter secrets are still masked inside URLs and key=value pairs, but not replaced
# everywhere (a two-letter password would mask those letters in every word).
MIN_FREE_SECRET = 3


def mask_url(url: str | sa.URL) -> str:
    """The URL with its password and secret query parameters as ``***``."""
    if isinstance(url, str):
        try:
            parsed = sa.make_url(url)
        except (sa.exc.ArgumentError, ValueError):
            return mask_text(url)
    else:
        parsed = url
    # The query's secrets by text: SQLAlchemy would render a replaced value percent-encoded.
    return mask_text(parsed.render_as_string(hide_password=True))


def mask_text(text: str) -> str:
    """``user:password@`` of URLs and ``password=...`` pairs in ``text`` masked."""
    text = _URL_USERINFO.sub(lambda m: f"{m.group('head')}{MASK}@", text)
    return _KEY_VALUE.sub(lambda m: f"{m.group('head')}{MASK}", text)


def url_secrets(url: str) -> set[str]:
    """The secrets a source URL carries (as written, and percent-decoded or encoded)."""
    found: set[str] = set()
    try:
        parsed = sa.make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        match = _URL_USERINFO.search(url)
        if match:
            password = url[match.end("head") : match.end() - 1]
            found.add(password)
        return _variants(found)
    # A password equal to the user name is shown with it anyway: masking that word in every
    # message ("snapshotter" on the test servers) would only garble them.
    if parsed.password and parsed.password != parsed.username:
        found.add(str(parsed.password))
    for key, value in parsed.query.items():
        if key.lower() in SECRET_QUERY_KEYS:
            found.update([value] if isinstance(value, str) else value)
    return _variants(found)


def setting_secrets(settings: Mapping[str, object]) -> set[str]:
    """Values of settings whose names say they are secrets (``sasl_plain_password``...)."""
    return _variants(
        {str(v) for k, v in settings.items() if _SECRET_NAME.search(k) and isinstance(v, str)}
    )


def _variants(secrets: Iterable[str]) -> set[str]:
    out: set[str] = set()
    for secret in secrets:
        if secret:
            out.update({secret, unquote(secret), quote(secret, safe="")})
    return {s for s in out if s}


class Redactor:
    """Masks known secrets (and URL passwords generally) in text."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        self._secrets.update(s for s in secrets if s)

    def __call__(self, text: str) -> str:
        text = mask_text(text)
        # Longest first: a secret that contains another is masked whole.
        for secret in sorted(self._secrets, key=len, reverse=True):
            if len(secret) >= MIN_FREE_SECRET:
                text = text.replace(secret, MASK)
        return text


class RedactingFilter(logging.Filter):
    """A handler filter: the record's message (and traceback text) with secrets masked."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__()
        self._redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self._redact(record.getMessage())
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._redact(record.exc_text)
        return True
