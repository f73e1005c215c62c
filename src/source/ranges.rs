//! Byte ranges fetched from one object: coalescing nearby ranges into few reads, and a
//! sparse in-memory view that decoders read from as if it were the whole object.

use std::ops::Range;

use bytes::Bytes;

/// Merges ranges whose gap is at most `max_gap` bytes; the result is sorted.
/// Reading a small gap costs less than another request or syscall.
pub fn coalesce(mut ranges: Vec<Range<u64>>, max_gap: u64) -> Vec<Range<u64>> {
    ranges.retain(|r| r.start < r.end);
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end.saturating_add(max_gap) => {
                last.end = last.end.max(r.end);
            }
            _ => out.push(r),
        }
    }
    out
}

/// Disjoint fetched ranges of an object of known total length.
#[derive(Debug, Clone, Default)]
pub struct RangeSet {
    /// Sorted by start, non-overlapping.
    parts: Vec<(u64, Bytes)>,
    total_len: u64,
}

impl RangeSet {
    pub fn new(total_len: u64) -> Self {
        Self {
            parts: Vec::new(),
            total_len,
        }
    }

    pub fn insert(&mut self, start: u64, data: Bytes) {
        let at = self.parts.partition_point(|(s, _)| *s < start);
        self.parts.insert(at, (start, data));
    }

    pub fn total_len(&self) -> u64 {
        self.total_len
    }

    /// The bytes `[start, start + len)` if one fetched part holds all of them.
    pub fn get(&self, start: u64, len: u64) -> Option<Bytes> {
        if len == 0 {
            return Some(Bytes::new());
        }
        let (part_start, data) = self.part_containing(start)?;
        let from = (start - part_start) as usize;
        let to = from.checked_add(usize::try_from(len).ok()?)?;
        (to <= data.len()).then(|| data.slice(from..to))
    }

    /// Everything fetched from `start` to the end of the part holding it.
    pub fn tail_from(&self, start: u64) -> Option<Bytes> {
        let (part_start, data) = self.part_containing(start)?;
        Some(data.slice((start - part_start) as usize..))
    }

    fn part_containing(&self, offset: u64) -> Option<(u64, &Bytes)> {
        let idx = self
            .parts
            .partition_point(|(s, _)| *s <= offset)
            .checked_sub(1)?;
        let (start, data) = &self.parts[idx];
        (offset < start + data.len() as u64).then_some((*start, data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesces_close_ranges_only() {
        let merged = coalesce(vec![20..30, 0..10, 12..15, 100..110], 2);
        assert_eq!(merged, vec![0..15, 20..30, 100..110]);
        assert_eq!(coalesce(vec![5..5, 0..4], 0), vec![0..4]);
    }

    #[test]
    fn sparse_lookup() {
        let mut set = RangeSet::new(1000);
        set.insert(100, Bytes::from_static(b"abcdef"));
        set.insert(0, Bytes::from_static(b"xy"));
        assert_eq!(set.get(102, 3).unwrap(), &b"cde"[..]);
        assert_eq!(set.get(1, 1).unwrap(), &b"y"[..]);
        assert!(set.get(104, 5).is_none());
        assert!(set.get(50, 1).is_none());
        assert_eq!(set.tail_from(104).unwrap(), &b"ef"[..]);
    }
}
