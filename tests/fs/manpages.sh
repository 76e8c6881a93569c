#!/usr/bin/env bash
# Each program's man page is installed, renders without a groff warning, and names every
# option its --help prints.   usage: manpages.sh MAN8_DIR PROGRAM...
set -uo pipefail
dir=${1:?man8 directory}
shift
for prog in "$@"; do
  name=$(basename "$prog")
  page=$dir/$name.8
  [[ -f $page ]] || { echo "FAIL: no $page"; exit 1; }
  warnings=$(groff -man -Tutf8 -ww -z "$page" 2>&1)
  [[ -z $warnings ]] || { echo "FAIL: $page: $warnings"; exit 1; }
  text=$(sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' "$page")
  help=$("$prog" --help 2>&1)
  options=$(grep -oE '(^|[ ,(\[])--?[A-Za-z][A-Za-z-]*|^ +[a-z_]+=' <<<"$help" | sed -E 's/^[ ,(\[]+//' | sort -u)
  [[ -n $options ]] || { echo "FAIL: no options found in $name --help"; exit 1; }
  for o in $options; do
    grep -qF -- "$o" <<<"$text" || { echo "FAIL: $page does not name $o (from $name --help)"; exit 1; }
  done
  echo "$name: $(wc -w <<<"$options") options, all in $page"
done
