// The base tier: facts the runner knows about its machine, detected as the Rust agent detects
// them (agent-rs/src/detect.rs): `os`, `arch`, `hostname`, `os_release` (the kernel), `linux`
// (`/etc/os-release`), `cpu.{count,model}`, `memory.{total,free,available,unit}` in MB,
// `loadavg.{1min,5min,15min}`, `software.<tool>` for the tools that answer (`TOOLS`, each probe
// time-limited; `node` is this runner's own when `node` is not on the PATH), `gpus` from
// `nvidia-smi` (index, uuid, name, memory, driver), `resources` (what the runner offers: CPU
// millicores, memory MB, the GPUs as devices; a tier may override or add to it), and `tags`
// derived from them. The parsing is
// held to the shared vectors in tests/conformance/detect.json. `baseFacts` starts no process;
// `probedFacts` runs the probes; `loadFacts` is cheap enough for every capability refresh.
import os from "node:os";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { parseLenient } from "./core/pack.js";

/** The tools probed: [name, program, the arguments that print its version]. */
export const TOOLS = [
  ["git", "git", ["--version"]],
  ["clang", "clang", ["--version"]],
  ["cmake", "cmake", ["--version"]],
  ["node", "node", ["--version"]],
  ["uv", "uv", ["--version"]],
  ["scons", "scons", ["--version"]],
  ["vboxmanage", "vboxmanage", ["--version"]],
  ["deno", "deno", ["--version"]],
  ["python3", "python3", ["--version"]],
  ["docker", "docker", ["--version"]],
  ["cargo", "cargo", ["--version"]],
  ["rustc", "rustc", ["--version"]],
  ["go", "go", ["version"]],
  ["java", "java", ["-version"]],
  ["gcc", "gcc", ["--version"]],
];

/** The query `nvidia-smi` answers, one GPU a row. */
export const NVIDIA_SMI_ARGS = [
  "--query-gpu=index,uuid,name,memory.total,driver_version",
  "--format=csv,noheader,nounits",
];

const stripAll = (text, prefix) => {
  while (text.startsWith(prefix)) text = text.slice(prefix.length);
  return text;
};

/** A token is a version if it starts with ASCII digits and contains a dot. */
const isVersion = (t) => /^[0-9]+(\.|$)/.test(t) && t.includes(".");

/**
 * The first version-looking token of a tool's output (`git version 2.39.5` → `2.39.5`,
 * `v20.11.1` → `20.11.1`, `go1.22.1` → `1.22.1`); undefined if none.
 */
