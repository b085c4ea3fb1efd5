#!/usr/bin/env bash
# Issue 33 item 3: public items and public fields per crate, counted in the source as text
# (`pub` without a restriction; `pub(crate)` and friends are not public). Tests (files under
# tests/ or named tests.rs, and everything after a `#[cfg(test)]` line) are left out.
# usage: scripts/issue33-probes/public-items.sh [CHECKOUT]
set -eu
cd "${1:-.}"
printf '%-8s %8s %8s %8s\n' crate lines items fields
for c in core remote redis replay app root; do
  dir=crates/$c/src; [ $c = root ] && dir=src
  [ -d "$dir" ] || continue
  files=$(find "$dir" -name '*.rs' ! -name tests.rs ! -path '*/tests/*' | sort)
  awk '/^ *#\[cfg\(test\)\]/ { skip = 1 } FNR == 1 { skip = 0 } !skip' $files >/tmp/pub-items.$$
  lines=$(wc -l </tmp/pub-items.$$)
  items=$(grep -cE '^\s*pub (async |const |unsafe )*(fn|struct|enum|trait|type|const|static|mod|use|union) ' /tmp/pub-items.$$ || true)
  fields=$(grep -cE '^\s*pub [a-z_][a-z_0-9]*: ' /tmp/pub-items.$$ || true)
  printf '%-8s %8s %8s %8s\n' $c $lines $items $fields
  rm -f /tmp/pub-items.$$
done
