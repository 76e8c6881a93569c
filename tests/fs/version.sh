#!/usr/bin/env bash
# Every program answers --version and -V with "NAME VERSION" (the project's one version) and
# exit status 0.   usage: version.sh VERSION PROGRAM...
set -uo pipefail
want=${1:?version}
shift
for prog in "$@"; do
  name=$(basename "$prog")
  for flag in --version -V; do
    out=$("$prog" "$flag" 2>&1) || { echo "FAIL: $name $flag exited $?: $out"; exit 1; }
    [[ $out == "$name $want"* ]] || { echo "FAIL: $name $flag printed '$out', not '$name $want'"; exit 1; }
  done
  echo "$name: $out"
done
