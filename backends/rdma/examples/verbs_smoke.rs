//! Verbs smoke test: two RC queue pairs on one device, in one process,
//! connected by hand (QPN/PSN/GID exchange), then N send/recv round trips
//! (plain, with immediate data, inline), an RDMA write and an RDMA read, each
//! verified byte for byte, and a QP forced into ERR to check that posted
//! receives are flushed.
//!
//!     verbs_smoke [DEVICE (default rxe0)] [ROUNDS (default 100)]
//!
//! Exits 0 on success, 1 with the reason otherwise. Every wait has a deadline.
use msgr_rdma::{
    open_device, Access, CompletionChannel, CompletionQueue, Gid, InitAttr, MemoryRegion,
    ProtectionDomain, QpCaps, QpInit, QueuePair, RdmaError, RecvWr, RtrAttr, RtsAttr, SendOp,
    SendWr, WcOpcode, WorkCompletion,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MSG: usize = 4096;
const WAIT: Duration = Duration::from_secs(10);

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Side {
    cq: Arc<CompletionQueue>,
    qp: QueuePair,
    mr: MemoryRegion<Vec<u8>>,
    psn: u32,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dev = args.get(1).map_or("rxe0", String::as_str);
    let rounds: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100);
    match run(dev, rounds) {
        Ok(()) => println!("verbs_smoke: OK ({rounds} round trips, RDMA write+read, flush on ERR)"),
        Err(e) => {
            eprintln!("verbs_smoke: FAILED: {e}");
            std::process::exit(1);
        }
    }
}

/// Busy-polls (or, with `channel`, waits on the completion channel) for one
/// completion, with a deadline.
fn wait_one(cq: &CompletionQueue, use_channel: bool) -> Res<WorkCompletion> {
    let deadline = Instant::now() + WAIT;
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        if cq.poll(&mut wc)? == 1 {
            return Ok(wc[0]);
        }
        if use_channel {
            // Arm, poll once more (a completion may have landed in between), block.
            cq.req_notify(false)?;
            if cq.poll(&mut wc)? == 1 {
                return Ok(wc[0]);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            cq.wait_event(left)?;
        } else if Instant::now() > deadline {
            return Err(RdmaError::Timeout {
                op: "poll_cq",
                after: WAIT,
            }
            .into());
        } else {
            std::hint::spin_loop();
        }
    }
}

