// The capability core in JavaScript: the same merge, redaction, diff, limit and pack rules
// as the Rust `switchyard-core`, checked against the shared conformance vectors.
//
// Layout: `json.js` (ordering, safe keys, sizes), `limits.js` (document limits), `tier.js`
// (tier merge with provenance and rejections), `redact.js` (secret redaction), `secrets.js`
// (the known shapes of secrets, and their redaction from free text), `diff.js`
// (JSON Patch diffs and their checked application), `kinds.js` (the rules for a task kind's
// name), `pack.js` (handler packs, parameters, and the kinds a runner advertises).
export * from "./json.js";
export * from "./limits.js";
export * from "./tier.js";
export * from "./redact.js";
export * from "./secrets.js";
export * from "./diff.js";
export * from "./kinds.js";
export * from "./pack.js";
