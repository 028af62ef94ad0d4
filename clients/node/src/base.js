// The base tier: facts the runner knows about its machine, shaped like the Rust agent's
// (`os`, `arch`, `hostname`, `cpu.{count,model}`, `memory.{total,free,available,unit}` in MB,
// `loadavg.{1min,5min,15min}`, `software.node`, and `tags` derived from the os and arch).
// `loadFacts` is cheap enough to refresh on every capability refresh.
import os from "node:os";
import { readFileSync } from "node:fs";
import { parsesLeniently } from "./core/pack.js";

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
  if (parsesLeniently(versionText)) {
    const nums = /^[vV]?(\d+)(?:\.(\d+))?(?:\.(\d+))?/.exec(versionText.trim());
    entry.major_version = Number(nums[1]);
    entry.minor_version = Number(nums[2] ?? 0);
    entry.patch_version = Number(nums[3] ?? 0);
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

/** Everything the runner knows about its machine: the base tier. */
export function baseFacts() {
  const cpus = os.cpus();
  const osn = osName();
  const arch = archName();
  return {
    os: osn,
    arch,
    hostname: os.hostname(),
    cpu: { count: cpus.length, model: (cpus[0]?.model ?? "").trim() },
    ...loadFacts(),
    software: { node: softwareEntry(process.versions.node) },
    tags: [osn, arch],
  };
}
