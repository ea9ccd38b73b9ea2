//! Independent seeds from one run seed: each client, server incarnation's
//! fault plan, the chaos thread and the RMA write contents draw from a
//! stream of their own, all derived from `StressConfig::seed`.

/// Mixes the run's seed with a role and index into an independent seed.
pub(crate) fn mix(seed: u64, role: u64, index: u64) -> u64 {
    let mut x =
        seed ^ role.wrapping_mul(0xa076_1d64_78bd_642f) ^ index.wrapping_mul(0xe703_7ed1_a0b4_28db);
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
