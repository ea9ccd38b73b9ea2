//! rdma_cm smoke test: a listener and a client in one process (one thread,
//! two event channels) on ADDR, connected through rdma_cm, then N messages
//! each way with send/recv, plus an RDMA write and read to the buffer the
//! server advertised in its accept private data; then disconnect.
//! iWARP-safe: the active side sends first, no immediate data on iWARP.
//!
//!     rdmacm_smoke ADDR [PORT (default 7471)] [ROUNDS (default 50)]
//!
//! ADDR must be one of the test guest's TEST-NET-2 addresses
//! (198.51.100.1 = rxe1, 198.51.100.2 = siw0): the program refuses to run
//! outside the guest. Exits 0 on success, 1 with the reason otherwise.
use msgr_rdma::{
    Access, CmEventKind, CmId, CompletionQueue, ConnParam, EventChannel, MemoryRegion, PortSpace,
    ProtectionDomain, QpInit, QueuePair, RdmaError, RecvWr, RemoteAddr, SendOp, SendWr,
    WorkCompletion,
};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MSG: usize = 1024;
const WAIT: Duration = Duration::from_secs(10);

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let in_guest = std::env::var("MSGR_IN_GUEST").as_deref() == Ok("1")
        && std::path::Path::new("/run/msgr-guest").exists();
    if !in_guest {
        eprintln!(
            "rdmacm_smoke: refusing to run outside the msgr test guest \
             (MSGR_IN_GUEST=1 and /run/msgr-guest): its TEST-NET-2 addresses \
             would route off this machine"
        );
        std::process::exit(2);
    }
    let Some(ip) = args.get(1).and_then(|s| s.parse::<IpAddr>().ok()) else {
        eprintln!("usage: rdmacm_smoke ADDR [PORT] [ROUNDS]");
        std::process::exit(2);
    };
    let port: u16 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(7471);
    let rounds: u32 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(50);
    match run(SocketAddr::new(ip, port), rounds) {
        Ok(dev) => {
            println!("rdmacm_smoke: OK on {dev} ({rounds} messages each way, RDMA write+read)")
        }
        Err(e) => {
            eprintln!("rdmacm_smoke: FAILED: {e}");
            std::process::exit(1);
        }
    }
}

fn wait_one(cq: &CompletionQueue) -> Res<WorkCompletion> {
    let deadline = Instant::now() + WAIT;
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        if cq.poll(&mut wc)? == 1 {
            wc[0].ok()?;
            return Ok(wc[0]);
        }
        if Instant::now() > deadline {
            return Err(RdmaError::Timeout {
                op: "poll_cq",
                after: WAIT,
            }
            .into());
        }
        std::thread::yield_now();
    }
}

struct End {
    cq: Arc<CompletionQueue>,
    qp: QueuePair,
    mr: MemoryRegion<Vec<u8>>,
}

fn endpoint(id: &CmId) -> Res<End> {
    let ctx = id.context().ok_or("rdma_cm id has no device")?;
    let pd = ProtectionDomain::new(&ctx)?;
    let cq = CompletionQueue::new(&ctx, 128, None)?;
    let qp = id.create_qp(&pd, QpInit::new(&cq, &cq))?;
    let mr = MemoryRegion::register(&pd, vec![0u8; 2 * MSG], Access::ALL_RDMA)?;
    Ok(End { cq, qp, mr })
}

