#!/usr/bin/env bash
# Runs a POSIX suite program against a fresh directory on the kernel's tmpfs (/dev/shm),
# which checks the suite itself: every expectation must hold on a reference filesystem.
#   on_tmpfs.sh suite   POSIX_TESTS   [gtest args...]
#   on_tmpfs.sh persist POSIX_PERSIST
set -uo pipefail
mode=$1 bin=$2
shift 2
base=${WARPFS_TMPFS_BASE:-/dev/shm}
if [[ $(stat -f -c %T "$base") != tmpfs ]]; then
  echo "on_tmpfs.sh: $base is not a tmpfs" >&2
  exit 2
fi
dir=$(mktemp -d "$base/warpfs-posix.XXXXXX") || exit 2
# The permission tests run as uid 65534 and must be able to reach the directory.
chmod 0755 "$dir"
trap 'rm -rf "$dir"' EXIT
case $mode in
  suite)
    WARPFS_TEST_DIR=$dir "$bin" "$@"
    ;;
  persist)
    "$bin" populate "$dir/tree" && "$bin" verify "$dir/tree"
    ;;
  *)
    echo "on_tmpfs.sh: mode must be suite or persist" >&2
    exit 2
    ;;
esac
