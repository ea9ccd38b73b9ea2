#!/bin/sh
# Second stage of the msgr test guest, run by the guest's init inside the chroot
# into the host's (read-only) root. The runner copies this file into the job
# directory, which the guest sees as /run/msgr-job (writable), next to:
#   cmds        one line per command: "<index> <timeout-seconds> <name>"
#   cmd.<i>     the command, a shell script
# and this script leaves, per command, out.<i> (stdout+stderr) and rc.<i>
# (exit status; 124 = the per-command timeout hit), then status=done.
#
# Devices set up here (addresses exist only inside the guest):
#   rxe0  Soft-RoCE on lo          (verbs tests, out-of-band TCP on 127.0.0.1)
#   rxe1  Soft-RoCE on dummy d0    198.51.100.1/24  (rdma_cm over RoCE)
#   siw0  soft-iWARP on dummy d1   198.51.100.2/24  (rdma_cm over iWARP)
JOB=/run/msgr-job
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The root (and /tmp, which stays the host's so that binaries built there run)
# is read-only: scratch space is a directory on the /run tmpfs.
mkdir -p /run/tmp
chmod 1777 /run/tmp
export HOME=/run/tmp TMPDIR=/run/tmp MSGR_IN_GUEST=1
cd /run/tmp || exit 1

step() {
  "$@" >>$JOB/setup.log 2>&1 || {
    echo "setup step failed: $*" >>$JOB/setup.log
    echo "setup-failed" >$JOB/status
    exit 1
  }
}
step ip link set lo up
step rdma link add rxe0 type rxe netdev lo
step ip link add d0 type dummy
step ip addr add 198.51.100.1/24 dev d0
step ip link set d0 up
step ip link add d1 type dummy
step ip addr add 198.51.100.2/24 dev d1
step ip link set d1 up
step rdma link add rxe1 type rxe netdev d0
step rdma link add siw0 type siw netdev d1
rdma link show >>$JOB/setup.log 2>&1

# The marker that tests check before touching TEST-NET-2 addresses.
cat >/run/msgr-guest <<MARK
MSGR_IN_GUEST=1
rxe0=lo
rxe1=198.51.100.1
siw0=198.51.100.2
MARK
echo running >$JOB/status

while read -r i t name; do
  echo "[guest $(cut -d' ' -f1 /proc/uptime)s] command $i ($name), timeout ${t}s"
  timeout -k 5 "$t" sh $JOB/cmd.$i >$JOB/out.$i 2>&1 </dev/null
  rc=$?
  echo $rc >$JOB/rc.$i
  echo "[guest $(cut -d' ' -f1 /proc/uptime)s] command $i ($name) exit $rc"
done <$JOB/cmds
sync
echo done >$JOB/status
