//! Seeded randomness, shared by the environment kit and the host.
//!
//! Plugins must be deterministic: the same seed gives the same episode on
//! every machine, natively and inside the sandbox. ChaCha8 is portable (its
//! output is specified, unlike `SmallRng`'s), and every draw below is integer
//! arithmetic or an exactly representable float, so no platform can round
//! differently.
//!
//! The host draws from the same stream (sampling, shuffling, the random
//! policy, the conformance suite's seeds) without depending on the guest
//! authoring kit; the kit re-exports [`SeedRng`] for plugin authors.

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

/// A deterministic random stream derived from a `u64` seed.
#[derive(Clone, Debug)]
pub struct SeedRng(ChaCha8Rng);

impl SeedRng {
    pub fn new(seed: u64) -> Self {
        Self(ChaCha8Rng::seed_from_u64(seed))
    }

    /// An independent stream for the same seed, e.g. one for map generation
    /// and one for the dynamics, so that changing how many numbers one part
    /// draws does not shift the other.
    pub fn stream(seed: u64, stream: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        Self(rng)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` without modulo bias (Lemire's method). `n` must be > 0.
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "SeedRng::below(0)");
        let n = n as u64;
        loop {
            let m = (self.next_u64() as u128) * (n as u128);
            let low = m as u64;
            if low >= n.wrapping_neg() % n {
                return (m >> 64) as usize;
            }
        }
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A uniformly chosen element; `None` for an empty slice.
    pub fn choose<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() { None } else { Some(&items[self.below(items.len())]) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_streams_differ() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut r = SeedRng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..8)
            .map({
                let mut r = SeedRng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let c: Vec<u64> = (0..8)
            .map({
                let mut r = SeedRng::stream(7, 1);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut rng = SeedRng::new(1);
        let mut counts = [0u32; 3];
        for _ in 0..30_000 {
            counts[rng.below(3)] += 1;
        }
        for c in counts {
            assert!((9_400..10_600).contains(&c), "{counts:?}");
        }
    }
}
