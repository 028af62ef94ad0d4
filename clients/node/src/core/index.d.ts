// Types for the capability core (src/core/*.js): the same merge, redaction, diff, limit, kind
// and pack rules as the Rust `switchyard-core`.

export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };
export type JsonObject = { [key: string]: JsonValue };

/** A tier of a capability document, in merge order. */
export type Tier = "base" | "static" | "dynamic" | "override" | "operator";
export declare const TIERS: readonly Tier[];

export interface Limits {
  max_serialized_bytes: number;
  max_depth: number;
  max_key_bytes: number;
  max_array_items: number;
}
export declare const DEFAULT_LIMITS: Readonly<Limits>;
/** Limits from a partial object; absent fields take the defaults. */
export declare function limitsFrom(partial?: Partial<Limits>): Limits;
export interface Violation {
  path: string;
  reason: string;
}
/** Every violation of `value` as a whole document (depth 1 at its root), including its size. */
export declare function violations(limits: Limits, value: unknown): Violation[];

/** One part of a tier that was not applied, and why. */
export interface Rejection {
  tier: Tier | null;
  path: string;
  reason: string;
}

/** A tier merge: the document, its provenance and what was rejected. */
export declare class Merged {
  document: JsonObject;
  /** Dotted leaf path → the tier whose value is there. */
  provenance: Map<string, Tier>;
  rejections: Rejection[];
  /** Provenance as `{path: tier}`, sorted by path. */
  provenanceObject(): Record<string, Tier>;
  /** Merges one more tier on top. */
  apply(tier: Tier, value: unknown, limits?: Limits): void;
}
/** Merges tiers in the order given over `{}` (RFC 7386), with provenance and rejections. */
export declare function mergeTiers(tiers: [Tier, unknown][], limits?: Limits): Merged;

/** What a redacted value becomes. */
export declare const MARKER: "[redacted]";
export declare function keyWords(key: string): string[];
export declare function isSensitiveKey(key: string): boolean;
/** The static tier's `sensitive` entries, ASCII-lowercased. */
export declare function declaredSensitive(staticTier: unknown): Set<string>;
/**
 * Redacts `doc` in place (values under sensitive keys, and strings holding a secret of a known
 * shape); returns the dotted paths changed.
 */
export declare function redact(doc: unknown, extra?: Set<string>): string[];

/**
 * The known shapes of secrets, as core/src/secrets.rs has them: [expression, the capture group
 * that is the secret (0: the whole match), whether it must also look like a credential]. An
 * expression may start with `(?i)`, which JavaScript reads as the `i` flag.
 */
export declare const PATTERNS: ReadonlyArray<
  readonly [pattern: string, group: number, credentialCheck: boolean]
>;
/**
 * Whether a `Bearer`/`Basic` credential looks like one: a digit, a symbol, or an uppercase letter
 * after its first character.
 */
export declare function looksLikeCredential(secret: string): boolean;
/** Whether `text` holds a secret of a known shape. */
export declare function containsSecret(text: string): boolean;
/** `text` with every secret of a known shape replaced by `[redacted]`; the rest is kept. Idempotent. */
export declare function redactText(text: string): string;

export interface PatchOperation {
  op: "add" | "remove" | "replace" | "move" | "copy" | "test";
  path: string;
  from?: string;
  value?: JsonValue;
}
export declare class DiffError extends Error {
  code: "wrong_generation" | "over_limits" | "operation_failed" | "not_an_object";
  /** The failing operation's index, for `operation_failed`. */
  index?: number;
}
/** The RFC 6902 patch from `from` to `to` (empty when equal). */
export declare function diff(from: JsonObject, to: JsonObject): PatchOperation[];
/** Applies a patch made against `baseGeneration` to `held` (generation `heldGeneration`); throws DiffError. */
export declare function applyDiff(
  held: JsonObject,
  heldGeneration: number | bigint,
  baseGeneration: number | bigint,
  patch: PatchOperation[],
  limits?: Limits,
): JsonObject;

