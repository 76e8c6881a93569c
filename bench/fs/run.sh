#!/usr/bin/env bash
# bench/fs/run.sh: the filesystem comparison, called by `bench/run fs [--quick]`.
#
# Mounts, side by side in one run on the same machine and with the same sizes:
#   warpfs          the warpfs daemon over the emulated NVMe device, zero latency
#   warpfs_ssd      the same with -o latency_us=SSD_US (an SSD-like completion latency)
#   warpfs_watched  warpfs at zero latency with warpfs-stat --watch=0.1 asking it all along
#                   (what the live view costs; not in the default set: --fs to add it)
#   warpfs_wb       warpfs at zero latency with -o writeback_cache (the kernel's writeback
#                   cache; not in the default set: --fs to add it)
#   warpfs_uring    warpfs at zero latency with -o io_uring: requests through FUSE over
#                   io_uring (Linux 6.14; this script turns the fuse module's enable_uring
#                   on for the run and back after; not in the default set: --fs to add it)
#   null_uring      warpfs-null with -o io_uring: that transport's ceiling (fio rows only;
#                   not in the default set)
#   null            warpfs-null: a FUSE daemon that stores nothing, with warpfs's FUSE
#                   options and threads: the transport's ceiling (fio rows only)
#   passthrough_ll  libfuse's example (Debian's source, built here) over a tmpfs
#   passthrough_ll_dp  the same with -o default_permissions, as warpfs always mounts: the
#                   kernel checks permissions, and after each create, unlink, mkdir or rmdir
#                   it fetches the directory's attributes again (GETATTR) before the next
#                   check. warpfs's metadata rows on equal terms (metadata rows only)
#   fuse2fs         fuse2fs over an ext4 image
#   ext4_loop       the kernel's ext4 on a loop device over an image in RAM (durability
#                   rows only: fsync against a kernel filesystem)
#   tmpfs           the kernel's tmpfs (no daemon)
# Every image, and the tmpfs under passthrough_ll, lives in RAM (a tmpfs this script mounts),
# so the comparison is of software, not of this machine's disk. Then measures the idle CPU of
# each daemon, fio jobs (sequential 1 MiB read/write; random 4 KiB read/write at iodepth 1
# and 32 with 2 jobs; buffered and --direct=1), durability jobs (4 KiB random writes with
# fdatasync after each; 1 MiB appends with fsync every 16) and warpfs-bench-meta (flat, tree,
# small-file mix), one workload at a time across all filesystems so that the machine's noise
# hits them alike. Prints one JSON object per line and writes them, with PNG charts, to
# OUT_STEM.*. A missing tool (fio, passthrough_ll's source, fuse2fs, losetup) skips the rows
# that need it with a message. Everything it mounts, attaches or starts is unmounted,
# detached and stopped on exit, failure and signals.
#
#   bench/fs/run.sh --build DIR --out STEM [--quick] [--fs LIST] [--ssd-latency-us N]
#                   [--file-mb N] [--runtime-s N] [--files N] [--rounds N] [--prefill]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
all_fs=(warpfs warpfs_ssd null passthrough_ll passthrough_ll_dp fuse2fs ext4_loop tmpfs)
known_fs=("${all_fs[@]}" warpfs_watched warpfs_wb warpfs_uring null_uring)

