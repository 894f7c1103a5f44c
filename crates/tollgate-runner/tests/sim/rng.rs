//! The simulation's only source of randomness: SplitMix64, seeded by one `u64`. Integer
//! arithmetic only, so a seed draws the same numbers on every platform.

/// A small seeded generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// True with `percent` % probability.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// An index in `0..len` (`len > 0`).
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// A choice among `(weight, value)` pairs.
    pub fn weighted<T: Copy>(&mut self, table: &[(u64, T)]) -> T {
        let total: u64 = table.iter().map(|(w, _)| w).sum();
        let mut roll = self.below(total);
        for (weight, value) in table {
            if roll < *weight {
                return *value;
            }
            roll -= weight;
        }
        table[table.len() - 1].1
    }

    /// A duration on the simulation's 10 ms grid, `lo..=hi` ms.
    pub fn grid_ms(&mut self, lo: u64, hi: u64) -> u64 {
        10 * self.range(lo / 10, hi / 10)
    }

    /// An independent generator derived from this one.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}

/// FNV-1a over the trace: a digest that is the same on every platform.
pub fn fnv1a(lines: &[String]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for line in lines {
        for byte in line.bytes().chain(std::iter::once(b'\n')) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01B3);
        }
    }
    hash
}
