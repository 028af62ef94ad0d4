#!/usr/bin/env bash
# Prints the README block named NAME: the fenced block (```sh, ```python, ...) that
# follows the line `<!-- readme:NAME -->` in README.md (the marker is an
# HTML comment, invisible on the rendered page). Tests run what it prints,
# so every command the README shows a newcomer is run by CI as written.
# Exits 1 if there is no such block.
#   tests/readme/block.sh NAME [README]
set -euo pipefail
name=${1:?usage: block.sh NAME [README]}
readme=${2:-$(dirname "$0")/../../README.md}
awk -v marker="<!-- readme:$name -->" '
  $0 == marker { found = 1; next }
  found && !inside && /^```[a-z]*$/ { inside = 1; next }
  inside && /^```$/ { done = 1; exit }
  inside { print }
  END { exit !(done) }
' "$readme" || { echo "block.sh: no \`\`\`sh block after <!-- readme:$name --> in $readme" >&2; exit 1; }
