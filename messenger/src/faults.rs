//! Fault injection at the transport boundary, the same for every backend.
//!
//! A [`FaultPlan`] says how often to fail a link, corrupt a frame on the wire,
//! delay output, or fail a handshake. Each worker draws from its own RNG seeded
//! from the plan's seed and the worker index, so a plan is reproducible as far
//! as thread scheduling allows; every run prints its seed. Applications can run
//! their own tests with faults on: set `faults` in the configuration, or
//! `MSGR_FAULTS=seed=7,fail=500,corrupt=2000,delay=100,delay_max_ms=5,handshake=20`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How often each kind of fault is injected. `0` turns a kind off.
///
/// ```
/// use msgr::{FaultPlan, MessengerConfig};
/// let plan: FaultPlan = "seed=7,fail=500,corrupt=2000".parse()?;
/// assert_eq!((plan.seed, plan.fail_one_in, plan.corrupt_one_in), (7, 500, 2000));
/// // The same plan from the configuration (or MSGR_FAULTS).
/// let mut cfg = MessengerConfig::default();
/// cfg.set("faults", "seed=7,fail=500,corrupt=2000")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// Seed of the fault RNGs.
    pub seed: u64,
    /// Fail the link (abortive close) on one in N transmitted units.
    pub fail_one_in: u64,
    /// Flip one bit of one in N transmitted units after encoding; the
    /// receiver's CRC turns it into a link fault.
    pub corrupt_one_in: u64,
    /// Hold back one in N transmitted units (and everything behind them on
    /// that link) for up to `delay_max`.
    pub delay_one_in: u64,
    /// Longest injected delay.
    pub delay_max: Duration,
    /// Fail the link on one in N handshake units (banner, hello and answers).
    pub handshake_fail_one_in: u64,
}

/// A fault plan string did not parse.
///
/// ```
/// let err = "seed=7,fail=often".parse::<msgr::FaultPlan>().unwrap_err();
/// assert!(err.to_string().contains("`fail`"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad fault plan `{input}`: {why} (expected e.g. seed=7,fail=500,corrupt=2000,delay=100,delay_max_ms=5,handshake=20)")]
pub struct FaultPlanError {
    input: String,
    why: String,
}

impl FromStr for FaultPlan {
    type Err = FaultPlanError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why: String| FaultPlanError {
            input: s.to_string(),
            why,
        };
        let mut plan = FaultPlan {
            delay_max: Duration::from_millis(5),
            ..FaultPlan::default()
        };
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| err(format!("`{item}` is not key=value")))?;
            let n: u64 = v.parse().map_err(|e| err(format!("`{k}`: {e}")))?;
            match k {
                "seed" => plan.seed = n,
                "fail" => plan.fail_one_in = n,
                "corrupt" => plan.corrupt_one_in = n,
                "delay" => plan.delay_one_in = n,
                "delay_max_ms" => plan.delay_max = Duration::from_millis(n),
                "handshake" => plan.handshake_fail_one_in = n,
                _ => return Err(err(format!("unknown key `{k}`"))),
            }
        }
        Ok(plan)
    }
}

impl fmt::Display for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed={},fail={},corrupt={},delay={},delay_max_ms={},handshake={}",
            self.seed,
            self.fail_one_in,
            self.corrupt_one_in,
            self.delay_one_in,
            self.delay_max.as_millis(),
            self.handshake_fail_one_in
        )
    }
}

/// What to do with one transmitted unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FaultAction {
    Pass,
    FailLink,
    Corrupt(u64),
    Delay(Duration),
}

/// A worker's draw of faults from a plan.
#[derive(Debug)]
pub(crate) struct FaultInjector {
    plan: FaultPlan,
    rng: StdRng,
}

impl FaultInjector {
    pub(crate) fn new(plan: FaultPlan, worker: usize) -> Self {
        let rng =
            StdRng::seed_from_u64(plan.seed ^ (worker as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        FaultInjector { plan, rng }
    }

    fn one_in(&mut self, n: u64) -> bool {
        n != 0 && self.rng.random_range(0..n) == 0
    }

    /// Decides the fate of one unit; `handshake` marks banner and hello traffic.
    pub(crate) fn decide(&mut self, handshake: bool) -> FaultAction {
        if handshake && self.one_in(self.plan.handshake_fail_one_in) {
            return FaultAction::FailLink;
        }
        if self.one_in(self.plan.fail_one_in) {
            return FaultAction::FailLink;
        }
        if self.one_in(self.plan.corrupt_one_in) {
            return FaultAction::Corrupt(self.rng.random());
        }
        if self.one_in(self.plan.delay_one_in) && !self.plan.delay_max.is_zero() {
            let us = self
                .rng
                .random_range(1..=self.plan.delay_max.as_micros().max(1) as u64);
            return FaultAction::Delay(Duration::from_micros(us));
        }
        FaultAction::Pass
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_round_trips_and_rejects_junk() {
        let p: FaultPlan = "seed=7,fail=500,corrupt=2000,delay=100,delay_max_ms=5,handshake=20"
            .parse()
            .unwrap();
        assert_eq!(p.fail_one_in, 500);
        assert_eq!(p.to_string().parse::<FaultPlan>().unwrap(), p);
        assert!("fail=x".parse::<FaultPlan>().is_err());
        assert!("nope=1".parse::<FaultPlan>().is_err());
    }

    #[test]
    fn same_seed_same_faults() {
        let p: FaultPlan = "seed=3,fail=10,corrupt=10,delay=10".parse().unwrap();
        let draw = |w| {
            let mut f = FaultInjector::new(p.clone(), w);
            (0..1000).map(|i| f.decide(i % 7 == 0)).collect::<Vec<_>>()
        };
        assert_eq!(draw(0), draw(0));
        assert_ne!(draw(0), draw(1));
        let faults = draw(0).iter().filter(|a| **a != FaultAction::Pass).count();
        assert!((150..450).contains(&faults), "about 3 in 10: {faults}");
    }
}