usage() {
  cat >&2 <<'EOF'
usage: bench/run fs [--quick] [--fs LIST] [--ssd-latency-us N] [--file-mb N] [--runtime-s N]
                    [--files N] [--rounds N] [--prefill]
  --quick             reduced run (about 5 minutes): 256 MiB fio files, 2 s per fio job,
                      idle CPU over 10 s, 2000 files per metadata phase, 1000 small files
                      (default: 1024 MiB, 8 s, 30 s, 10000, 5000: about 17 minutes)
  --fs LIST           comma-separated subset of: warpfs,warpfs_ssd,null,passthrough_ll,
                      passthrough_ll_dp (the same with default_permissions: metadata rows
                      only),fuse2fs,ext4_loop,tmpfs,warpfs_watched (warpfs with a live-view
                      watcher),warpfs_wb (warpfs -o writeback_cache),warpfs_uring and
                      null_uring (warpfs and warpfs-null over FUSE over io_uring); the last
                      four not in the default set
  --ssd-latency-us N  warpfs_ssd's emulated completion latency (default 80)
  --file-mb N         fio file size in MiB
  --runtime-s N       measured seconds per fio job (plus a ramp of 1/4 of it, at most 2 s)
  --files N           files per metadata phase
  --rounds N          measure every fio, durability and metadata row N times (default 1),
                      each round all of them once more in a new order; the ratios are then
                      the median over the rounds of each round's ratio (two runs of a round
                      close together in time), beside the rounds' own
  --prefill           write every image in RAM (warpfs's emulated drives, ext4_loop's file)
                      in full before its mkfs, so that each of its blocks exists as a
                      drive's does: a sparse image charges whoever writes a block first the
                      tmpfs page allocation (about 6 us of warpfs's 42-46 us of daemon CPU a
                      mkdir, 2-core VM). Takes the images' whole size in RAM at the start
EOF
}

build="" stem="" quick=0 fs_list="" ssd_us=80 file_mb="" runtime="" meta_files="" rounds=1
prefill=0
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) stem=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --fs) fs_list=$2; shift 2 ;;
    --ssd-latency-us) ssd_us=$2; shift 2 ;;
    --file-mb) file_mb=$2; shift 2 ;;
    --runtime-s) runtime=$2; shift 2 ;;
    --files) meta_files=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --prefill) prefill=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench/fs: unknown option '$1'" >&2; usage; exit 2 ;;
  esac
done
[[ -n $build && -n $stem ]] || { echo "bench/fs: --build and --out are required" >&2; exit 2; }
for v in "$ssd_us" "${file_mb:-1}" "${runtime:-1}" "${meta_files:-1}" "$rounds"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "bench/fs: '$v' is not a number" >&2; exit 2; }
done
if ((quick)); then
  : "${file_mb:=256}" "${runtime:=2}" "${meta_files:=2000}"
  idle_s=10 mix_files=1000
else
  : "${file_mb:=1024}" "${runtime:=8}" "${meta_files:=10000}"
  idle_s=30 mix_files=5000
fi
((runtime >= 1 && file_mb >= 16 && meta_files >= 1 && rounds >= 1)) ||
  { echo "bench/fs: sizes too small" >&2; exit 2; }
ramp_ms=$((runtime * 250 < 2000 ? runtime * 250 : 2000))
ramp_s=$(printf '%d.%03d' $((ramp_ms / 1000)) $((ramp_ms % 1000)))
# Every filesystem gets the same size: the fio file, the metadata runs and room to spare.
img_mb=$((file_mb * 2 + 1024))
fses=("${all_fs[@]}")
if [[ -n $fs_list ]]; then
  IFS=, read -r -a fses <<<"$fs_list"
  for f in "${fses[@]}"; do
    [[ " ${known_fs[*]} " == *" $f "* ]] || { echo "bench/fs: unknown filesystem '$f'" >&2; exit 2; }
  done
fi

# --- what the run needs ---------------------------------------------------------------------
warpfs_bin=$build/fs/daemon/warpfs
mkfs_bin=$build/mkfs/mkfs.warpfs
stat_bin=$build/fs/daemon/warpfs-stat
meta_bin=$build/bench/warpfs-bench-meta
null_bin=$build/bench/warpfs-null
pll_src=/usr/share/doc/libfuse3-dev/examples/passthrough_ll.c
pll_bin=$build/bench/passthrough_ll
need() { command -v "$1" >/dev/null || { echo "bench/fs: $1 not found ($2)" >&2; exit 1; }; }
has() { [[ " ${fses[*]} " == *" $1 "* ]]; }
# Leaves a filesystem out of the run, saying why (a tool it needs is missing).
skip_fs() {  # FS REASON
  has "$1" || return 0
  echo "bench/fs: skipping $1: $2" >&2
  local keep=() f
  for f in "${fses[@]}"; do [[ $f == "$1" ]] || keep+=("$f"); done
  fses=("${keep[@]}")
}
[[ $(id -u) -eq 0 ]] || { echo "bench/fs: must run as root (it mounts tmpfs and FUSE)" >&2; exit 1; }
[[ -c /dev/fuse ]] || { echo "bench/fs: /dev/fuse is missing" >&2; exit 1; }
need fusermount3 "apt-get install fuse3"
need python3 "apt-get install python3"
for b in "$warpfs_bin" "$mkfs_bin" "$meta_bin"; do
  [[ -x $b ]] || { echo "bench/fs: $b is not built" >&2; exit 1; }
