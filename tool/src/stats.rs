//! Result records and latency percentiles.

use serde::Serialize;

use crate::error::ToolError;
use crate::output::outln;
use std::collections::BTreeMap;

/// Percentiles of a set of durations, in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Samples summarised.
    pub samples: usize,
    /// Smallest.
    pub min_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// Largest.
    pub max_us: f64,
}

impl Summary {
    /// Summarises `ns` (nanoseconds; sorted here), scaled by `scale`
    /// (0.5 turns round trips into one-way figures).
    pub fn from_ns(ns: &mut [u64], scale: f64) -> Summary {
        ns.sort_unstable();
        let n = ns.len();
        let us = |v: u64| v as f64 * scale / 1000.0;
        let pct = |p: f64| {
            if n == 0 {
                return 0.0;
            }
            let i = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
            us(ns[i])
        };
        let mean = if n == 0 {
            0.0
        } else {
            ns.iter().map(|&v| v as f64).sum::<f64>() / n as f64 * scale / 1000.0
        };
        Summary {
            samples: n,
            min_us: ns.first().map_or(0.0, |&v| us(v)),
            p50_us: pct(0.50),
            p99_us: pct(0.99),
            p999_us: pct(0.999),
            mean_us: mean,
            max_us: ns.last().map_or(0.0, |&v| us(v)),
        }
    }
}

/// A ping-pong run.
#[derive(Clone, Debug, Serialize)]
pub struct PingResult {
    /// Payload bytes per message.
    pub size: usize,
    /// Timed round trips.
    pub count: u64,
    /// Untimed round trips before them.
    pub warmup: u64,
    /// Round-trip times.
    pub rtt: Summary,
    /// Half the round-trip times.
    pub one_way: Summary,
    /// Wall time of the timed part, seconds.
    pub elapsed_s: f64,
}

impl PingResult {
    /// Builds the result from round-trip samples in nanoseconds.
    pub fn new(size: usize, warmup: u64, mut rtt_ns: Vec<u64>, elapsed_s: f64) -> PingResult {
        let rtt = Summary::from_ns(&mut rtt_ns, 1.0);
        let one_way = Summary::from_ns(&mut rtt_ns, 0.5);
        PingResult {
            size,
            count: rtt_ns.len() as u64,
            warmup,
            rtt,
            one_way,
            elapsed_s,
        }
    }

    /// Human-readable lines.
    pub fn print(&self, label: &str) -> Result<(), ToolError> {
        outln!(
            "{label}: {} round trips of {} B in {:.2} s (after {} warm-up)",
            self.count,
            self.size,
            self.elapsed_s,
            self.warmup
        )?;
        outln!(
            "  {:<8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "µs",
            "min",
            "p50",
            "p99",
            "p99.9",
            "mean",
            "max"
        )?;
        for (name, s) in [("one-way", &self.one_way), ("RTT", &self.rtt)] {
            outln!(
                "  {:<8} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                name,
                s.min_us,
                s.p50_us,
                s.p99_us,
                s.p999_us,
                s.mean_us,
                s.max_us
            )?;
        }
        Ok(())
    }
}

/// A one-way streaming run.
#[derive(Clone, Debug, Serialize)]
pub struct StreamResult {
    /// Payload bytes per message.
    pub size: usize,
    /// Messages sent (and acknowledged).
    pub messages: u64,
    /// Payload bytes sent.
    pub bytes: u64,
    /// From the first send to the receiver's acknowledgement of the last, seconds.
    pub elapsed_s: f64,
    /// Payload MiB/s.
    pub mib_per_s: f64,
    /// Payload Gbit/s.
    pub gbit_per_s: f64,
    /// Messages per second.
    pub msgs_per_s: f64,
    /// The sender's transport counters after the run (those its backend
    /// keeps: RDMA's `sends_posted` and `cq_polls` say how many work
    /// requests and completion-queue polls the messages took).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub sender_transport: BTreeMap<String, u64>,
}

impl StreamResult {
    /// Computes the rates.
    pub fn new(size: usize, messages: u64, elapsed_s: f64) -> StreamResult {
        let bytes = messages * size as u64;
        let t = elapsed_s.max(1e-9);
        StreamResult {
            size,
            messages,
            bytes,
            elapsed_s,
            mib_per_s: bytes as f64 / t / (1u64 << 20) as f64,
            gbit_per_s: bytes as f64 * 8.0 / t / 1e9,
            msgs_per_s: messages as f64 / t,
            sender_transport: BTreeMap::new(),
        }
    }

    /// `counter` of the sender's transport per message sent, if it keeps one.
    pub fn per_message(&self, counter: &str) -> Option<f64> {
        let v = *self.sender_transport.get(counter)?;
        Some(v as f64 / self.messages.max(1) as f64)
    }

    /// One human-readable line.
    pub fn print(&self, label: &str) -> Result<(), ToolError> {
        outln!(
            "{label}: {} messages of {} B in {:.2} s: {:.1} MiB/s, {:.2} Gbit/s, {:.0} msg/s",
            self.messages,
            self.size,
            self.elapsed_s,
            self.mib_per_s,
            self.gbit_per_s,
            self.msgs_per_s
        )?;
        if let (Some(wr), Some(polls)) = (
            self.per_message("sends_posted"),
            self.per_message("cq_polls"),
        ) {
            outln!("  sender: {wr:.4} send work requests and {polls:.4} completion-queue polls per message")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_right_samples() {
        let mut v: Vec<u64> = (1..=1000).map(|x| x * 1000).collect();
        let s = Summary::from_ns(&mut v, 1.0);
        assert_eq!(s.min_us, 1.0);
        assert_eq!(s.p50_us, 500.0);
        assert_eq!(s.p99_us, 990.0);
        assert_eq!(s.p999_us, 999.0);
        assert_eq!(s.max_us, 1000.0);
        let h = Summary::from_ns(&mut v, 0.5);
        assert_eq!(h.p50_us, 250.0);
        assert_eq!(Summary::from_ns(&mut [], 1.0).samples, 0);
    }
}
