//! The `fragment_decode` target: fragment frames ([`crate::fragment`])
//! from arbitrary bytes, and their reassembly across classes.

use bytes::{Bytes, BytesMut};

use crate::fragment::{Fragment, Fragmenter, Reassembler, FRAGMENT_HEADER_LEN};
use crate::frame::{Frame, FrameDecoder, FrameLimits, Tag};
use crate::message::{Message, MESSAGE_HEADER_LEN};
use crate::priority::Priority;

use super::Reader;

/// The reassembler's limit here: small, so that the fuzzer reaches it,
/// and above the largest message mode 1 builds (255 + 4095 bytes).
const MAX_MESSAGE: usize = 8192;

/// `fragment_decode`. Mode bit 0 clear: fragment frames built from the
/// input (a 32-byte header, a message header of 32 bytes or none, a piece
/// of up to 4 KiB), each decoded and pushed into one [`Reassembler`]: a
/// fragment that decodes writes back to the same frame (one encoding per
/// fragment), and the reassembler never holds more than its limit per
/// class, refuses a fragment malformed alone as such, and yields only
/// messages within its limit. Set: up to 32 messages built from the
/// input, cut with a bound from the input, interleaved across classes as the input
/// says, sent through the wire and put back together: each class gets its
/// messages back equal and in order.
pub fn fragment_decode(data: &[u8]) {
    let mut r = Reader::new(data);
    if r.u8() & 1 == 0 {
        decode_and_reassemble(&mut r);
    } else {
        cut_and_reassemble(&mut r);
    }
}

/// Writes `f` as the mode-0 input [`fragment_decode`] reads back to it.
pub(super) fn write_fragment_input(f: Fragment, out: &mut Vec<u8>) {
    let frame = f.into_frame();
    out.extend_from_slice(&frame.segments[0]);
    out.push(u8::from(!frame.segments[1].is_empty()));
    out.extend_from_slice(&frame.segments[1]);
    let piece = &frame.segments[2];
    out.extend((piece.len() as u16).to_le_bytes());
    out.extend_from_slice(piece);
}

/// Mode 0; returns how many messages were reassembled.
fn decode_and_reassemble(r: &mut Reader<'_>) -> usize {
    let mut re = Reassembler::new(MAX_MESSAGE);
    let mut whole = 0;
    while !r.is_empty() {
        let h = Bytes::copy_from_slice(r.bytes(FRAGMENT_HEADER_LEN));
        let head = match r.u8() {
            0 => Bytes::new(),
            1 => Bytes::copy_from_slice(r.bytes(MESSAGE_HEADER_LEN)),
            n => Bytes::copy_from_slice(r.bytes(usize::from(n % 64))),
        };
        let len = usize::from(r.u16() % 4096);
        let piece = Bytes::copy_from_slice(r.bytes(len));
        let frame = Frame::new(Tag::Fragment, [h, head, piece]);
        let Ok(f) = Fragment::from_frame(frame.clone()) else {
            continue;
        };
        assert_eq!(f.check(), Ok(()), "a decoded fragment checks");
        assert_eq!(
            f.clone().into_frame(),
            frame,
            "a fragment writes back as read"
        );
        if let Ok(Some((m, _))) = re.push(f) {
            assert!(m.payload_len() <= MAX_MESSAGE);
            whole += 1;
        }
        assert!(re.reserved() <= MAX_MESSAGE * Priority::COUNT);
    }
    whole
}

fn cut_and_reassemble(r: &mut Reader<'_>) {
    let max_fragment = usize::from(r.u16() % 2048).max(1);
    let count = r.u8() % 33;
    let mut msgs = Vec::new();
    for _ in 0..count {
        let mut m = Message::new(r.u16(), r.short_bytes().to_vec(), {
            let n = usize::from(r.u16() % 4096);
            r.bytes(n).to_vec()
        });
        m.priority = r.u8();
        m.flags = r.u8();
        if r.u8() & 1 == 1 {
            m.call = r.u64();
        }
        msgs.push(m);
    }
    number_per_class(&mut msgs);
    // Each class's fragments in order, one message after the other.
    let mut lanes: Vec<std::collections::VecDeque<Fragment>> =
        vec![Default::default(); Priority::COUNT];
    for (i, m) in msgs.iter().enumerate() {
        let frags =
            Fragmenter::new(m.clone(), i as u64, max_fragment).expect("a message built to fit");
        lanes[m.class().index()].extend(frags);
    }
    // Interleaved across classes as the rest of the input picks.
    let mut wire = Vec::new();
    while let Some(ready) = {
        let ready: Vec<usize> = (0..lanes.len()).filter(|&i| !lanes[i].is_empty()).collect();
        (!ready.is_empty()).then_some(ready)
    } {
        let i = ready[usize::from(r.u8()) % ready.len()];
        if let Some(f) = lanes[i].pop_front() {
            assert!(f.piece.len() <= max_fragment, "a piece within its bound");
            let frame = f.into_frame();
            wire.extend(frame.encode_to_vec().expect("a small frame encodes"));
        }
    }
    let mut dec = FrameDecoder::new(FrameLimits::default());
    let mut buf = BytesMut::from(&wire[..]);
    let mut re = Reassembler::new(MAX_MESSAGE);
    let mut got: Vec<Vec<(Message, u64)>> = vec![Vec::new(); Priority::COUNT];
    while let Some(frame) = dec.decode(&mut buf).expect("frames as written decode") {
        let f = Fragment::from_frame(frame).expect("a fragment as written");
        if let Some(done) = re.push(f).expect("fragments in order per class") {
            got[done.0.class().index()].push(done);
        }
    }
    assert_eq!(re.reserved(), 0, "every message completed");
    assert_eq!(got, by_class(&msgs), "each class's messages, in order");
}

