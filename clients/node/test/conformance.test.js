// Runs every case of the shared conformance vectors this runner must pass:
// tests/conformance/{merge,diff,redaction,packs,kinds,numbers}.json at the repository root.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import {
  advertise,
  applyDiff,
  checkKind,
  clone,
  DiffError,
  diff,
  limitsFrom,
  mergePacks,
  mergeTiers,
  redact,
  redactText,
  resolveParams,
  uncarried,
} from "../src/core/index.js";
import { fromJson, toJson } from "@bufbuild/protobuf";
import { StructSchema, ValueSchema } from "@bufbuild/protobuf/wkt";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
const vectors = (name) =>
  JSON.parse(readFileSync(join(repo, "tests", "conformance", `${name}.json`), "utf8"));

describe("merge.json", () => {
  for (const c of vectors("merge")) {
    test(c.name, () => {
      const merged = mergeTiers(
        c.tiers.map((t) => [t.tier, t.value]),
        limitsFrom(c.limits),
      );
      assert.deepEqual(merged.document, c.expected.document);
      assert.deepEqual(merged.provenanceObject(), c.expected.provenance);
      assert.deepEqual(
        merged.rejections.map((r) => ({ tier: r.tier, path: r.path })),
        c.expected.rejections,
      );
    });
  }
});

describe("diff.json", () => {
  for (const c of vectors("diff")) {
    test(c.name, () => {
      if (c.kind === "round_trip") {
        const patch = diff(c.a, c.b);
        if (JSON.stringify(c.a) === JSON.stringify(c.b)) assert.deepEqual(patch, []);
        assert.deepEqual(applyDiff(c.a, 0, 0, patch, limitsFrom()), c.b);
        return;
      }
      const base = clone(c.base);
      const run = () =>
        applyDiff(c.base, c.held_generation, c.base_generation, c.patch, limitsFrom(c.limits));
      if (c.error) {
        assert.throws(run, (err) => {
          assert.ok(err instanceof DiffError, String(err));
          assert.equal(err.code, c.error, err.message);
          if (c.error_index !== undefined) assert.equal(err.index, c.error_index);
          return true;
        });
      } else {
        assert.deepEqual(run(), c.expected);
      }
      assert.deepEqual(c.base, base, "the held document is never modified");
    });
  }
});

describe("redaction.json", () => {
  for (const c of vectors("redaction")) {
    test(c.name, () => {
      if (c.texts) {
        for (const t of c.texts) {
          const got = redactText(t.text);
          assert.equal(got, t.expected, JSON.stringify(t.text));
          assert.equal(redactText(got), got, `idempotent: ${JSON.stringify(t.text)}`);
        }
        return;
      }
      const doc = clone(c.document);
      const extra = new Set((c.sensitive ?? []).map((s) => s.replace(/[A-Z]/g, (x) => x.toLowerCase())));
      const paths = redact(doc, extra);
      assert.deepEqual(doc, c.expected);
      assert.deepEqual([...paths].sort(), [...c.redacted_paths].sort());
      const again = clone(c.expected);
      assert.deepEqual(redact(again, extra), []);
      assert.deepEqual(again, c.expected);
    });
  }
});

describe("packs.json", () => {
  for (const c of vectors("packs")) {
    test(c.name, () => {
      const merged = mergePacks(c.packs);
      assert.deepEqual(merged.packs, c.expected.packs);
      assert.deepEqual(Object.fromEntries(merged.handlers), c.expected.handlers);
      assert.deepEqual(
        Object.fromEntries([...merged.provides].map(([k, v]) => [k, v.pack])),
        c.expected.provided_by,
      );
      assert.deepEqual(
        merged.rejections.map(({ pack, kind, id }) => ({ pack, kind, id })),
        c.expected.rejections,
      );
      const params = c.params ?? {};
      const provides = resolveParams(merged, (name) => params[name]);
      assert.deepEqual(provides, c.expected.provides);
      for (const value of Object.values(params)) {
        if (value !== "") assert.ok(!JSON.stringify(provides).includes(JSON.stringify(value)));
      }
    });
  }
});

describe("kinds.json", () => {
  for (const c of vectors("kinds")) {
    test(c.name, () => {
      const merged = mergePacks(c.packs);
      assert.deepEqual(advertise(merged, c.document), c.expected);
    });
  }
});

describe("check_kind", () => {
  // The core's own unit cases for a kind's name (core/src/kinds.rs), reasons included.
  test("valid and invalid kinds, with the core's reasons", () => {
    assert.equal(checkKind("build.docker:amd64/v2"), null);
    assert.equal(checkKind("é".repeat(128)), null, "256 UTF-8 bytes is the limit");
    assert.equal(checkKind(""), "is empty");
    assert.equal(checkKind("é".repeat(129)), "is 258 bytes, at most 256 allowed");
    assert.equal(checkKind("a*b"), "has `*` other than as `*` alone or a trailing `.*`");
    assert.equal(checkKind("with space"), "has ' ': no white space or control characters");
    assert.equal(checkKind("tab\there"), "has '\\t': no white space or control characters");
    assert.match(checkKind("nbsp\u00a0"), /no white space or control characters$/);
    assert.equal(checkKind("bell\u0007"), "has '\\u{7}': no white space or control characters");
  });
});

describe("numbers.json", () => {
  // The runner's own conversion: refuse what a Struct cannot carry, then protobuf-es's.
  const send = (value, path) => {
    const found = uncarried(value, path);
    if (found) return { error: found };
    return { sent: toJson(StructSchema, fromJson(StructSchema, value)) };
  };
  for (const c of vectors("numbers")) {
    test(c.name, () => {
      if (c.kind === "send") {
        const got = send(JSON.parse(c.json), c.path);
        if ("error_path" in c) {
          assert.ok(got.error, `expected a refusal at ${c.error_path}`);
          assert.equal(got.error.path, c.error_path);
          assert.match(got.error.reason, /2\^53|NaN/);
        } else {
          assert.deepEqual(got.sent, c.sent);
        }
      } else {
        c.numbers.forEach((n, i) => {
          const value = toJson(ValueSchema, fromJson(ValueSchema, n));
          assert.equal(Number.isInteger(value), c.integers[i], `${n}`);
        });
      }
    });
  }
});
