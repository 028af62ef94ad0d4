"""The capability core, ported from the Rust ``switchyard-core`` crate (pure, no IO).

Layout:
- ``limits``: the document limits (size, depth, key length, array length) and their violations.
- ``tier``: the tier merge (RFC 7386) with provenance and rejections.
- ``redact``: secret redaction by key words, declared sensitive keys and values holding a secret
  of a known shape.
- ``secrets``: the known shapes of secrets (cloud and forge tokens, JWTs, private keys, passwords
  in URLs, ``Bearer`` credentials; a subset of gitleaks' default rules, as ``core/src/secrets.rs``
  has them), and their redaction from free text (``redact_text``).
- ``diff``: JSON Patch (RFC 6902) diffs between generations, and their checked application.
- ``pack``: handler packs merged first-registration-wins, parameter resolution, and the kinds a
  runner advertises (those whose required capabilities are there) with the withdrawn ones.
- ``kinds``: the rules for a task kind's name, as handler kinds must follow them.
- ``version``: lenient version parsing, as pack validation and capability refs need it.

Every function here matches its Rust counterpart on the shared conformance vectors in
``tests/conformance/``.
"""

from switchyard_runner.core.limits import Limits, Violation
from switchyard_runner.core.secrets import contains_secret, redact_text
from switchyard_runner.core.tier import Merged, Rejection, Tier, merge_tiers

__all__ = [
    "Limits",
    "Merged",
    "Rejection",
    "Tier",
    "Violation",
    "contains_secret",
    "merge_tiers",
    "redact_text",
]