export function versionIn(output) {
  for (const line of output.split(/\r?\n/)) {
    for (const tok of line.split(/[\s",()]/u)) {
      const t = stripAll(stripAll(tok, "v"), "go");
      if (isVersion(t)) return t.replace(/[^A-Za-z0-9]+$/, "");
    }
  }
  return undefined;
}

/** `/etc/os-release` as SheetBot reports it. */
export function osRelease(text) {
  const fields = new Map();
  for (const line of text.split(/\r?\n/)) {
    const at = line.indexOf("=");
    if (at >= 0) fields.set(line.slice(0, at).trim(), line.slice(at + 1).trim().replace(/^"+|"+$/g, ""));
  }
  const out = {};
  if (fields.has("NAME")) out.name = fields.get("NAME");
  if (fields.has("PRETTY_NAME")) out.pretty_name = fields.get("PRETTY_NAME");
  if (fields.has("VERSION_CODENAME")) out.versionCodename = fields.get("VERSION_CODENAME");
  if (fields.has("VERSION_ID")) {
    out.versionId = fields.get("VERSION_ID");
    out.release = softwareEntry(fields.get("VERSION_ID"));
  }
  return out;
}

const number = (text) => (/^[0-9]+$/.test(text) ? Number(text) : null);

/**
 * GPUs from `nvidia-smi`'s rows (`index, uuid, name, memory MB, driver`): a row of another shape
 * is left out, an unreadable number is null.
 */
export function parseNvidiaSmi(output) {
  const gpus = [];
  for (const line of output.split(/\r?\n/)) {
    const parts = line.split(",").map((p) => p.trim());
    if (parts.length === 5) {
      gpus.push({ index: number(parts[0]), uuid: parts[1], name: parts[2], memory_mb: number(parts[3]), driver: parts[4] });
    }
  }
  return gpus;
}

/**
 * What the runner offers: `cpu_millicores` (1,000 a CPU) and `memory_mb` when known, and every GPU
 * as a device (`index`, `uuid`, `model`, `memory_mb`).
 */
export function detectedResources(cpuCount, memoryTotalMb, gpus) {
  const out = {};
  if (cpuCount > 0) out.cpu_millicores = cpuCount * 1000;
  if (memoryTotalMb !== null && memoryTotalMb !== undefined) out.memory_mb = memoryTotalMb;
  out.gpus = gpus.map((g) => ({ index: g.index, uuid: g.uuid, model: g.name, memory_mb: g.memory_mb }));
  return out;
}

/** The tags detection derives: OS and architecture, `docker`, `gpu` and `nvidia`. */
export function detectedTags(osn, arch, software, gpus) {
  const tags = [osn, arch];
  if (Object.hasOwn(software, "docker")) tags.push("docker");
  if (gpus > 0) tags.push("gpu", "nvidia");
  return tags;
}

/** A program's standard output and error, or undefined if it is missing, fails or hangs. */
function run(program, args, timeoutMs) {
  return new Promise((resolve) => {
    execFile(program, args, { timeout: timeoutMs, killSignal: "SIGKILL", windowsHide: true }, (err, stdout, stderr) => {
      // Some tools (java) print their version on standard error.
      resolve(err ? undefined : `${stdout}\n${stderr}`);
    }).stdin?.end();
  });
}

/** What the probes find: `software`, `gpus` (when any), and the `resources` and `tags` derived from them. */
export async function probedFacts(timeoutMs = 5_000) {
  const found = await Promise.all(
    TOOLS.map(async ([name, program, args]) => {
      const output = await run(program, args, timeoutMs);
      return [name, output === undefined ? undefined : versionIn(output)];
    }),
  );
  const software = {};
  for (const [name, version] of found.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
    if (version !== undefined) software[name] = softwareEntry(version);
  }
  software.node ??= softwareEntry(process.versions.node);
  const smi = await run("nvidia-smi", NVIDIA_SMI_ARGS, timeoutMs);
  const gpus = smi === undefined ? [] : parseNvidiaSmi(smi);
  const out = {
    software,
    resources: detectedResources(os.cpus().length, loadFacts().memory.total, gpus),
    tags: detectedTags(osName(), archName(), software, gpus.length),
  };
  if (gpus.length > 0) out.gpus = gpus;
  return out;
}

/** Node's platform named as Rust's `std::env::consts::OS` (with macOS as `darwin`). */
export function osName(platform = process.platform) {
  return { win32: "windows", sunos: "solaris" }[platform] ?? platform;
}

/** Node's arch named as Rust's `std::env::consts::ARCH`. */
export function archName(arch = process.arch) {
  return (
    { x64: "x86_64", arm64: "aarch64", ia32: "x86", ppc64: "powerpc64", loong64: "loongarch64" }[arch] ??
    arch
  );
}

const MB = 1024 * 1024;

function meminfo() {
  try {
    const text = readFileSync("/proc/meminfo", "utf8");
    const field = (name) => {
      const m = new RegExp(`^${name}:\\s+(\\d+) kB`, "m").exec(text);
      return m ? Number(m[1]) * 1024 : undefined;
    };
    return { free: field("MemFree"), available: field("MemAvailable") };
  } catch {
    return {};
  }
}

/** `{version, major_version, minor_version, patch_version}` as the core's `software_entry`. */
export function softwareEntry(versionText) {
  const entry = { version: versionText };
  const parsed = parseLenient(versionText);
  if (parsed !== undefined) {
    entry.major_version = Number(parsed.major);
    entry.minor_version = Number(parsed.minor);
    entry.patch_version = Number(parsed.patch);
  }
  return entry;
}

/** Memory (MB) and load averages. */
export function loadFacts() {
  const info = meminfo();
  const free = info.free ?? os.freemem();
  const available = info.available ?? os.freemem();
  const round = (x) => Math.round(x * 100) / 100;
  const [one, five, fifteen] = os.loadavg();
  return {
    memory: {
      total: Math.floor(os.totalmem() / MB),
      free: Math.floor(free / MB),
      available: Math.floor(available / MB),
      unit: "MB",
    },
    loadavg: { "1min": round(one), "5min": round(five), "15min": round(fifteen) },
  };
}

function linuxRelease() {
  try {
    return { linux: osRelease(readFileSync("/etc/os-release", "utf8")) };
  } catch {
    return {};
  }
}

/**
 * What the runner knows about its machine without starting a process: the base tier before
 * `probedFacts` adds tools, GPUs and their tags.
 */
export function baseFacts() {
  const cpus = os.cpus();
  const osn = osName();
  const arch = archName();
  return {
    os: osn,
    arch,
    hostname: os.hostname(),
    os_release: softwareEntry(os.release()),
    ...linuxRelease(),
    cpu: { count: cpus.length, model: (cpus[0]?.model ?? "").trim() },
    ...loadFacts(),
    software: { node: softwareEntry(process.versions.node) },
    tags: [osn, arch],
  };
}
