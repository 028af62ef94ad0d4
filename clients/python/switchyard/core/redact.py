"""Secret redaction (the core's ``redact.rs``).

Every value under a key that looks sensitive is replaced by :data:`MARKER` before a document
leaves a runner. A key is sensitive when one of its words (split at non-alphanumerics and
camelCase boundaries, lowercased) is a sensitive word, or two adjacent words are ``api key`` or
``private key``. ``tokens`` (as in ``max_tokens``) is deliberately not sensitive. Keys the static
tier lists in its ``sensitive`` array (a key name, ASCII case-insensitive, or a full dotted path)
are sensitive too. ``null`` and values that already are the marker are left alone, so redaction
is idempotent.
"""

from __future__ import annotations

from switchyard.core.json_util import JSON, byte_sorted, join

MARKER = "[redacted]"
"""What a redacted value becomes."""

SENSITIVE_WORDS = frozenset(
    {
        "token", "secret", "secrets", "password", "passwords", "passwd", "authorization",
        "cookie", "cookies", "credential", "credentials", "apikey", "privatekey",
    }
)
SENSITIVE_PAIRS = frozenset({("api", "key"), ("private", "key")})


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
        pair in SENSITIVE_PAIRS for pair in zip(words, words[1:])
    )


def declared_sensitive(static_tier: JSON) -> set[str]:
    """The extra sensitive keys or dotted paths a static tier declares in ``sensitive``."""
    if not isinstance(static_tier, dict) or not isinstance(static_tier.get("sensitive"), list):
        return set()
    return {ascii_lower(s) for s in static_tier["sensitive"] if isinstance(s, str)}


def redact(doc: JSON, extra: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Redacts ``doc`` in place; returns the dotted paths it changed, in document order."""
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
            else:
                _walk(child, child_path, extra, out)
    elif isinstance(value, list):
        for i, child in enumerate(value):
            _walk(child, join(path, str(i)), extra, out)