export interface PackParam {
  description?: string;
  /** Absent or null: the parameter is required. */
  default?: JsonValue;
  sensitive?: boolean;
}
export interface ProvidedCapability {
  version: string;
  params?: Record<string, PackParam>;
}
export interface PackDeclaration {
  id: string;
  handlers?: string[];
  provides?: Record<string, ProvidedCapability>;
  /** Capabilities its handlers need (`ai.llm@1`, or a name alone for any version); see `advertise`. */
  requires?: string[];
}
export interface PackRejection {
  pack: string;
  kind: "pack" | "handler" | "capability";
  id: string;
  reason: string;
}
export interface MergedPacks {
  packs: string[];
  /** Task kind → the pack that handles it. */
  handlers: Map<string, string>;
  provides: Map<string, { pack: string; capability: ProvidedCapability }>;
  /** Task kind → the `requires` of the pack whose registration of the kind won (absent when none). */
  requires: Map<string, string[]>;
  rejections: PackRejection[];
}
/** A handler kind withdrawn from what a runner advertises, and why. */
export interface Withdrawal {
  kind: string;
  /** The required capability that is not there, as the pack wrote it. */
  capability: string;
  /** `not provided`, `unhealthy[: reason]`, `version V, not major M`, `not a capability ref (name@major)`. */
  problem: string;
  /** `handler KIND withdrawn: needs CAPABILITY, PROBLEM`: reported with the DEGRADED status. */
  reason: string;
}
/** What a runner advertises: the kinds it handles now (sorted), and those withdrawn. */
export interface Advertised {
  kinds: string[];
  withdrawn: Withdrawal[];
}
export interface ProvidesEntry {
  version: string;
  healthy: boolean;
  reason?: string;
}
/** First registration wins; rejections are reported, never thrown. */
export declare function mergePacks(packs: PackDeclaration[]): MergedPacks;
/** The `provides` subtree; `lookup` answers parameter values (never copied into the result). */
export declare function resolveParams(
  merged: MergedPacks,
  lookup: (name: string) => string | undefined | null,
): Record<string, ProvidesEntry>;
/** `capability NAME unhealthy: REASON` for each unhealthy capability. */
export declare function unhealthyReasons(provides: Record<string, ProvidesEntry>): string[];
export declare function parsesLeniently(text: unknown): boolean;
/** The numeric part of a version as the core reads it leniently, or undefined. */
export declare function parseLenient(text: unknown): { major: bigint; minor: bigint; patch: bigint } | undefined;
/**
 * The kinds the merged packs handle given the runner's document (its `provides` subtree): a kind
 * whose pack requires a capability that is missing, unhealthy or of another major version is withdrawn.
 */
export declare function advertise(merged: MergedPacks, document: unknown): Advertised;
/** Why a required capability (`name@major` or `name`) is not there in `document`, or null. */
export declare function requirementProblem(required: string, document: unknown): string | null;

/** The longest task kind, in UTF-8 bytes (256). */
export declare const MAX_KIND_BYTES: number;
/** The most kind patterns one runner advertises (1024). */
export declare const MAX_PATTERNS: number;
/** What is wrong with a task kind (`is empty`, ...), or null when it is valid. */
export declare function checkKind(kind: unknown): string | null;

export declare function canonical<T>(value: T): T;
export declare function jsonEqual(a: unknown, b: unknown): boolean;
export declare function clone<T>(value: T): T;
export declare function serializedLen(value: unknown): number;
/** The largest magnitude a Struct number carries exactly as an integer (2^53 − 1). */
export declare const MAX_EXACT_INTEGER: number;
/** Why a number of larger magnitude is refused. */
export declare const BEYOND_EXACT: string;
/**
 * The first number in `value` a Struct cannot carry exactly, with its dotted path from `path`;
 * null if none.
 */
export declare function uncarried(value: unknown, path?: string): { path: string; reason: string } | null;
