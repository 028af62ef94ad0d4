// The capability tiers of a runner directory, read exactly as the Rust agent (and SheetBot)
// reads them: `.capabilities.json` (static), the output of the first of
// `.capabilities.dynamic.{sh,py,mjs,js,ts}` (dynamic; `getCapabilities(static)` is called, and
// awaited for JavaScript), and `.capabilities.override.json`. Each script runs in its own
// process, in the directory, with a timeout: a broken, failing or hanging script is a
// rejection, never a crash. Missing files are ignored. Scripts run as the Rust agent runs
// them: `.sh` sourced by `bash`, `.py` by `python3`, `.mjs`/`.js` imported by this runner's own
// `node` (`process.execPath`), `.ts` by `deno`; an interpreter that is not installed is a
// rejection naming it, and a script that outlives its timeout is killed with all it started.
import { spawn } from "node:child_process";
import { existsSync, readFileSync, statSync } from "node:fs";
import { basename, join, resolve } from "node:path";
import { isObject, kind } from "./core/json.js";
import { DEFAULT_LIMITS } from "./core/limits.js";
import { declaredSensitive, redact } from "./core/redact.js";
import { mergeTiers } from "./core/tier.js";

/** The dynamic-script extensions, in the order they are looked for. */
export const DYNAMIC_EXTENSIONS = Object.freeze(["sh", "py", "mjs", "js", "ts"]);

/**
 * @typedef {import("./core/tier.js").Rejection} Rejection
 * @typedef {{static?: object, dynamic?: object, override?: object, rejections: Rejection[]}} DirectoryTiers
 */

const reject = (tier, reason) => ({ tier, path: "", reason });

function readJson(path, tier) {
  let text;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    if (err.code === "ENOENT") return {};
    return { rejection: reject(tier, `reading ${path}: ${err.message}`) };
  }
  try {
    return { value: JSON.parse(text) };
  } catch (err) {
    return { rejection: reject(tier, `${path} is not valid JSON: ${err.message}`) };
  }
}

/** The dynamic script in `dir`, if any. */
export function dynamicScript(dir) {
  for (const ext of DYNAMIC_EXTENSIONS) {
    const path = join(dir, `.capabilities.dynamic.${ext}`);
    try {
      if (statSync(path).isFile()) return path;
    } catch {
      // not there
    }
  }
  return undefined;
}

const NODE_LOADER = [
  "import { pathToFileURL } from 'node:url';",
  "const [file, staticJson] = process.argv.slice(-2);",
  "const mod = await import(pathToFileURL(file).href);",
  "const caps = await mod.getCapabilities(JSON.parse(staticJson));",
  "process.stdout.write('\\n' + JSON.stringify(caps) + '\\n');",
].join("\n");

const PY_LOADER = [
  "import importlib.util, json, sys",
  "spec = importlib.util.spec_from_file_location('capabilities', sys.argv[1])",
  "module = importlib.util.module_from_spec(spec)",
  "spec.loader.exec_module(module)",
  "caps = module.getCapabilities(json.loads(sys.argv[2]))",
  "sys.stdout.write('\\n' + json.dumps(caps) + '\\n')",
].join("\n");

const DENO_LOADER = [
  "const [file, staticJson] = Deno.args;",
  "const mod = await import(new URL(file, 'file://').href);",
  "const caps = await mod.getCapabilities(JSON.parse(staticJson));",
  "console.log('\\n' + JSON.stringify(caps));",
].join("\n");

function scriptCommand(script, staticJson) {
  const ext = script.slice(script.lastIndexOf(".") + 1);
  switch (ext) {
    case "sh":
      return ["bash", ["-c", 'source "$1" && getCapabilities "$2"', "switchyard-dynamic", script, staticJson]];
    case "py":
      return ["python3", ["-c", PY_LOADER, script, staticJson]];
    case "mjs":
    case "js":
      return [process.execPath, ["--input-type=module", "-e", NODE_LOADER, script, staticJson]];
    case "ts":
      return ["deno", ["eval", "--ext=ts", DENO_LOADER, "--", script, staticJson]];
    default:
      return undefined;
  }
}

/** The JSON a script printed: all of its output, or else its last line that parses to an object. */
export function parseOutput(stdout) {
  try {
    return { value: JSON.parse(stdout.trim()) };
  } catch {
    // fall through to line by line
  }
  const lines = stdout.split(/\r?\n/).reverse();
  for (const line of lines) {
    try {
      const v = JSON.parse(line.trim());
      if (isObject(v)) return { value: v };
    } catch {
      // not this line
    }
  }
  return undefined;
}

/**
 * Runs a dynamic script with the static tier as input; resolves `{value}` or `{rejection}`.
 * @returns {Promise<{value?: object, rejection?: Rejection}>}
 */
