//! Two RDMA hosts in one guest, joined by a wire that loses packets for real
//! (docs/GUEST.md, "Two hosts on a wire"): host A has Soft-RoCE `rxea` on
//! veth `va0` (10.77.0.1) and soft-iWARP `siwa` on `va1` (10.77.1.1), host B
//! `rxeb` on `vb0` (10.77.0.2) and `siwb` on `vb1` (10.77.1.2). Policy
//! routing sends every packet for one host's address out of the other
//! host's veth end, so RDMA traffic between them crosses the veth pair and
//! its netem qdisc. The shell side is `testsuite/guest/twohosts.sh`; these
//! helpers wrap guest commands with it. Guest-only: the 10.77.0.0/16
//! addresses exist nowhere else (the guest runs with `-nic none`).

use super::{GuestCommand, GuestOutcome};
use std::time::Duration;

/// The wire's shell functions (`wire_setup`, `wire_loss`, `wire_flap`,
/// `wire_routes`, `wire_counters`), defined at the top of every wire command.
pub const WIRE_FUNCTIONS: &str = include_str!("../../guest/twohosts.sh");

/// Host A's RoCE address (rxea on va0).
pub const RXE_A: &str = "10.77.0.1";
/// Host B's RoCE address (rxeb on vb0).
pub const RXE_B: &str = "10.77.0.2";
/// Host A's iWARP address (siwa on va1).
pub const SIW_A: &str = "10.77.1.1";
/// Host B's iWARP address (siwb on vb1).
pub const SIW_B: &str = "10.77.1.2";

/// A guest command whose script may call the wire's shell functions.
pub fn wire_command(name: &str, script: &str) -> GuestCommand {
    GuestCommand::shell(name, format!("{WIRE_FUNCTIONS}\n{script}"))
}

/// Builds the wire (first command of a boot) and shows that RDMA between the
/// hosts crosses it: routes, then rping over rdma_cm on rxe and on siw from
/// A to B, each retried while its server starts; the `wire-counter` lines
/// after it show the packets sent on each end.
pub fn setup_command() -> GuestCommand {
    let rping = |port: u32, addr: &str| {
        format!(
            "timeout 60 rping -s -a {addr} -p {port} -C 20 >$TMPDIR/rping-srv-{port}.log 2>&1 &\n\
             srv=$!\n\
             ok=0\n\
             for i in 1 2 3 4 5; do\n\
               sleep 1\n\
               timeout 30 rping -c -a {addr} -p {port} -C 20 && {{ ok=1; break; }}\n\
             done\n\
             wait $srv\n\
             [ $ok = 1 ] || {{ echo \"rping to {addr} failed\"; cat $TMPDIR/rping-srv-{port}.log; exit 1; }}\n\
             echo \"rping to {addr}: 20 round trips\"\n"
        )
    };
    let script = format!(
        "wire_setup || {{ echo 'wire_setup failed'; exit 1; }}\n\
         ip rule\n\
         ip route get {RXE_B}\n\
         ip route get {RXE_A}\n\
         rdma link show\n\
         {}{}wire_counters\n",
        rping(7470, RXE_B),
        rping(7471, SIW_B)
    );
    wire_command("wire-setup", &script).timeout(Duration::from_secs(240))
}

/// The file a flap of [`across_lossy_wire`] logs to (its output stays out of
/// the command's, whose report must parse); [`counters_command`] shows it.
const FLAP_LOG: &str = "$TMPDIR/wire-flap.log";

/// Wraps `cmd` (a command of the same boot, after [`setup_command`]): netem
/// loss of `loss_percent` on every wire end, and `end` taken down for
/// `down` after `flap_after`, in the background, while `cmd` runs.
pub fn across_lossy_wire(
    mut cmd: GuestCommand,
    loss_percent: f64,
    end: &str,
    flap_after: Duration,
    down: Duration,
) -> GuestCommand {
    cmd.script = format!(
        "{WIRE_FUNCTIONS}\n\
         wire_loss {loss_percent} || exit 1\n\
         rm -f {FLAP_LOG}\n\
         ( sleep {}; wire_flap {end} {} ) >{FLAP_LOG} 2>&1 &\n\
         {}",
        flap_after.as_secs_f64(),
        down.as_secs_f64(),
        cmd.script
    );
    cmd
}

/// A command that waits (up to 120 s) for the last [`across_lossy_wire`]
/// flap to end, shows its log and prints the wire's counters
/// (`wire-counter` lines); it fails if the flap did not end.
pub fn counters_command(name: &str) -> GuestCommand {
    wire_command(
        name,
        &format!("wire_flap_wait {FLAP_LOG} 120 || exit 1\nwire_counters\n"),
    )
    .timeout(Duration::from_secs(150))
}

/// One wire end's counters, from a `wire-counter DEV tx=N dropped=N` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndCounters {
    /// The veth end (`va0`, `vb0`, `va1`, `vb1`).
    pub dev: String,
    /// Packets it sent.
    pub tx: u64,
    /// Packets its netem qdisc dropped.
    pub dropped: u64,
}

/// The `wire-counter` lines of command `name` in `out`, in order.
pub fn counters(out: &GuestOutcome, name: &str) -> Vec<EndCounters> {
    out.command(name)
        .map(|c| parse_counters(&c.output))
        .unwrap_or_default()
}

fn parse_counters(text: &str) -> Vec<EndCounters> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("wire-counter ")?.split_whitespace();
            let dev = w.next()?.to_string();
            let tx = w.next()?.strip_prefix("tx=")?.parse().ok()?;
            let dropped = w.next()?.strip_prefix("dropped=")?.parse().ok()?;
            Some(EndCounters { dev, tx, dropped })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_lines_parse() {
        let text = "noise\nwire-counter va0 tx=1020 dropped=11\nwire-counter vb0 tx=7 dropped=0\n\
                    wire-counter va1 tx=x dropped=1\n";
        assert_eq!(
            parse_counters(text),
            vec![
                EndCounters {
                    dev: "va0".into(),
                    tx: 1020,
                    dropped: 11
                },
                EndCounters {
                    dev: "vb0".into(),
                    tx: 7,
                    dropped: 0
                },
            ]
        );
    }

    #[test]
    fn the_flap_runs_beside_the_command() {
        let cmd = across_lossy_wire(
            GuestCommand::shell("x", "echo body\n"),
            1.0,
            "va0",
            Duration::from_secs(8),
            Duration::from_secs(2),
        );
        assert!(cmd.script.contains("wire_loss 1 ||"), "{}", cmd.script);
        assert!(
            cmd.script
                .contains("( sleep 8; wire_flap va0 2 ) >$TMPDIR/wire-flap.log 2>&1 &"),
            "{}",
            cmd.script
        );
        assert!(cmd.script.ends_with("echo body\n"));
    }
}