done
have_fio=1
if ! command -v fio >/dev/null; then
  have_fio=0
  echo "bench/fs: fio not found (apt-get install fio): no fio or durability rows" >&2
  skip_fs null "it is measured by fio jobs only"
  skip_fs null_uring "it is measured by fio jobs only"
  skip_fs ext4_loop "it is measured by fio jobs only"
fi
[[ -x $null_bin ]] || skip_fs null "$null_bin is not built (libfuse3-dev)"
[[ -x $null_bin ]] || skip_fs null_uring "$null_bin is not built (libfuse3-dev)"
uring_param=/sys/module/fuse/parameters/enable_uring
uring_was=  # enable_uring before this run, put back at exit
if has warpfs_uring || has null_uring; then
  was=$(cat "$uring_param" 2>/dev/null) || was=
  if [[ -n $was ]] && { echo 1 >"$uring_param"; } 2>/dev/null; then
    uring_was=$was
  else
    skip_fs warpfs_uring "this kernel has no FUSE over io_uring ($uring_param)"
    skip_fs null_uring "this kernel has no FUSE over io_uring ($uring_param)"
  fi
fi
command -v fuse2fs >/dev/null || skip_fs fuse2fs "fuse2fs not found (apt-get install fuse2fs)"
if ! command -v mkfs.ext4 >/dev/null; then
  skip_fs fuse2fs "mkfs.ext4 not found (apt-get install e2fsprogs)"
  skip_fs ext4_loop "mkfs.ext4 not found (apt-get install e2fsprogs)"
fi
command -v losetup >/dev/null || skip_fs ext4_loop "losetup not found (apt-get install mount)"
[[ -e /dev/loop-control ]] || skip_fs ext4_loop "/dev/loop-control is missing (modprobe loop)"
# shellcheck disable=SC2046  # pkg-config's flags are words
if { has passthrough_ll || has passthrough_ll_dp; } && [[ ! -x $pll_bin || $pll_src -nt $pll_bin ]]; then
  why=""
  if [[ ! -r $pll_src ]]; then
    why="$pll_src missing (apt-get install libfuse3-dev)"
  elif ! cc -O2 -o "$pll_bin" "$pll_src" $(pkg-config fuse3 --cflags --libs); then
    why="building it from $pll_src failed"
  fi
  if [[ -n $why ]]; then
    has passthrough_ll && skip_fs passthrough_ll "$why"
    has passthrough_ll_dp && skip_fs passthrough_ll_dp "$why"
  fi