fn run(addr: SocketAddr, rounds: u32) -> Res<String> {
    // Server: listen.
    let schan = EventChannel::new()?;
    let listener = CmId::new(&schan, PortSpace::Tcp)?;
    listener.bind_addr(addr)?;
    listener.listen(4)?;

    // Client: resolve address and route, create its QP, connect.
    let cchan = EventChannel::new()?;
    let cid = CmId::new(&cchan, PortSpace::Tcp)?;
    cid.resolve_addr(None, addr, Duration::from_secs(2))?;
    cchan.expect(CmEventKind::AddrResolved, WAIT)?;
    cid.resolve_route(Duration::from_secs(2))?;
    cchan.expect(CmEventKind::RouteResolved, WAIT)?;
    let mut client = endpoint(&cid)?;
    let ctx = cid.context().ok_or("no device")?;
    let (dev, iwarp) = (ctx.name().to_string(), ctx.is_iwarp());
    println!("client on {dev} (iWARP: {iwarp})");
    cid.connect(&ConnParam {
        private_data: b"msgr-smoke hello".to_vec(),
        ..Default::default()
    })?;

    // Server: take the request, create the QP, accept with our buffer's address.
    let req = schan.expect(CmEventKind::ConnectRequest, WAIT)?;
    if req.private_data.get(..16) != Some(&b"msgr-smoke hello"[..]) {
        return Err(format!("connect private data: {:?}", req.private_data).into());
    }
    let sid = req.new_id.ok_or("connect request without a new id")?;
    let mut server = endpoint(&sid)?;
    for i in 0..4u64 {
        server.qp.post_recv(&[RecvWr {
            wr_id: i,
            sges: &[server.mr.sge(MSG..2 * MSG)?],
        }])?;
    }
    let remote = server.mr.remote(0..MSG)?;
    let mut pdata = remote.addr.to_le_bytes().to_vec();
    pdata.extend_from_slice(&remote.rkey.to_le_bytes());
    sid.accept(&ConnParam {
        private_data: pdata,
        ..Default::default()
    })?;

    let est = cchan.expect(CmEventKind::Established, WAIT)?;
    let remote = RemoteAddr {
        addr: u64::from_le_bytes(
            est.private_data
                .get(..8)
                .ok_or("no private data")?
                .try_into()?,
        ),
        rkey: u32::from_le_bytes(
            est.private_data
                .get(8..12)
                .ok_or("short private data")?
                .try_into()?,
        ),
    };
    schan.expect(CmEventKind::Established, WAIT)?;
    println!(
        "connected: client QP {} <-> server QP {}",
        client.qp.qp_num(),
        server.qp.qp_num()
    );

    // Messages: the client (active side) sends first, the server echoes.
    for round in 0..rounds {
        let len = 1 + (round as usize * 29) % MSG;
        client.qp.post_recv(&[RecvWr {
            wr_id: 500,
            sges: &[client.mr.sge(MSG..2 * MSG)?],
        }])?;
        for (i, b) in client.mr[..len].iter_mut().enumerate() {
            *b = (i as u32).wrapping_mul(31).wrapping_add(round) as u8;
        }
        let op = if !iwarp && round % 2 == 1 {
            SendOp::SendWithImm(round)
        } else {
            SendOp::Send
        };
        client
            .qp
            .post_send(&[SendWr::new(1, op, &[client.mr.sge(0..len)?])])?;
        wait_one(&client.cq)?;
        let wc = wait_one(&server.cq)?;
        if wc.byte_len() as usize != len || server.mr[MSG..MSG + len] != client.mr[..len] {
            return Err(format!("round {round}: server received wrong bytes").into());
        }
        if let SendOp::SendWithImm(v) = op {
            if wc.imm_data() != Some(v) {
                return Err(format!("round {round}: imm {:?}", wc.imm_data()).into());
            }
        }
        server.qp.post_recv(&[RecvWr {
            wr_id: wc.wr_id(),
            sges: &[server.mr.sge(MSG..2 * MSG)?],
        }])?;
        let copy = server.mr[MSG..MSG + len].to_vec();
        server.mr[..len].copy_from_slice(&copy);
        server
            .qp
            .post_send(&[SendWr::new(2, SendOp::Send, &[server.mr.sge(0..len)?])])?;
        wait_one(&server.cq)?;
        let wc = wait_one(&client.cq)?;
        if wc.byte_len() as usize != len || client.mr[MSG..MSG + len] != client.mr[..len] {
            return Err(format!("round {round}: echo differs").into());
        }
    }
    println!("{rounds} messages each way verified");

    // RDMA write into, then read back from, the server's advertised buffer.
    for (i, b) in client.mr[..MSG].iter_mut().enumerate() {
        *b = (i * 3 + 1) as u8;
    }
    client.qp.post_send(&[SendWr::new(
        3,
        SendOp::RdmaWrite(remote),
        &[client.mr.sge(0..MSG)?],
    )])?;
    wait_one(&client.cq)?;
    if server.mr[..MSG] != client.mr[..MSG] {
        return Err("RDMA write: server buffer differs".into());
    }
    client.mr[MSG..].fill(0);
    client.qp.post_send(&[SendWr::new(
        4,
        SendOp::RdmaRead(remote),
        &[client.mr.sge(MSG..2 * MSG)?],
    )])?;
    wait_one(&client.cq)?;
    if client.mr[MSG..] != server.mr[..MSG] {
        return Err("RDMA read: data differs".into());
    }
    println!("RDMA write and read of {MSG} bytes verified");

    // The passive side answers the disconnect request with its own
    // rdma_disconnect (on IB/RoCE that sends the DREP the active side waits for).
    cid.disconnect()?;
    schan.expect(CmEventKind::Disconnected, WAIT)?;
    if let Err(e) = sid.disconnect() {
        println!("server disconnect after the peer's: {e} (ignored)");
    }
    cchan.expect(CmEventKind::Disconnected, WAIT)?;
    println!("disconnected cleanly");
    drop((client, server));
    Ok(dev)
}
