//! A tokio ping-pong over TCP: the reference `scripts/bench-latency.sh`
//! measures `msgr ping` against (DESIGN §7: a 64 B ping-pong's p50 within
//! 1.2x of tokio's). Each message is a 4-byte length and its payload, the
//! server sends it back; both ends run a current-thread runtime with
//! `TCP_NODELAY`, as a tokio service would. Prints one JSON object.
//!
//! ```text
//! cargo run --release -p msgr-tool --example tokio_pingpong -- serve 127.0.0.1:7990 &
//! cargo run --release -p msgr-tool --example tokio_pingpong -- ping 127.0.0.1:7990 64 10000 1000
//! ```

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn usage() -> ! {
    eprintln!("usage: tokio_pingpong serve ADDR | ping ADDR SIZE COUNT WARMUP");
    std::process::exit(2)
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["serve", addr] => rt.block_on(serve(addr)),
        ["ping", addr, size, count, warmup] => {
            let num = |s: &str| s.parse::<usize>().unwrap_or_else(|_| usage());
            rt.block_on(ping(addr, num(size), num(count), num(warmup)))
        }
        _ => usage(),
    }
}

async fn serve(addr: &str) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (mut s, _) = listener.accept().await?;
        s.set_nodelay(true)?;
        tokio::spawn(async move {
            let mut buf = Vec::new();
            loop {
                let mut len = [0u8; 4];
                if s.read_exact(&mut len).await.is_err() {
                    return;
                }
                buf.resize(u32::from_le_bytes(len) as usize, 0);
                if s.read_exact(&mut buf).await.is_err()
                    || s.write_all(&len).await.is_err()
                    || s.write_all(&buf).await.is_err()
                {
                    return;
                }
            }
        });
    }
}

async fn ping(addr: &str, size: usize, count: usize, warmup: usize) -> std::io::Result<()> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let mut msg = (size as u32).to_le_bytes().to_vec();
    msg.resize(4 + size, 0xa5);
    let mut back = vec![0u8; 4 + size];
    let mut rtts = Vec::with_capacity(count);
    for i in 0..warmup + count {
        let t = Instant::now();
        s.write_all(&msg).await?;
        s.read_exact(&mut back).await?;
        if i >= warmup {
            rtts.push(t.elapsed());
        }
    }
    rtts.sort();
    let one_way_us = |d: Duration| d.as_secs_f64() * 1e6 / 2.0;
    let p50 = rtts.get(rtts.len() / 2).copied().unwrap_or_default();
    let mean = rtts.iter().sum::<Duration>() / rtts.len().max(1) as u32;
    println!(
        "{{\"reference\":\"tokio\",\"size\":{size},\"count\":{count},\"one_way_p50_us\":{:.3},\"one_way_mean_us\":{:.3}}}",
        one_way_us(p50),
        one_way_us(mean)
    );
    Ok(())
}
