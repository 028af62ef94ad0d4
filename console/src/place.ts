// A placement in a line, as people write it: the selector text when there
// is one, else the constraints it holds (tags, requirements, capabilities,
// tolerations, resources), as compact JSON.
import { toJson } from "@bufbuild/protobuf";

import { PlacementSchema, type Placement } from "./api";

export function placementText(p: Placement | undefined): string {
  if (!p) return "any agent";
  const json = toJson(PlacementSchema, p) as Record<string, unknown>;
  delete json.policy;
  const selector = json.selector;
  delete json.selector;
  const rest = Object.keys(json).length ? JSON.stringify(json) : "";
  const text = [selector, rest].filter(Boolean).join(" + ");
  return text || "any agent";
}
