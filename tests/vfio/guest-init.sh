#!/bin/sh
# The guest's /init (busybox sh), built into the initramfs by run-guest.sh: mounts the
# pseudo filesystems, loads the VFIO and FUSE modules listed in /modules/order, finds the
# NVMe controller (PCI class 0x010802), runs /guest-tests.sh on it, prints WARPFS-GUEST-DONE
# and powers off. The nfs configuration loads FUSE and the NFS server and client modules
# instead and runs the NFS steps (no controller). It never exits: an exit of PID 1 would panic the kernel (and panic=-1 with
# QEMU's -no-reboot would end the run, but without the done marker).
export PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/ TMPDIR=/tmp

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp

# The configuration run-guest.sh chose: warpfs.config=single|multi|nfs|tcp on the kernel command
# line.
config=single
read -r cmdline </proc/cmdline
for arg in $cmdline; do
  case $arg in
    warpfs.config=*) config=${arg#warpfs.config=} ;;
    warpfs.selftest=1) export WARPFS_GUEST_SELFTEST=1 ;;  # see guest-tests.sh
  esac
done
echo "guest: $(uname -r), config $config, up $(cut -d' ' -f1 /proc/uptime) s"

# A module the kernel has built in, or that is already loaded, shows in /sys/module.
modules_ok=1
while read -r m; do
  [ -n "$m" ] || continue
  if ! insmod "/modules/$m.ko" 2>/tmp/insmod.err; then
    if [ -d "/sys/module/$(echo "$m" | tr - _)" ]; then
      echo "guest: $m already present"
    else
      echo "guest: insmod $m failed: $(cat /tmp/insmod.err)"
      modules_ok=0
    fi
  fi
done </modules/order
if [ "$modules_ok" = 1 ]; then
  echo "WARPFS-STEP modules PASS"
else
  echo "WARPFS-STEP modules FAIL"
fi

bdf=
case $config in nfs | tcp) bdf=- ;; esac  # no controller: the NFS or NVMe/TCP steps
for dev in /sys/bus/pci/devices/*; do
  [ -n "$bdf" ] && break
  if [ "$(cat "$dev/class")" = 0x010802 ]; then
    bdf=${dev##*/}
    break
  fi
done
if [ "$config" = tcp ]; then
  sh /guest-tcp.sh
elif [ "$bdf" = - ]; then
  sh /guest-tests.sh - "$config"
elif [ -n "$bdf" ]; then
  echo "WARPFS-STEP find-nvme PASS"
  echo "guest: NVMe controller at $bdf, $(cat /sys/bus/pci/devices/"$bdf"/vendor):$(cat /sys/bus/pci/devices/"$bdf"/device)"
  sh /guest-tests.sh "$bdf" "$config"
else
  echo "guest: no PCI function of class 0x010802 (NVMe):"
  grep -H . /sys/bus/pci/devices/*/class
  echo "WARPFS-STEP find-nvme FAIL"
fi

echo "guest: done after $(cut -d' ' -f1 /proc/uptime) s"
echo "WARPFS-GUEST-DONE"
sync
poweroff -f
# poweroff -f does not return; should it fail, try the magic SysRq key, and never let PID 1
# exit (run-guest.sh's time limit ends the machine then).
echo o >/proc/sysrq-trigger
while :; do sleep 60; done
