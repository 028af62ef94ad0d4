"""The shared conformance vectors (`tests/conformance/`): merge, diff, redaction, packs, kinds and
numbers.

Every case of the five files the runners share must pass, as the Rust core passes them.
"""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

import pytest

from switchyard_runner import convert
from switchyard_runner.core import diff as diffs
from switchyard_runner.core.json_util import json_equal
from switchyard_runner.core.limits import Limits
from switchyard_runner.core.pack import Pack, advertise, merge_packs, resolve_params
from switchyard_runner.core.redact import redact
from switchyard_runner.core.secrets import redact_text
from switchyard_runner.core.tier import Tier, merge_tiers

VECTORS = pathlib.Path(__file__).resolve().parents[3] / "tests" / "conformance"


def cases(name: str) -> list[Any]:
    """The cases of one vector file, as pytest params named by the case."""
    data = json.loads((VECTORS / f"{name}.json").read_text())
    return [pytest.param(case, id=case["name"]) for case in data]


@pytest.mark.parametrize("case", cases("merge"))
def test_merge(case: dict) -> None:
    limits = Limits.from_json(case.get("limits"))
    merged = merge_tiers([(Tier.parse(t["tier"]), t["value"]) for t in case["tiers"]], limits)
    expected = case["expected"]
    assert json_equal(merged.document, expected["document"]), merged.document
    assert {p: t.label for p, t in merged.provenance.items()} == expected["provenance"]
    got = [{"tier": r.tier.label if r.tier else None, "path": r.path} for r in merged.rejections]
    assert got == expected["rejections"]


@pytest.mark.parametrize("case", cases("diff"))
def test_diff(case: dict) -> None:
    if case["kind"] == "round_trip":
        patch = diffs.diff(case["a"], case["b"])
        if json_equal(case["a"], case["b"]):
            assert patch == []
        result = diffs.apply(case["a"], 0, 0, patch, Limits(max_serialized_bytes=1 << 30))
        assert json_equal(result, case["b"])
        return
    limits = Limits.from_json(case.get("limits"))
    base = copy.deepcopy(case["base"])
    if "error" in case:
        with pytest.raises(diffs.DiffError) as err:
            diffs.apply(base, case["held_generation"], case["base_generation"], case["patch"], limits)
        assert err.value.code == case["error"]
        if "error_index" in case:
            assert err.value.index == case["error_index"]
    else:
        result = diffs.apply(base, case["held_generation"], case["base_generation"], case["patch"], limits)
        assert json_equal(result, case["expected"])
    assert json_equal(base, case["base"]), "apply must not modify the held document"


@pytest.mark.parametrize("case", cases("redaction"))
def test_redaction(case: dict) -> None:
    if "texts" in case:
        for t in case["texts"]:
            got = redact_text(t["text"])
            assert got == t["expected"], t["text"]
            assert redact_text(got) == got, f"idempotent: {t['text']!r}"
        return
    extra = {s.lower() for s in case.get("sensitive", [])}
    doc = copy.deepcopy(case["document"])
    paths = redact(doc, extra)
    assert json_equal(doc, case["expected"])
    assert sorted(paths) == sorted(case["redacted_paths"])
    again = copy.deepcopy(case["expected"])
    assert redact(again, extra) == []
    assert json_equal(again, case["expected"])


@pytest.mark.parametrize("case", cases("packs"))
def test_packs(case: dict) -> None:
    merged = merge_packs([Pack.from_json(p) for p in case["packs"]])
    params = case.get("params", {})
    expected = case["expected"]
    assert merged.packs == expected["packs"]
    assert merged.handlers == expected["handlers"]
    assert {name: pack for name, (pack, _) in merged.provides.items()} == expected["provided_by"]
    got = [{"pack": r.pack, "kind": r.kind, "id": r.id} for r in merged.rejections]
    assert got == expected["rejections"]
    provides = resolve_params(merged, params.get)
    assert json_equal(provides, expected["provides"])
    for value in params.values():
        if value:
            assert value not in json.dumps(provides)


@pytest.mark.parametrize("case", cases("kinds"))
def test_kinds(case: dict) -> None:
    merged = merge_packs([Pack.from_json(p) for p in case["packs"]])
    advertised = advertise(merged, case["document"])
    expected = case["expected"]
    assert advertised.kinds == expected["kinds"]
    got = [
        {"kind": w.kind, "capability": w.capability, "problem": w.problem, "reason": w.reason}
        for w in advertised.withdrawn
    ]
    assert got == expected["withdrawn"]


def _same_json_types(a: Any, b: Any) -> bool:
    """Equal as JSON, and every number of the same Python type (an int is not a float)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_json_types(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_json_types(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("case", cases("numbers"))
def test_numbers(case: dict) -> None:
    if case["kind"] == "send":
        value = json.loads(case["json"])
        if "error_path" in case:
            with pytest.raises(ValueError) as refused:
                convert.to_struct(value, case["path"])
            assert str(refused.value).startswith(f"{case['error_path']}: "), str(refused.value)
        else:
            sent = convert.from_struct(convert.to_struct(value, case["path"]))
            assert _same_json_types(sent, case["sent"]), sent
    else:
        for number, integer in zip(case["numbers"], case["integers"], strict=True):
            got = convert.from_value(convert.to_value(number))
            assert isinstance(got, int) == integer and got == number, (number, got)