fi
((${#fses[@]})) || { echo "bench/fs: no filesystem left to measure" >&2; exit 1; }
# Which filesystems each part measures: the data-path fio jobs leave out ext4_loop, the
# durability jobs are for the FUSE daemons beside ext4_loop (tmpfs and fuse2fs have no
# durable store to flush to in RAM worth comparing), and the metadata programs need stored
# bytes (smallfile_mix checks them): not null, and not ext4_loop.
fio_fses=() dur_fses=() meta_fses=()
if ((have_fio)); then
  for f in "${fses[@]}"; do
    [[ $f == ext4_loop || $f == passthrough_ll_dp ]] || fio_fses+=("$f")
    [[ $f == fuse2fs || $f == tmpfs || $f == passthrough_ll_dp ]] || dur_fses+=("$f")
  done
fi
for f in "${fses[@]}"; do
  [[ $f == null || $f == null_uring || $f == ext4_loop ]] || meta_fses+=("$f")
done
# QD32 buffered jobs: Linux runs buffered libaio synchronously (io_submit returns after the
# copy), so those jobs would be at depth 1. io_uring hands a buffered read or write it cannot
# finish at once to its worker threads, which keeps several in flight. Where fio or the
# kernel lacks io_uring, 16 psync jobs (depth 1 each) stand in. O_DIRECT libaio is
# asynchronous on FUSE (the kernel's async direct I/O): the _direct jobs keep libaio.
qd_engine=io_uring
if ((have_fio)) && ! { fio --enghelp 2>/dev/null | grep -qw io_uring &&
  fio --name=probe --filename=/dev/shm/warpfs-bench-probe.$$ --size=64k --rw=read \
    --ioengine=io_uring --iodepth=4 --output=/dev/null >/dev/null 2>&1; }; then
  qd_engine=psync
  echo "bench/fs: fio's io_uring engine does not work here: QD32 buffered jobs are 16 psync jobs" >&2
fi
rm -f "/dev/shm/warpfs-bench-probe.$$"
report() { python3 "$here/report.py" "$@"; }
out=$stem.jsonl
: >"$out"
emit() { tee -a "$out"; }  # stdin: JSON lines
round=0  # the measured round (--rounds), 1 ... rounds
# A measured line, with its round where there are several (report.py pairs them by round).
emit_measured() {
  if ((rounds > 1)); then sed "s/^{/{\"round\":$round,/" | emit; else emit; fi
}

# --- mounts, daemons and their cleanup ----------------------------------------------------------
work=$(mktemp -d /var/tmp/warpfs-bench-fs.XXXXXX)
tmpfs_mounts=()          # mounted tmpfs instances, unmounted last
declare -A dir pid_of    # fs -> directory measured; FUSE fs -> daemon pid
watcher=                 # warpfs-stat --watch beside warpfs_watched
loopdev=                 # ext4_loop's loop device, detached before the tmpfs under it goes
cleanup() {
  local rc=$? f p
  trap - EXIT INT TERM
  [[ -n $watcher ]] && kill "$watcher" 2>/dev/null
  for f in "${!pid_of[@]}"; do
    p=${pid_of[$f]}
    if mountpoint -q "$work/mnt/$f"; then
      fusermount3 -u "$work/mnt/$f" 2>/dev/null || umount -l "$work/mnt/$f" 2>/dev/null || true
    fi
    # A daemon ends itself once unmounted; one that does not is stopped.
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then
      kill "$p" 2>/dev/null || true
      sleep 1
      kill -9 "$p" 2>/dev/null || true
    fi
  done
  if [[ -n $loopdev ]]; then
    if mountpoint -q "$work/mnt/ext4_loop"; then
      umount "$work/mnt/ext4_loop" 2>/dev/null || umount -l "$work/mnt/ext4_loop" || true
    fi
    # A lazy unmount may keep the device busy a moment: a few tries, then say so.
    for _ in 1 2 3 4 5; do losetup -d "$loopdev" 2>/dev/null && break; sleep 0.5; done
    losetup "$loopdev" >/dev/null 2>&1 && echo "bench/fs: could not detach $loopdev" >&2
  fi
  for ((i = ${#tmpfs_mounts[@]} - 1; i >= 0; --i)); do
    umount "${tmpfs_mounts[i]}" 2>/dev/null || umount -l "${tmpfs_mounts[i]}" || true
  done
  [[ -n $uring_was ]] && echo "$uring_was" >"$uring_param"
  # A row that failed keeps the daemons' logs beside the results: its cause is in them.
  if [[ -s ${out:-} ]] && grep -q '"error":"[^"]' "$out" && [[ -d $work/logs ]]; then
    cp -r "$work/logs" "$stem-logs" && echo "bench/fs: a row failed; logs in $stem-logs" >&2
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mount_tmpfs() {  # NAME DIR SIZE_MB
  mkdir -p "$2"
  mount -t tmpfs -o "size=${3}m,mode=0755" "$1" "$2"
  tmpfs_mounts+=("$2")
}

# Starts a FUSE daemon in the foreground of a background job (so its pid is known) and waits
# for its mount. LOG gets its output; the log is shown if it does not mount.
start_daemon() {  # FS LOG CMD...
  local f=$1 log=$2
  shift 2
  "$@" >"$log" 2>&1 &
  pid_of[$f]=$!
  for _ in $(seq 200); do
    mountpoint -q "$work/mnt/$f" && return 0
    kill -0 "${pid_of[$f]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "bench/fs: $f did not mount on $work/mnt/$f; its log:" >&2
  cat "$log" >&2
  exit 1
}

# --prefill: the image written in full (zeroes), private to root as mkfs.warpfs wants it.
prefill_image() {
  ((prefill)) || return 0
  (umask 077 && dd if=/dev/zero of="$1" bs=1M count="$img_mb" conv=notrunc status=none)
}
# Room for every image: the warpfs images, fuse2fs's and ext4_loop's.
images=0
for f in "${fses[@]}"; do [[ $f == warpfs* || $f == fuse2fs || $f == ext4_loop ]] && ((++images)); done
mount_tmpfs fsbench-store "$work/store" $((img_mb * (images > 0 ? images : 1) + 256))
mkdir -p "$work/logs"
for f in "${fses[@]}"; do
  mkdir -p "$work/mnt/$f"
  dir[$f]=$work/mnt/$f
  case $f in
    warpfs | warpfs_ssd | warpfs_watched | warpfs_wb | warpfs_uring)
      lat=0
      [[ $f == warpfs_ssd ]] && lat=$ssd_us
      wb=
      [[ $f == warpfs_wb ]] && wb=,writeback_cache
      [[ $f == warpfs_uring ]] && wb=,io_uring
      prefill_image "$work/store/$f.img"
      "$mkfs_bin" -q --size "${img_mb}M" "emu:$work/store/$f.img"
      start_daemon "$f" "$work/logs/$f.log" "$warpfs_bin" -f -o "latency_us=$lat$wb" \
        "emu:$work/store/$f.img" "$work/mnt/$f"
      if [[ $f == warpfs_watched ]]; then
        [[ -x $stat_bin ]] || { echo "bench/fs: $stat_bin is not built" >&2; exit 1; }
        "$stat_bin" --json --watch=0.1 "$work/mnt/$f" >"$work/logs/watcher.jsonl" 2>&1 &
        watcher=$!
      fi
      ;;
    null)
      start_daemon "$f" "$work/logs/$f.log" "$null_bin" -f "$work/mnt/$f"
      ;;
    null_uring)
      start_daemon "$f" "$work/logs/$f.log" "$null_bin" -f -o io_uring "$work/mnt/$f"
      ;;
    passthrough_ll)
      mount_tmpfs fsbench-pll "$work/pll-source" "$img_mb"
      start_daemon "$f" "$work/logs/$f.log" "$pll_bin" -f -o "source=$work/pll-source" \
        "$work/mnt/$f"
      ;;
    passthrough_ll_dp)
      mount_tmpfs fsbench-pll-dp "$work/pll-dp-source" "$img_mb"
      start_daemon "$f" "$work/logs/$f.log" "$pll_bin" -f \
        -o "source=$work/pll-dp-source,default_permissions" "$work/mnt/$f"
      ;;
    fuse2fs)
      mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$work/store/ext4.img" \
        "${img_mb}M" >"$work/logs/mkfs.ext4.log" 2>&1 ||
        { cat "$work/logs/mkfs.ext4.log" >&2; exit 1; }
      start_daemon "$f" "$work/logs/$f.log" fuse2fs "$work/store/ext4.img" "$work/mnt/$f" -f
      ;;
    ext4_loop)
      truncate -s "${img_mb}M" "$work/store/ext4-loop.img"
      prefill_image "$work/store/ext4-loop.img"
      loopdev=$(losetup -f --show "$work/store/ext4-loop.img") ||
        { echo "bench/fs: losetup of $work/store/ext4-loop.img failed" >&2; exit 1; }
      mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$loopdev" \
        >"$work/logs/mkfs.ext4-loop.log" 2>&1 || { cat "$work/logs/mkfs.ext4-loop.log" >&2; exit 1; }
      mount -t ext4 "$loopdev" "$work/mnt/$f"
      ;;
    tmpfs)
      mount_tmpfs fsbench-tmpfs "$work/mnt/$f" "$img_mb"
      ;;
  esac
