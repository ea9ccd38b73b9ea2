//! Plain blocking `std::net` code on loopback: the best a simple program
//! does without a messenger (ping-pong, a stream of writes, a framed stream).

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::ToolError;
use crate::stats::{PingResult, StreamResult};

/// Read/write timeout on every reference socket: nothing blocks for ever.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

fn io(what: &'static str) -> impl Fn(std::io::Error) -> ToolError {
    move |e| ToolError::io(format!("std reference: {what}"), e)
}

/// A connected pair on 127.0.0.1, the server end handled by `serve` on its
/// own thread.
fn pair<T: Send + 'static>(
    nodelay: bool,
    serve: impl FnOnce(TcpStream) -> std::io::Result<T> + Send + 'static,
) -> Result<(TcpStream, JoinHandle<std::io::Result<T>>), ToolError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io("bind"))?;
    let addr = listener.local_addr().map_err(io("local_addr"))?;
    let client = TcpStream::connect(addr).map_err(io("connect"))?;
    let (server, _) = listener.accept().map_err(io("accept"))?;
    for s in [&client, &server] {
        s.set_nodelay(nodelay).map_err(io("TCP_NODELAY"))?;
        s.set_read_timeout(Some(IO_TIMEOUT))
            .map_err(io("read timeout"))?;
        s.set_write_timeout(Some(IO_TIMEOUT))
            .map_err(io("write timeout"))?;
    }
    let th = std::thread::Builder::new()
        .name("std-reference".into())
        .spawn(move || serve(server))
        .map_err(io("spawn"))?;
    Ok((client, th))
}

fn join<T>(th: JoinHandle<std::io::Result<T>>) -> Result<T, ToolError> {
    match th.join() {
        Ok(r) => r.map_err(io("server thread")),
        Err(_) => Err(ToolError::io(
            "std reference",
            std::io::Error::other("server thread panicked"),
        )),
    }
}

/// Blocking ping-pong between two threads, TCP_NODELAY, `size` bytes each way.
pub fn ping(
    size: usize,
    warmup: u64,
    count: u64,
    timeout: Duration,
) -> Result<PingResult, ToolError> {
    let (mut c, th) = pair(true, move |mut s| {
        let mut buf = vec![0u8; size];
        loop {
            match s.read_exact(&mut buf) {
                Ok(()) => s.write_all(&buf)?,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    })?;
    let deadline = Instant::now() + timeout;
    let out = vec![0x5au8; size];
    let mut buf = vec![0u8; size];
    let mut samples = Vec::with_capacity(count as usize);
    let mut first = Instant::now();
    let mut run = || -> Result<(), ToolError> {
        for i in 0..warmup + count {
            if i == warmup {
                first = Instant::now();
            }
            let t = Instant::now();
            c.write_all(&out).map_err(io("write"))?;
            c.read_exact(&mut buf).map_err(io("read"))?;
            if i >= warmup {
                samples.push(t.elapsed().as_nanos() as u64);
            }
            if i.is_multiple_of(1024) && Instant::now() > deadline {
                return Err(ToolError::Timeout {
                    what: "std ping-pong".into(),
                    after: timeout,
                });
            }
        }
        Ok(())
    };
    let r = run();
    let elapsed = first.elapsed().as_secs_f64();
    let _ = c.shutdown(Shutdown::Both);
    drop(c);
    let j = join(th);
    r?;
    j?;
    Ok(PingResult::new(size, warmup, samples, elapsed))
}

/// How long a writer loop runs: `count` messages or `time`, whichever first.
fn keep_going(n: u64, count: Option<u64>, start: Instant, time: Option<Duration>) -> bool {
    count.is_none_or(|c| n < c) && time.is_none_or(|t| start.elapsed() < t)
}

/// One thread writes `size`-byte buffers with plain `write_all`, the other
/// reads until EOF and reports the total back.
pub fn stream(
    size: usize,
    count: Option<u64>,
    time: Option<Duration>,
) -> Result<StreamResult, ToolError> {
    let (mut c, th) = pair(false, move |mut s| {
        let mut buf = vec![0u8; size.clamp(1, 1 << 20)];
        let mut total = 0u64;
        loop {
            match s.read(&mut buf)? {
                0 => break,
                n => total += n as u64,
            }
        }
        s.write_all(&total.to_le_bytes())?;
        Ok(total)
    })?;
    let out = vec![0xa5u8; size];
    let start = Instant::now();
    let mut n = 0u64;
    while keep_going(n, count, start, time) {
        c.write_all(&out).map_err(io("write"))?;
        n += 1;
    }
    c.shutdown(Shutdown::Write).map_err(io("shutdown"))?;
    let mut ack = [0u8; 8];
    c.read_exact(&mut ack).map_err(io("read ack"))?;
    let elapsed = start.elapsed().as_secs_f64();
    let total = join(th)?;
    if total != n * size as u64 {
        return Err(ToolError::io(
            "std stream",
            std::io::Error::other(format!("received {total} of {} bytes", n * size as u64)),
        ));
    }
    Ok(StreamResult::new(size, n, elapsed))
}

/// Length-prefixed messages: the writer batches through a `BufWriter`, the
/// reader parses each 4-byte length and reads the payload through a
/// `BufReader` — a minimal framed message stream without a messenger.
pub fn framed_stream(
    size: usize,
    count: Option<u64>,
    time: Option<Duration>,
) -> Result<StreamResult, ToolError> {
    const END: u32 = u32::MAX;
    let (c, th) = pair(true, move |s| {
        let mut w = s.try_clone()?;
        let mut r = BufReader::with_capacity(64 << 10, s);
        let mut buf = vec![0u8; size];
        let mut msgs = 0u64;
        loop {
            let mut len = [0u8; 4];
            r.read_exact(&mut len)?;
            let len = u32::from_le_bytes(len);
            if len == END {
                break;
            }
            if len as usize > buf.len() {
                buf.resize(len as usize, 0);
            }
            r.read_exact(&mut buf[..len as usize])?;
            msgs += 1;
        }
        w.write_all(&msgs.to_le_bytes())?;
        Ok(msgs)
    })?;
    let mut rd = c.try_clone().map_err(io("clone"))?;
    let mut w = BufWriter::with_capacity(64 << 10, c);
    let out = vec![0xa5u8; size];
    let len = (size as u32).to_le_bytes();
    let start = Instant::now();
    let mut n = 0u64;
    loop {
        if n.is_multiple_of(256) && !keep_going(n, count, start, time) {
            break;
        }
        if count.is_some_and(|c| n >= c) {
            break;
        }
        w.write_all(&len).map_err(io("write"))?;
        w.write_all(&out).map_err(io("write"))?;
        n += 1;
    }
    w.write_all(&END.to_le_bytes()).map_err(io("write"))?;
    w.flush().map_err(io("flush"))?;
    let mut ack = [0u8; 8];
    rd.read_exact(&mut ack).map_err(io("read ack"))?;
    let elapsed = start.elapsed().as_secs_f64();
    let got = join(th)?;
    if got != n {
        return Err(ToolError::io(
            "std framed stream",
            std::io::Error::other(format!("received {got} of {n} messages")),
        ));
    }
    Ok(StreamResult::new(size, n, elapsed))
}
