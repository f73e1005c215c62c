//! Latency histograms: durations counted in logarithmic buckets, recorded from any thread
//! with two atomic adds, read back as percentiles for the input-bound report.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Buckets per power of two. Eight keep a percentile within 12.5% of the true value,
/// which is what a report needs, in 4 KiB per histogram.
const SUB_BITS: u32 = 3;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB as usize;

/// Counts of durations (in nanoseconds), with their sum.
#[derive(Debug)]
pub struct Histogram {
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }
}

/// The bucket of `ns`: exact below `SUB`, then `SUB` buckets per power of two.
fn bucket(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    let log = 63 - ns.leading_zeros();
    let sub = (ns >> (log - SUB_BITS)) & (SUB - 1);
    ((log - SUB_BITS + 1) as u64 * SUB + sub) as usize
}

/// The smallest value of bucket `b` (the inverse of [`bucket`]).
fn lower(b: usize) -> u64 {
    let b = b as u64;
    if b < SUB {
        return b;
    }
    let log = b / SUB - 1 + SUB_BITS as u64;
    (1u64 << log) | ((b % SUB) << (log - SUB_BITS as u64))
}

impl Histogram {
    pub fn record(&self, elapsed: Duration) {
        self.record_ns(elapsed.as_nanos().min(u64::MAX as u128) as u64);
    }

    pub fn record_ns(&self, ns: u64) {
        self.counts[bucket(ns)].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// The counts now, keeping only the buckets that hold any.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            counts: self
                .counts
                .iter()
                .enumerate()
                .filter_map(|(b, c)| {
                    let c = c.load(Relaxed);
                    (c > 0).then_some((b as u16, c))
                })
                .collect(),
            sum_ns: self.sum_ns.load(Relaxed),
        }
    }
}

/// A histogram's counts at one moment: `(bucket, count)` in bucket order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    counts: Vec<(u16, u64)>,
    pub sum_ns: u64,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|&(_, c)| c).sum()
    }

    /// What was recorded after `earlier` (a snapshot of the same histogram).
    pub fn since(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        let before = |b: u16| {
            earlier
                .counts
                .binary_search_by_key(&b, |&(k, _)| k)
                .map_or(0, |i| earlier.counts[i].1)
        };
        HistogramSnapshot {
            counts: self
                .counts
                .iter()
                .filter_map(|&(b, c)| {
                    let c = c.saturating_sub(before(b));
                    (c > 0).then_some((b, c))
                })
                .collect(),
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
        }
    }

    /// The `q` quantile (0 to 1), as the highest value of its bucket (so never below the
    /// true value, and at most an eighth above it); None when empty.
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        // The rank of the wanted value, 1-based, as numpy's "inverted_cdf" takes it.
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for &(b, c) in &self.counts {
            seen += c;
            if seen >= rank {
                return Some(if (b as usize) + 1 < BUCKETS {
                    lower(b as usize + 1) - 1
                } else {
                    u64::MAX
                });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        for b in 0..BUCKETS - 1 {
            assert!(lower(b) < lower(b + 1), "bucket {b}");
            assert_eq!(bucket(lower(b)), b);
            assert_eq!(bucket(lower(b + 1) - 1), b);
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_within_an_eighth() {
        let h = Histogram::default();
        for ms in 1..=100u64 {
            h.record(Duration::from_millis(ms));
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 100);
        for (q, want) in [(0.5, 50e6), (0.99, 99e6), (0.01, 1e6)] {
            let got = s.quantile_ns(q).unwrap() as f64;
            assert!(
                got >= want && got - want <= want / 8.0,
                "q{q}: {got} against {want}"
            );
        }
        let later = {
            h.record(Duration::from_secs(1));
            h.snapshot()
        };
        let window = later.since(&s);
        assert_eq!(window.count(), 1);
        assert_eq!(window.sum_ns, 1_000_000_000);
        assert!(HistogramSnapshot::default().quantile_ns(0.5).is_none());
    }
}