done

# utime + stime (clock ticks) of a daemon, all its threads; nothing for no pid (tmpfs).
cpu_ticks() {
  [[ -n ${1:-} ]] || return 0
  local a
  read -r -a a <<<"$(sed 's/.*) //' "/proc/$1/stat")"
  echo $((a[11] + a[12]))  # fields 14 and 15 of proc(5): a[0] is field 3
}
# Context switches of all a daemon's threads: how often it woke up.
ctx_switches() {
  cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { n += $2 } END { print n + 0 }'
}
tck=$(getconf CLK_TCK)

commit=$(git -C "$here/../.." rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$( { git -C "$here/../.." status --porcelain -- fs nvme cache blockdev 2>/dev/null || true; } | wc -l)
started=$(date +%s)
report info --fields "$(printf '{"host":"%s","kernel":"%s","nproc":%d,"quick":%s,"file_mb":%d,"image_mb":%d,"runtime_s":%d,"ramp_s":%s,"idle_s":%d,"meta_files":%d,"mix_files":%d,"ssd_latency_us":%d,"rounds":%d,"prefill":%s,"git":"%s","dirty_core_files":%d,"fio":"%s","fs":"%s","qd32_buffered_engine":"%s","loadavg_start":"%s","date":"%s"}' \
  "$(hostname -s)" "$(uname -r)" "$(nproc)" "$( ((quick)) && echo true || echo false)" \
  "$file_mb" "$img_mb" "$runtime" "$ramp_s" "$idle_s" "$meta_files" "$mix_files" "$ssd_us" \
  "$rounds" "$( ((prefill)) && echo true || echo false)" "$commit" "$dirty" "$( ((have_fio)) && fio --version || echo none)" "${fses[*]}" \
  "$qd_engine" "$(cut -d' ' -f1-3 /proc/loadavg)" "$(date -u +%FT%TZ)")" | emit
# Fields every line of a filesystem carries: the emulated device's latency for warpfs.
declare -A fs_fields=([warpfs]='{"latency_us":0}' [warpfs_ssd]="{\"latency_us\":$ssd_us}"
  [warpfs_watched]='{"latency_us":0,"watcher_interval_s":0.1}'
  [warpfs_wb]='{"latency_us":0,"writeback_cache":true}' [null]='{}' [passthrough_ll]='{}'
  [warpfs_uring]='{"latency_us":0,"io_uring":true}' [null_uring]='{"io_uring":true}'
  [passthrough_ll_dp]='{"default_permissions":true}'
  [fuse2fs]='{}' [ext4_loop]='{}' [tmpfs]='{}')
# The next rotation of a list of filesystems, in `order`: a different one goes first each
# time, so that none always follows a write-heavy job.
rotate=0
next_order() {  # FS...
  local n=$#
  local a=("$@")
  order=("${a[@]:rotate % n}" "${a[@]:0:rotate % n}")
  rotate=$((rotate + 1))
}

# Runs one fio job on FS and prints its result line. The daemon's CPU is sampled over fio's
# measured window: WINDOW "measured" for a time_based job (ramp_s after fio starts, then
# runtime), "job" for one that runs to its size (fio's whole run; the rate's seconds are
# then fio's job_runtime).
run_fio() {  # FS WORKLOAD IO METRIC WINDOW FILE FIELDS_JSON FIO_ARGS...
  local f=$1 workload=$2 io=$3 metric=$4 window=$5 file=$6 fields=$7
  shift 7
  local pid=${pid_of[$f]:-} json=$work/logs/fio-$f-$workload.json sampler="" err="" c0 c1
  rm -f "$work/cpu0" "$work/cpu1"
  if [[ $window == measured ]]; then
    (
      sleep "$ramp_s"
      cpu_ticks "$pid" >"$work/cpu0"
      sleep "$runtime"
      cpu_ticks "$pid" >"$work/cpu1"
    ) &
    sampler=$!
  else
    cpu_ticks "$pid" >"$work/cpu0"
  fi
  timeout $((runtime * 4 + 120)) fio --name="$workload" --filename="${dir[$f]}/$file" \
    --group_reporting --output-format=json --output="$json" "$@" \
    >"$work/logs/fio.out" 2>&1 || err=$(tail -c 300 "$work/logs/fio.out" | tr '\n' ' ')
  if [[ -n $sampler ]]; then
    wait "$sampler" || true
  else
    cpu_ticks "$pid" >"$work/cpu1"
  fi
  c0=$(cat "$work/cpu0" 2>/dev/null || true) c1=$(cat "$work/cpu1" 2>/dev/null || true)
  local ticks=null
  [[ -n $c0 && -n $c1 ]] && ticks=$((c1 - c0))
  report fio --fs "$f" --workload "$workload" --io "$io" --metric "$metric" --window "$window" \
    --ticks "$ticks" --tck "$tck" --error "$err" --json "$json" --fields "$fields" \
    --fs-fields "${fs_fields[$f]}" | emit_measured
}

# --- fio: lay the file out once per filesystem --------------------------------------------------
for f in "${fio_fses[@]}" "${dur_fses[@]}"; do
  [[ -e ${dir[$f]}/fio.dat ]] && continue  # in both lists
  fio --name=layout --filename="${dir[$f]}/fio.dat" --size="${file_mb}M" --rw=write --bs=1M \
    --ioengine=psync --end_fsync=1 --output="$work/logs/layout-$f.txt" >/dev/null ||
    { echo "bench/fs: laying out the fio file on $f failed" >&2; cat "$work/logs/layout-$f.txt" >&2; exit 1; }
done

# --- idle CPU: all daemons mounted and idle, measured together ----------------------------------
sleep 2
declare -A idle0 idlec0
for f in "${fses[@]}"; do
  [[ -n ${pid_of[$f]:-} ]] || continue
  idle0[$f]=$(cpu_ticks "${pid_of[$f]}")
  idlec0[$f]=$(ctx_switches "${pid_of[$f]}")
done
sleep "$idle_s"
for f in "${fses[@]}"; do
  [[ -n ${pid_of[$f]:-} ]] || continue
  t1=$(cpu_ticks "${pid_of[$f]}")
  c1=$(ctx_switches "${pid_of[$f]}")
  report idle --fs "$f" --idle-s "$idle_s" --ticks $((t1 - idle0[$f])) --tck "$tck" \
    --ctx $((c1 - idlec0[$f])) --fields "${fs_fields[$f]}" | emit
done

# --- fio jobs -----------------------------------------------------------------------------------
# name rw bs iodepth numjobs metric
jobs=(
  "seqread_1m read 1M 1 1 mb_per_s"
  "seqwrite_1m write 1M 1 1 mb_per_s"
  "randread_4k_qd1 randread 4k 1 2 iops"
  "randread_4k_qd32 randread 4k 32 2 iops"
  "randwrite_4k_qd1 randwrite 4k 1 2 iops"
  "randwrite_4k_qd32 randwrite 4k 32 2 iops"
)
measure_fio() {
  for io in buffered direct; do
    ((${#fio_fses[@]})) || break
    direct=0
    [[ $io == direct ]] && direct=1
    for job in "${jobs[@]}"; do
      read -r name rw bs qd nj metric <<<"$job"
      engine=libaio
      if [[ $io == buffered && $qd -gt 1 ]]; then
        engine=$qd_engine
        [[ $engine == psync ]] && qd=1 nj=16
      fi
      next_order "${fio_fses[@]}"
      for f in "${order[@]}"; do
        run_fio "$f" "${name}_$io" "$io" "$metric" measured fio.dat \
          "{\"file_mb\":$file_mb,\"bs\":\"$bs\",\"iodepth\":$qd,\"jobs\":$nj,\"ioengine\":\"$engine\",\"runtime_s\":$runtime}" \
          --size="${file_mb}M" --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs="$nj" \
          --ioengine="$engine" --direct="$direct" --time_based --runtime="$runtime" \
          --ramp_time="${ramp_ms}ms"
      done
    done
  done

  # Four synchronous O_DIRECT writers of one file, 4 KiB at random (a database's threads): the
  # kernel serializes them on the inode lock unless the daemon allows parallel direct writes.
  if ((${#fio_fses[@]})); then
    next_order "${fio_fses[@]}"
    for f in "${order[@]}"; do
      run_fio "$f" randwrite_4k_psync4_direct direct iops measured fio.dat \
        "{\"file_mb\":$file_mb,\"bs\":\"4k\",\"iodepth\":1,\"jobs\":4,\"ioengine\":\"psync\",\"runtime_s\":$runtime}" \
        --size="${file_mb}M" --rw=randwrite --bs=4k --numjobs=4 --ioengine=psync --direct=1 \
        --time_based --runtime="$runtime" --ramp_time="${ramp_ms}ms"
    done
  fi
}

# --- durability: writes that must reach the device ----------------------------------------------
# 4 KiB random overwrites of the laid-out file with fdatasync after each (ops/s, time_based),
# and 1 MiB appends to a new file of file_mb MiB with fsync every 16 writes and at the end
# (MB/s over fio's run; capped at 4 x runtime, the rate stays right if the cap cuts it).
measure_durability() {
  if ((${#dur_fses[@]})); then
    next_order "${dur_fses[@]}"
    for f in "${order[@]}"; do
      run_fio "$f" durable_randwrite_4k_fdatasync durable iops measured fio.dat \
        "{\"file_mb\":$file_mb,\"bs\":\"4k\",\"iodepth\":1,\"jobs\":1,\"ioengine\":\"psync\",\"fdatasync\":1,\"runtime_s\":$runtime}" \
        --size="${file_mb}M" --rw=randwrite --bs=4k --fdatasync=1 --ioengine=psync \
        --time_based --runtime="$runtime" --ramp_time="${ramp_ms}ms"
    done
    next_order "${dur_fses[@]}"
    for f in "${order[@]}"; do
      rm -f "${dir[$f]}/append.dat"
      run_fio "$f" durable_append_1m_fsync16 durable mb_per_s job append.dat \
        "{\"file_mb\":$file_mb,\"bs\":\"1M\",\"iodepth\":1,\"jobs\":1,\"ioengine\":\"psync\",\"fsync\":16}" \
        --size="${file_mb}M" --rw=write --bs=1M --fsync=16 \
        --end_fsync=1 --ioengine=psync --runtime=$((runtime * 4))
      rm -f "${dir[$f]}/append.dat"
    done
  fi
}

# --- metadata and small files -------------------------------------------------------------------
measure_meta() {
  for layout in flat tree mix; do
    ((${#meta_fses[@]})) || break
    next_order "${meta_fses[@]}"
    for f in "${order[@]}"; do
      args=(--dir "${dir[$f]}" --files "$meta_files")
      [[ $layout == tree ]] && args+=(--tree)
      [[ $layout == mix ]] && args=(--dir "${dir[$f]}" --files "$mix_files" --mix)
      pid=${pid_of[$f]:-}
      [[ -n $pid ]] && args+=(--pid "$pid")
      if ! "$meta_bin" "${args[@]}" >"$work/logs/meta.out" 2>"$work/logs/meta.err"; then
        echo "bench/fs: warpfs-bench-meta ${args[*]} failed on $f:" >&2
        cat "$work/logs/meta.err" >&2
      fi
      report meta --fs "$f" --layout "$layout" --error "$(tail -c 300 "$work/logs/meta.err" | tr '\n' ' ')" \
        --fields "${fs_fields[$f]}" <"$work/logs/meta.out" | emit_measured
    done
  done
}

for ((round = 1; round <= rounds; ++round)); do
  ((rounds == 1)) || echo "bench/fs: round $round of $rounds" >&2
  measure_fio
  measure_durability
  measure_meta
done

# --- ratios and charts --------------------------------------------------------------------------
report info --key info_end --fields "$(printf '{"elapsed_s":%d,"loadavg_end":"%s"}' \
  $(($(date +%s) - started)) "$(cut -d' ' -f1-3 /proc/loadavg)")" | emit
report ratios "$out" | emit
if command -v gnuplot >/dev/null; then
  report charts "$out" "$stem" >&2 || echo "bench/fs: drawing the charts failed" >&2
else
  echo "bench/fs: gnuplot not found (apt-get install gnuplot-nox): no charts" >&2
fi
