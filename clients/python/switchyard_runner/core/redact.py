"""Secret redaction (the core's ``redact.rs``).

Every value under a key that looks sensitive is replaced by :data:`MARKER` before a document
leaves a runner; the paths redacted are returned (never their values). A key is sensitive when
one of its words (split at non-alphanumerics and camelCase boundaries, lowercased:
``githubToken`` → ``github token``, ``APIKey`` → ``api key``) is one of :data:`SENSITIVE_WORDS`
(``token``, ``secret``, ``password``, ``pwd``, ``passphrase``, ``pat``, ``jwt``, ..., and the
``X key`` pairs written as one word: ``apikey``, ``privatekey``, ``accesskey``, ...), or two
adjacent words are ``X key`` with ``X`` in :data:`SENSITIVE_KEY_PREFIXES` (``api``,
``private``, ``access``, ``secret``, ``signing``, ``ssh``, ``encryption``, ``master``,
``session``, ``client``, ``account``). ``tokens`` (as in ``max_tokens``) is deliberately not
sensitive. Keys the static tier lists in its ``sensitive`` array (a key name, ASCII
case-insensitive, or a full dotted path) are sensitive too.

Values are looked at too, whatever their key: a string holding a secret of a known shape
(:mod:`switchyard_runner.core.secrets`: cloud and forge tokens, JWTs, private keys, passwords in URLs,
``Bearer`` credentials) is replaced whole. Free text shown to people (reasons, messages) goes
through :func:`switchyard_runner.core.secrets.redact_text` instead, which keeps the words around the
secret. ``null`` and values that already are the marker are left alone, so redaction is
idempotent and a second pass reports nothing.
"""

from __future__ import annotations

from switchyard_runner.core.json_util import JSON, byte_sorted, join
from switchyard_runner.core.secrets import MARKER as MARKER  # what a redacted value becomes
from switchyard_runner.core.secrets import contains_secret

SENSITIVE_WORDS = frozenset(
    {
        "token", "secret", "secrets", "password", "passwords", "passwd", "authorization",
        "cookie", "cookies", "credential", "credentials", "pwd", "passphrase", "pat", "jwt",
        "apikey", "privatekey", "accesskey", "secretkey", "signingkey", "sshkey",
        "encryptionkey", "masterkey", "sessionkey", "clientkey", "accountkey",
    }
)
"""Words that make a key sensitive on their own."""

SENSITIVE_KEY_PREFIXES = frozenset(
    {
        "api", "private", "access", "secret", "signing", "ssh", "encryption", "master",
        "session", "client", "account",
    }
)
"""``X`` of the ``(X, "key")`` word pairs that make a key sensitive: ``api key``,
``access_key``, ``SigningKey``, ..."""


def ascii_lower(text: str) -> str:
    """Lowercases ASCII letters only, like Rust's ``to_ascii_lowercase``."""
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text)


def key_words(key: str) -> list[str]:
    """Splits a key into lowercase words at separators and camelCase boundaries."""
    words: list[str] = []
    current = ""
    for i, c in enumerate(key):
        if not c.isalnum():
            if current:
                words.append(current)
                current = ""
            continue
        if c.isupper() and current:
            prev = key[i - 1]
            next_is_lower = i + 1 < len(key) and key[i + 1].islower()
            if prev.islower() or ("0" <= prev <= "9") or (prev.isupper() and next_is_lower):
                words.append(current)
                current = ""
        current += c.lower()
    if current:
        words.append(current)
    return words


def is_sensitive_key(key: str) -> bool:
    """Whether ``key`` looks sensitive by its words."""
    words = key_words(key)
    return any(w in SENSITIVE_WORDS for w in words) or any(
        second == "key" and first in SENSITIVE_KEY_PREFIXES
        for first, second in zip(words, words[1:])
    )


def declared_sensitive(static_tier: JSON) -> set[str]:
    """The extra sensitive keys or dotted paths a static tier declares in ``sensitive``."""
    if not isinstance(static_tier, dict) or not isinstance(static_tier.get("sensitive"), list):
        return set()
    return {ascii_lower(s) for s in static_tier["sensitive"] if isinstance(s, str)}


def redact(doc: JSON, extra: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Redacts ``doc`` in place; returns the dotted paths it changed, in document order.

    ``extra`` holds lowercase key names or dotted paths (see :func:`declared_sensitive`). A
    string is immutable, so only the strings inside ``doc`` (an object or array) are replaced.
    """
    out: list[str] = []
    _walk(doc, "", extra, out)
    return out


def _walk(value: JSON, path: str, extra: set[str] | frozenset[str], out: list[str]) -> None:
    if isinstance(value, dict):
        for key in byte_sorted(value):
            child = value[key]
            child_path = join(path, key)
            sensitive = is_sensitive_key(key) or (
                bool(extra) and (ascii_lower(key) in extra or ascii_lower(child_path) in extra)
            )
            if sensitive:
                if child is not None and child != MARKER:
                    value[key] = MARKER
                    out.append(child_path)
            elif isinstance(child, str):
                if contains_secret(child):
                    value[key] = MARKER
                    out.append(child_path)
            else:
                _walk(child, child_path, extra, out)
    elif isinstance(value, list):
        for i, child in enumerate(value):
            child_path = join(path, str(i))
            if isinstance(child, str):
                if contains_secret(child):
                    value[i] = MARKER
                    out.append(child_path)
            else:
                _walk(child, child_path, extra, out)
