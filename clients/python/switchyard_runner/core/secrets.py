"""Secrets found by their shape, whatever key they sit under (the core's ``secrets.rs``).

The shapes follow ``core/src/secrets.rs``: cloud and forge tokens, JWTs, PEM private keys,
passwords inside URLs and DSNs, and ``Bearer``/``Basic`` credentials, a subset of gitleaks'
default rule set (``config/gitleaks.toml``: ``aws-access-token``, ``github-pat``,
``github-fine-grained-pat``, ``github-oauth``, ``github-app-token``, ``github-refresh-token``,
``gitlab-pat``, ``slack-*-token``, ``slack-webhook-url``, ``jwt``, ``private-key``,
``stripe-access-token``, ``gcp-api-key``, ``npm-access-token``, ``pypi-upload-token``,
``openai-api-key``, ``anthropic-api-key``), written without look-around so the Rust core and the
Python and Node runners use the same expressions; ``tests/conformance/redaction.json`` holds all
three to them, with look-alikes that must be left alone (git shas, UUIDs, digests, prose).

A document's string value holding a secret is replaced whole (see :mod:`switchyard_runner.core.redact`);
free text (a failure message, a refusal, a drain reason) keeps its words and loses only the
secret: :func:`redact_text` replaces the token, the password of a URL, the value after
``password=`` or the credential after ``Bearer``.
"""

from __future__ import annotations

import re

MARKER = "[redacted]"
"""What a redacted value or secret becomes; :mod:`switchyard_runner.core.redact` re-exports it."""

PATTERNS: tuple[tuple[str, int, bool], ...] = (
    # PEM private keys, the whole block when it is there.
    (
        r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----(?:[\s\S]*?-----END[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----)?",
        0,
        False,
    ),
    # AWS access key ids.
    (r"\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b", 0, False),
    # GitHub: classic, OAuth, app, refresh and fine-grained tokens.
    (r"\bgh[pousr]_[A-Za-z0-9]{36,255}\b", 0, False),
    (r"\bgithub_pat_[A-Za-z0-9_]{22,255}\b", 0, False),
    # GitLab personal, deploy and runner tokens.
    (r"\bgl(?:pat|dt|rt|ptt)-[A-Za-z0-9_-]{20,}", 0, False),
    # Slack tokens and webhooks.
    (r"\bxox[abposr]-[A-Za-z0-9-]{10,}", 0, False),
    (r"https://hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9+/_-]{20,}", 0, False),
    # Stripe, Google API, npm, PyPI, OpenAI and Anthropic keys; Switchyard's own tokens.
    (r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{20,}", 0, False),
    (r"\bAIza[A-Za-z0-9_-]{35}", 0, False),
    (r"\bnpm_[A-Za-z0-9]{36}\b", 0, False),
    (r"\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}", 0, False),
    (r"\bsk-(?:proj-|ant-[a-z0-9]+-)?[A-Za-z0-9_-]{20,}", 0, False),
    (r"\bsy_[0-9a-f]{64}\b", 0, False),
    # JSON Web Tokens.
    (r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*", 0, False),
    # The password of a URL or DSN: scheme://user:PASSWORD@host.
    (r"[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:([^\s/@]+)@", 1, False),
    # HTTP credentials: Bearer TOKEN, Basic BASE64.
    (r"\b(?:[Bb]earer|BEARER)\s+([A-Za-z0-9._~+/-]{8,}=*)", 1, True),
    (r"\b(?:[Bb]asic|BASIC)\s+([A-Za-z0-9+/]{8,}={0,2})", 1, True),
    # key=value and key: value pairs in DSNs, command lines and messages.
    (
        r"(?i)\b(?:password|passwd|pwd|passphrase|secret|token|api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key)\s*[=:]\s*([^\s,;&'\x22]+)",
        1,
        False,
    ),
)
"""The shapes, in the order they are tried: (expression, the capture group that is the secret
(0: the whole match), whether the secret must also look like a credential rather than a word).
Kept in step with ``core/src/secrets.rs`` and ``clients/node/src/core/secrets.js``."""

_SHAPES: tuple[tuple[re.Pattern[str], int, bool], ...] = tuple(
    (re.compile(pattern), group, check) for pattern, group, check in PATTERNS
)


def _is_ascii_alnum(c: str) -> bool:
    return "0" <= c <= "9" or "a" <= c <= "z" or "A" <= c <= "Z"


def looks_like_credential(secret: str) -> bool:
    """Whether a ``Bearer``/``Basic`` credential looks like one rather than a word of prose: it
    has a digit, a symbol, or an uppercase letter after its first character (``dXNlcjpwYXNz``
    does, ``authentication`` and ``Authentication`` do not)."""
    return any(
        "0" <= c <= "9" or not _is_ascii_alnum(c) or (i > 0 and "A" <= c <= "Z")
        for i, c in enumerate(secret)
    )


def _spans(text: str) -> list[tuple[int, int]]:
    """The ranges of the secrets in ``text``, sorted and merged."""
    found: list[tuple[int, int]] = []
    for regex, group, check in _SHAPES:
        for m in regex.finditer(text):
            start, end = m.span(group)
            if start < 0:  # the group did not take part in the match
                continue
            secret = text[start:end]
            if MARKER in secret:
                continue
            if check and not looks_like_credential(secret):
                continue
            found.append((start, end))
    found.sort()
    merged: list[tuple[int, int]] = []
    for start, end in found:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def contains_secret(text: str) -> bool:
    """Whether ``text`` holds a secret of a known shape."""
    return bool(_spans(text))


def redact_text(text: str) -> str:
    """``text`` with every secret of a known shape replaced by :data:`MARKER`; the rest is kept.
    Idempotent."""
    spans = _spans(text)
    if not spans:
        return text
    out: list[str] = []
    at = 0
    for start, end in spans:
        out.append(text[at:start])
        out.append(MARKER)
        at = end
    out.append(text[at:])
    return "".join(out)