export function runDynamic(dir, script, staticTier, timeoutMs) {
  const name = basename(script);
  // The script runs in `dir`, so it is handed by its absolute path: a relative one would be
  // resolved from `dir` again.
  const command = scriptCommand(resolve(script), JSON.stringify(staticTier));
  if (!command) {
    return Promise.resolve({ rejection: reject("dynamic", `${script} is not a supported script`) });
  }
  return new Promise((resolveRun) => {
    let stdout = "";
    let stderr = "";
    let settled = false;
    const done = (result) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolveRun(result);
    };
    // Its own process group, so a timeout kills whatever the script started too.
    const child = spawn(command[0], command[1], { cwd: dir, stdio: ["ignore", "pipe", "pipe"], detached: true });
    const killGroup = () => {
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {
        // already gone
      }
    };
    const timer = setTimeout(() => {
      killGroup();
      done({ rejection: reject("dynamic", `${name} timed out after ${Math.round(timeoutMs / 1000)}s`) });
    }, timeoutMs);
    child.stdout.setEncoding("utf8").on("data", (d) => (stdout += d));
    child.stderr.setEncoding("utf8").on("data", (d) => (stderr += d));
    child.on("error", (err) => {
      // ENOENT names the command whether the interpreter or the directory is missing.
      const reason =
        err.code === "ENOENT" && existsSync(dir)
          ? `${name} needs ${command[0]}, which is not installed (not on PATH)`
          : `${name} could not be started: ${err.message}`;
      done({ rejection: reject("dynamic", reason) });
    });
    child.on("close", (code, signal) => {
      if (code !== 0) {
        const tail = stderr.trimEnd().split("\n").slice(-3).join(" | ");
        const status = signal ? `signal ${signal}` : `exit status: ${code}`;
        done({ rejection: reject("dynamic", `${name} failed (${status}): ${tail}`) });
        return;
      }
      const parsed = parseOutput(stdout);
      if (!parsed) done({ rejection: reject("dynamic", `${name} printed no JSON object`) });
      else if (!isObject(parsed.value)) {
        done({ rejection: reject("dynamic", `${name} returned ${kind(parsed.value)}, not an object`) });
      } else done({ value: parsed.value });
    });
  });
}

/**
 * Reads the static, dynamic and override tiers of `dir`.
 * @returns {Promise<DirectoryTiers>}
 */
export async function readDirectory(dir, scriptTimeoutMs = 10_000) {
  /** @type {DirectoryTiers} */
  const tiers = { rejections: [] };
  const stat = readJson(join(dir, ".capabilities.json"), "static");
  if (stat.rejection) tiers.rejections.push(stat.rejection);
  else if (stat.value !== undefined) tiers.static = stat.value;
  const script = dynamicScript(dir);
  if (script) {
    const input = tiers.static !== undefined ? tiers.static : {};
    const ran = await runDynamic(dir, script, input, scriptTimeoutMs);
    if (ran.rejection) tiers.rejections.push(ran.rejection);
    else tiers.dynamic = ran.value;
  }
  const over = readJson(join(dir, ".capabilities.override.json"), "override");
  if (over.rejection) tiers.rejections.push(over.rejection);
  else if (over.value !== undefined) tiers.override = over.value;
  return tiers;
}

/** Every tier file a directory may hold (for change detection). */
export function tierFiles(dir) {
  return [
    join(dir, ".capabilities.json"),
    join(dir, ".capabilities.override.json"),
    ...DYNAMIC_EXTENSIONS.map((e) => join(dir, `.capabilities.dynamic.${e}`)),
  ];
}

/** Modification stamps of the tier files, to notice edits. */
export function stamps(dir) {
  return tierFiles(dir)
    .map((f) => {
      try {
        const s = statSync(f);
        return `${s.mtimeMs}:${s.size}`;
      } catch {
        return "-";
      }
    })
    .join("|");
}

/**
 * Merges base facts and a directory's tiers, then redacts (built-in key words plus the
 * static tier's `sensitive` list). Base `tags` apply only when no tier sets `tags`.
 * @param {Record<string, unknown>} base
 * @param {DirectoryTiers} tiers
 */
export function mergeDirectory(base, tiers, limits = DEFAULT_LIMITS) {
  const setsTags = [tiers.static, tiers.dynamic, tiers.override].some(
    (t) => isObject(t) && Object.prototype.hasOwnProperty.call(t, "tags"),
  );
  const baseTier = { ...base };
  if (setsTags) delete baseTier.tags;
  /** @type {[import("./core/tier.js").Tier, unknown][]} */
  const list = [["base", baseTier]];
  for (const tier of /** @type {const} */ (["static", "dynamic", "override"])) {
    if (tiers[tier] !== undefined) list.push([tier, tiers[tier]]);
  }
  const merged = mergeTiers(list, limits);
  merged.rejections.unshift(...tiers.rejections);
  redact(merged.document, tiers.static !== undefined ? declaredSensitive(tiers.static) : new Set());
  return merged;
}

