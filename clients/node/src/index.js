// @switchyard/runner: the Switchyard runner for Node.js.
//
// Layout: `runner.js` (the Runner: session, leases, handlers, packs, the kinds it advertises,
// releases with their causes, drain), `capabilities.js` (the document the runner reports),
// `tiers.js` (the directory's static, dynamic and override tiers), `base.js` (detected base
// facts), `identity.js` (the canonical agent directory and the default agent name), `core/`
// (merge, redaction, diffs, limits, kinds and packs, as the Rust core does them), `cli.js`
// (prints the merged document), `gen/` (generated stubs).
export { Release, Runner, TaskFailure } from "./runner.js";
export { ReleaseCause } from "./gen/switchyard/v1/agent_service_pb.js";
export { Capabilities } from "./capabilities.js";
export { baseFacts, loadFacts, probedFacts } from "./base.js";
export { readDirectory, mergeDirectory, runDynamic, DYNAMIC_EXTENSIONS } from "./tiers.js";
export { AgentDirectoryError, agentDir, defaultAgentName } from "./identity.js";
export * as core from "./core/index.js";
