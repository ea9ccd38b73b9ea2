# Two RDMA hosts in the one guest, joined by a wire of two veth pairs
# (sourced into guest commands by testsuite::guest::twohosts; docs/GUEST.md).
#
#   host A: va0 10.77.0.1 (rxea, RoCE)   va1 10.77.1.1 (siwa, iWARP)
#   host B: vb0 10.77.0.2 (rxeb, RoCE)   vb1 10.77.1.2 (siwb, iWARP)
#
# Both hosts live in the guest's initial network namespace: Linux 6.1's
# Soft-RoCE routes and receives only there (rxe_net.c opens its UDP socket
# on port 4791 in init_net and looks routes up in init_net), so an rxe device
# on a veth moved into another namespace never hears its peer. What keeps
# the hosts apart is routing: rules ahead of the local table send every
# packet the guest generates for one host's address out of the other host's
# veth end, so it crosses the wire (and its netem qdisc) instead of lo:
#   - "iif lo to <B>" (locally generated, to B) -> table: <B> dev va<p> src <A>
#   - "oif va<p>" (a lookup bound to A's end, as rxe's own route lookup and
#     rdma_cm's check of the route back to a requester are) -> the same table
# and the mirror image for A. A packet that arrives from the wire carries a
# local source address, which the guest accepts with accept_local=1 and
# rp_filter=0. The neighbours are static (ARP between two local addresses
# is not answered). Each table also holds an unreachable route behind the
# device route: while a wire end is down the peer is unreachable, as it would
# be from another machine, instead of being reached over lo.
WIRE_PAIRS="0 1"

# wire_routes: (re)installs the per-pair routes and neighbours; taking a
# veth end down flushes them, so run it after the end is up again.
wire_routes() {
  for p in $WIRE_PAIRS; do
    ip route replace 10.77.$p.2 dev va$p src 10.77.$p.1 table $((100 + p * 2))
    ip route replace 10.77.$p.1 dev vb$p src 10.77.$p.2 table $((101 + p * 2))
    ip neigh replace 10.77.$p.2 lladdr "$(cat /sys/class/net/vb$p/address)" dev va$p nud permanent
    ip neigh replace 10.77.$p.1 lladdr "$(cat /sys/class/net/va$p/address)" dev vb$p nud permanent
  done
}

# wire_setup: the veth pairs, addresses, rules, routes and RDMA devices.
wire_setup() {
  sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 || return 1
  sysctl -qw net.ipv4.conf.all.accept_local=1 net.ipv4.conf.default.accept_local=1 || return 1
  for p in $WIRE_PAIRS; do
    ip link add va$p type veth peer name vb$p || return 1
    for d in va$p vb$p; do
      sysctl -qw net.ipv4.conf.$d.rp_filter=0 net.ipv4.conf.$d.accept_local=1 || return 1
    done
    ip addr add 10.77.$p.1/32 dev va$p || return 1
    ip addr add 10.77.$p.2/32 dev vb$p || return 1
    ip link set va$p up && ip link set vb$p up || return 1
    ip rule add pref $((90 + p * 2)) oif va$p lookup $((100 + p * 2)) || return 1
    ip rule add pref $((91 + p * 2)) oif vb$p lookup $((101 + p * 2)) || return 1
    ip rule add pref $((100 + p * 2)) iif lo to 10.77.$p.2 lookup $((100 + p * 2)) || return 1
    ip rule add pref $((101 + p * 2)) iif lo to 10.77.$p.1 lookup $((101 + p * 2)) || return 1
    ip route add unreachable 10.77.$p.2 metric 1000 table $((100 + p * 2)) || return 1
    ip route add unreachable 10.77.$p.1 metric 1000 table $((101 + p * 2)) || return 1
  done
  # The local table after the wire's rules (it answers everything else).
  ip rule add pref 1000 lookup local && ip rule del pref 0 || return 1
  wire_routes || return 1
  rdma link add rxea type rxe netdev va0 || return 1
  rdma link add rxeb type rxe netdev vb0 || return 1
  rdma link add siwa type siw netdev va1 || return 1
  rdma link add siwb type siw netdev vb1 || return 1
}

# wire_loss PERCENT: netem loss on all four ends (both directions of both pairs).
wire_loss() {
  for d in va0 vb0 va1 vb1; do
    tc qdisc replace dev $d root netem loss "$1%" || return 1
  done
}

# wire_flap END DOWN_SECS: takes a veth end down, waits, brings it up and
# restores its routes; says when each step ended, by the guest's clock
# (under TCG, with the guest busy, `ip link set` can take seconds).
wire_flap() {
  echo "wire: $1 going down at $(wire_now)s"
  ip link set "$1" down
  echo "wire: $1 down at $(wire_now)s"
  sleep "$2"
  echo "wire: $1 going up at $(wire_now)s"
  ip link set "$1" up
  wire_routes
  echo "wire: $1 back up at $(wire_now)s"
}

# wire_flap_wait LOG SECS: waits until the flap logging to LOG is over.
wire_flap_wait() {
  i=0
  until grep -q ' back up at ' "$1" 2>/dev/null; do
    i=$((i + 1))
    [ $i -gt $(($2 * 10)) ] && { echo "wire: the flap did not end within $2 s"; return 1; }
    sleep 0.1
  done
  cat "$1"
}

wire_now() { cut -d' ' -f1 /proc/uptime; }

# wire_counters: packets each end sent and the netem drops, one line each:
#   wire-counter DEV tx=N dropped=N
wire_counters() {
  for d in va0 vb0 va1 vb1; do
    dropped=$(tc -s qdisc show dev $d | sed -n 's/.*(dropped \([0-9]*\),.*/\1/p' | head -n 1)
    echo "wire-counter $d tx=$(cat /sys/class/net/$d/statistics/tx_packets) dropped=${dropped:-0}"
  done
}