/// Numbers `msgs` 1, 2, … within each class ([`Message::seq`]), as a
/// sender of lanes does.
pub fn number_per_class(msgs: &mut [Message]) {
    let mut next = [1u64; Priority::COUNT];
    for m in msgs {
        let lane = &mut next[m.class().index()];
        m.seq = *lane;
        *lane += 1;
    }
}

/// `msgs` by class (indexed by [`Priority::index`]), in order, each with
/// its index in `msgs` as its ack: what a reassembler gives back from
/// messages sent with their index as the ack.
pub fn by_class(msgs: &[Message]) -> Vec<Vec<(Message, u64)>> {
    let mut out = vec![Vec::new(); Priority::COUNT];
    for (i, m) in msgs.iter().enumerate() {
        out[m.class().index()].push((m.clone(), i as u64));
    }
    out
}

/// Seeds of `fragment_decode`: `(file name, bytes)`.
pub(super) fn fragment_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    // Mode 0: a background message of three fragments with an interactive
    // one of a single fragment between them, then a bad continuation.
    let mut bulk = Message::new(3, &b"head"[..], vec![0x5a; 300]).with_class(Priority::Background);
    bulk.seq = 1;
    let mut call = Message::new(4, &b"call"[..], &b""[..]).with_class(Priority::Interactive);
    call.seq = 1;
    call.call = 9;
    let bulk: Vec<Fragment> = Fragmenter::new(bulk, 2, 128).expect("valid").collect();
    let call: Vec<Fragment> = Fragmenter::new(call, 2, 128).expect("valid").collect();
    let mut v = vec![0u8];
    write_fragment_input(bulk[0].clone(), &mut v);
    write_fragment_input(call[0].clone(), &mut v);
    for f in &bulk[1..] {
        write_fragment_input(f.clone(), &mut v);
    }
    out.push(("interleaved".to_string(), v.clone()));
    write_fragment_input(bulk[2].clone(), &mut v);
    out.push(("interleaved-then-no-first".to_string(), v));
    // Mode 1: a few messages of each class, cut at 100 bytes.
    let mut v = vec![1u8];
    v.extend(100u16.to_le_bytes());
    v.push(6);
    for (i, priority) in [0u8, 200, 30, 120, 255, 64].into_iter().enumerate() {
        v.extend((i as u16).to_le_bytes());
        v.push(8);
        v.extend([i as u8; 8]);
        v.extend((150 * i as u16).to_le_bytes());
        v.extend(std::iter::repeat_n(!(i as u8), 150 * i));
        v.extend([priority, 0, (i % 2) as u8]);
        if i % 2 == 1 {
            v.extend((i as u64 + 1).to_le_bytes());
        }
    }
    // The picks: mostly the first ready class, then the others.
    v.extend([0, 1, 2, 0, 1, 1, 2, 0, 0, 2]);
    out.push(("cut-six-classes-mixed".to_string(), v));
    out
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    /// The mode-0 seeds reach reassembly: two messages come out whole.
    #[test]
    fn the_seeds_reassemble_messages() {
        for (name, v) in fragment_seeds() {
            let mut r = Reader::new(&v);
            if r.u8() & 1 == 0 {
                assert_eq!(decode_and_reassemble(&mut r), 2, "{name}");
            }
            fragment_decode(&v);
        }
    }

    /// A few thousand random inputs and bit-flipped seeds: the body's own
    /// assertions hold (a stand-in for a fuzzer run in `cargo test`).
    #[test]
    fn random_and_mutated_inputs_hold() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(58);
        let seeds: Vec<Vec<u8>> = fragment_seeds().into_iter().map(|(_, v)| v).collect();
        for i in 0..3000 {
            let v = if i % 2 == 0 {
                let len = rng.random_range(0..600);
                (0..len).map(|_| rng.random::<u8>()).collect()
            } else {
                let mut v = seeds[i % seeds.len()].clone();
                for _ in 0..rng.random_range(1..4) {
                    let at = rng.random_range(0..v.len());
                    v[at] ^= 1 << rng.random_range(0..8);
                }
                v
            };
            fragment_decode(&v);
        }
    }
}
