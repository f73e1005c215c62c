//! A small seeded PRNG (SplitMix64). Defined here rather than taken from a crate so the
//! sample order for a given seed can never change under a dependency upgrade.

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for one purpose (`stream`) within one (seed, epoch).
    pub fn new(seed: u64, epoch: u64, stream: u64) -> Self {
        let mut rng = Rng(seed);
        let a = rng.next_u64();
        let mut rng = Rng(a ^ epoch.wrapping_mul(0xA076_1D64_78BD_642F));
        let b = rng.next_u64();
        Rng(b ^ stream.wrapping_mul(0xE703_7ED1_A0B4_28DB))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the bias is below 2^-32 for our sizes).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Fisher-Yates.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_sensitive_to_every_input() {
        let draw = |s, e, t| {
            let mut r = Rng::new(s, e, t);
            (0..4).map(|_| r.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draw(1, 2, 3), draw(1, 2, 3));
        assert_ne!(draw(1, 2, 3), draw(2, 2, 3));
        assert_ne!(draw(1, 2, 3), draw(1, 3, 3));
        assert_ne!(draw(1, 2, 3), draw(1, 2, 4));
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut v: Vec<u32> = (0..1000).collect();
        Rng::new(7, 0, 0).shuffle(&mut v);
        assert_ne!(v, (0..1000).collect::<Vec<_>>());
        v.sort();
        assert_eq!(v, (0..1000).collect::<Vec<_>>());
        assert!((0..10_000).all(|_| Rng::new(1, 1, 1).below(3) < 3));
    }
}
