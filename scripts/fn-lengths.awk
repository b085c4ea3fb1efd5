# Usage: awk -f scripts/fn-lengths.awk src/**/*.rs | sort -rn | head
# Prints "<lines> <file>:<line> <fn name>" for every fn item with a body (rustfmt layout:
# the body closes with `}` at the fn's own indentation).
match($0, /^ *(pub(\([a-z]+\))? )?(async )?(const )?(unsafe )?fn [A-Za-z_0-9]+/) {
    s = substr($0, RSTART, RLENGTH); n = s; sub(/.*fn /, "", n)
    match($0, /^ */); ind = RLENGTH
    if ($0 !~ /;$/ && $0 !~ /}$/) { name[ind] = n; start[ind] = FNR }
    next
}
/^ *}$/ {
    match($0, /^ */); ind = RLENGTH
    if (ind in name) { print FNR - start[ind] + 1, FILENAME ":" start[ind], name[ind]; delete name[ind] }
}
