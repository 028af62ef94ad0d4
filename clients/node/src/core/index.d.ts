// Types for the capability core (src/core/*.js): the same merge, redaction, diff, limit and
// pack rules as the Rust `switchyard-core`.

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
/** Redacts `doc` in place; returns the dotted paths changed. */
export declare function redact(doc: unknown, extra?: Set<string>): string[];

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
}
export interface PackRejection {
  pack: string;
  kind: "pack" | "handler" | "capability";
  id: string;
  reason: string;
}
export interface MergedPacks {
  packs: string[];
  handlers: Map<string, string>;
  provides: Map<string, { pack: string; capability: ProvidedCapability }>;
  rejections: PackRejection[];
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

export declare function canonical<T>(value: T): T;
export declare function jsonEqual(a: unknown, b: unknown): boolean;
export declare function clone<T>(value: T): T;
export declare function serializedLen(value: unknown): number;