fn run(dev: &str, rounds: u32) -> Res<()> {
    let ctx = open_device(Some(dev))?;
    let port = ctx.query_port(1)?;
    let attr = ctx.query_device()?;
    println!(
        "device {} active={} mtu={:?} ethernet={} max_qp={} max_cqe={} max_mr={}",
        ctx.name(),
        port.active,
        port.active_mtu,
        port.ethernet,
        attr.max_qp,
        attr.max_cqe,
        attr.max_mr
    );
    // A GID to address ourselves with (RoCE needs one). Prefer an
    // IPv4-mapped GID (RoCE v2 over 127.0.0.1 on lo): the link-local GID of
    // lo is not routable ("Network is unreachable" at RTR).
    let gids: Vec<(u32, Gid)> = (0..port.gid_tbl_len)
        .filter_map(|i| ctx.query_gid(1, i).ok().map(|g| (i, g)))
        .filter(|(_, g)| !g.is_zero())
        .collect();
    let v4_mapped = |g: &Gid| g.0[..10].iter().all(|&b| b == 0) && g.0[10..12] == [0xff, 0xff];
    let (gid_index, gid) = gids
        .iter()
        .find(|(_, g)| v4_mapped(g))
        .or_else(|| gids.first())
        .copied()
        .ok_or("no usable GID on port 1")?;
    println!("using GID index {gid_index}: {gid}");
    let pd = ProtectionDomain::new(&ctx)?;
    let channel = CompletionChannel::new(&ctx)?;
    channel.set_nonblocking()?;

    let make = |chan: Option<&Arc<CompletionChannel>>, psn: u32| -> Res<Side> {
        let cq = CompletionQueue::new(&ctx, 256, chan)?;
        let mut init = QpInit::new(&cq, &cq);
        init.caps = QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        let qp = QueuePair::new(&pd, init)?;
        let mr = MemoryRegion::register(&pd, vec![0u8; 2 * MSG], Access::ALL_RDMA)?;
        Ok(Side { cq, qp, mr, psn })
    };
    // Side a busy-polls; side b blocks on its completion channel.
    let mut a = make(None, 0x1234)?;
    let mut b = make(Some(&channel), 0xabcd)?;
    connect(&a, &b, gid, gid_index as u8, port.active_mtu)?;
    connect(&b, &a, gid, gid_index as u8, port.active_mtu)?;
    println!("QPs {} <-> {} in RTS", a.qp.qp_num(), b.qp.qp_num());

    for round in 0..rounds {
        let len = 1 + (round as usize * 37) % MSG;
        let imm = round % 3 == 1;
        let inline = round % 3 == 2;
        let len = if inline { len.min(64) } else { len };
        // b: receive into its second half; a: send from its first half.
        b.qp.post_recv(&[RecvWr {
            wr_id: u64::from(round),
            sges: &[b.mr.sge(MSG..2 * MSG)?],
        }])?;
        for (i, byte) in a.mr[..len].iter_mut().enumerate() {
            *byte = (i as u32 ^ round) as u8;
        }
        let op = if imm {
            SendOp::SendWithImm(round)
        } else {
            SendOp::Send
        };
        let sges = [a.mr.sge(0..len)?];
        let mut wr = SendWr::new(1000 + u64::from(round), op, &sges);
        wr.inline = inline;
        a.qp.post_send(&[wr])?;
        let sc = wait_one(&a.cq, false)?;
        sc.ok()?;
        let rc = wait_one(&b.cq, true)?;
        rc.ok()?;
        if rc.wr_id() != u64::from(round) || rc.byte_len() as usize != len {
            return Err(format!(
                "round {round}: recv wr_id {} len {} (want {len})",
                rc.wr_id(),
                rc.byte_len()
            )
            .into());
        }
        if rc.opcode() != WcOpcode::Recv || rc.imm_data() != imm.then_some(round) {
            return Err(format!(
                "round {round}: opcode {:?} imm {:?}",
                rc.opcode(),
                rc.imm_data()
            )
            .into());
        }
        if b.mr[MSG..MSG + len] != a.mr[..len] {
            return Err(format!("round {round}: received bytes differ").into());
        }
        // Echo back: b -> a, so both directions carry data.
        a.qp.post_recv(&[RecvWr {
            wr_id: 7,
            sges: &[a.mr.sge(MSG..2 * MSG)?],
        }])?;
        let copy = b.mr[MSG..MSG + len].to_vec();
        b.mr[..len].copy_from_slice(&copy);
        b.qp.post_send(&[SendWr::new(8, SendOp::Send, &[b.mr.sge(0..len)?])])?;
        wait_one(&b.cq, true)?.ok()?;
        let back = wait_one(&a.cq, false)?;
        back.ok()?;
        if a.mr[MSG..MSG + len] != a.mr[..len] {
            return Err(format!("round {round}: echo differs").into());
        }
    }
    println!("{rounds} send/recv round trips verified (plain, immediate, inline)");

    // RDMA write: a's first half -> b's second half.
    for (i, byte) in a.mr[..MSG].iter_mut().enumerate() {
        *byte = (i * 7 + 3) as u8;
    }
    let remote = b.mr.remote(MSG..2 * MSG)?;
    a.qp.post_send(&[SendWr::new(
        20,
        SendOp::RdmaWrite(remote),
        &[a.mr.sge(0..MSG)?],
    )])?;
    let wc = wait_one(&a.cq, false)?;
    wc.ok()?;
    if wc.opcode() != WcOpcode::RdmaWrite || b.mr[MSG..] != a.mr[..MSG] {
        return Err("RDMA write: data differs".into());
    }
    // RDMA read: b's first half -> a's second half.
    for (i, byte) in b.mr[..MSG].iter_mut().enumerate() {
        *byte = (i * 13 + 5) as u8;
    }
    let remote = b.mr.remote(0..MSG)?;
    a.qp.post_send(&[SendWr::new(
        21,
        SendOp::RdmaRead(remote),
        &[a.mr.sge(MSG..2 * MSG)?],
    )])?;
    let wc = wait_one(&a.cq, false)?;
    wc.ok()?;
    if wc.opcode() != WcOpcode::RdmaRead || a.mr[MSG..] != b.mr[..MSG] {
        return Err("RDMA read: data differs".into());
    }
    println!("RDMA write and read of {MSG} bytes verified");

    // Fault injection: a QP in ERR flushes its posted receives with an error.
    b.qp.post_recv(&[RecvWr {
        wr_id: 99,
        sges: &[b.mr.sge(0..MSG)?],
    }])?;
    b.qp.to_err()?;
    let wc = wait_one(&b.cq, true)?;
    match wc.ok() {
        Err(e) if wc.wr_id() == 99 => println!("ERR state flushed the posted receive: {e}"),
        other => return Err(format!("expected a flushed receive, got {other:?}").into()),
    }
    println!("QP state after to_err: {:?}", b.qp.state()?);
    Ok(())
}

/// Moves `me` to RTS, connected to `peer` (both on this device).
fn connect(me: &Side, peer: &Side, gid: Gid, gid_index: u8, mtu: msgr_rdma::Mtu) -> Res<()> {
    me.qp.to_init(&InitAttr::default())?;
    me.qp.to_rtr(&RtrAttr {
        path_mtu: mtu,
        dest_qp_num: peer.qp.qp_num(),
        rq_psn: peer.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        port: 1,
        dlid: 0,
        dgid: Some(gid),
        sgid_index: gid_index,
        hop_limit: 64,
    })?;
    me.qp.to_rts(&RtsAttr {
        sq_psn: me.psn,
        ..Default::default()
    })?;
    Ok(())
}
