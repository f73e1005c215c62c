//! A stream format's records found by indexing: where each record of a shard is
//! ([`ShardIndex`]), what a format offers to find and decode them ([`RecordCodec`]), and
//! the per-record reads of an indexed dataset ([`RecordAccess`]). `index` builds and
//! keeps the indexes.

use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;

use super::unit::{Decoded, WorkUnit};
use crate::error::Result;
use crate::source::ShardMeta;

const MAGIC: &[u8; 8] = b"SFINDEX1";

/// Where each record of one shard is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardIndex {
    /// What the shard was when indexed: URL, size and mtime or ETag.
    pub key: String,
    pub rows: u64,
    /// Record `i` is the bytes `offsets[i]..offsets[i + 1]` of the file (`rows + 1`
    /// entries). Empty for a compressed file, whose records cannot be read by range.
    pub offsets: Vec<u64>,
    /// Bytes every record needs to be decoded (a CSV file's header line); usually empty.
    pub header: Vec<u8>,
}

impl ShardIndex {
    /// The index of a shard whose records start at `offsets` (plus its end); a shard
    /// that is not `by_range` (compressed) keeps only the count.
    pub fn new(key: String, offsets: Vec<u64>, by_range: bool, header: Vec<u8>) -> Self {
        Self {
            key,
            rows: offsets.len().saturating_sub(1) as u64,
            offsets: if by_range { offsets } else { Vec::new() },
            header,
        }
    }

    pub fn by_range(&self) -> bool {
        !self.offsets.is_empty()
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.key.len() + self.offsets.len() * 8);
        out.extend_from_slice(MAGIC);
        for part in [self.key.as_bytes(), &self.header] {
            out.extend_from_slice(&(part.len() as u64).to_le_bytes());
            out.extend_from_slice(part);
        }
        out.extend_from_slice(&self.rows.to_le_bytes());
        out.extend_from_slice(&(self.offsets.len() as u64).to_le_bytes());
        for offset in &self.offsets {
            out.extend_from_slice(&offset.to_le_bytes());
        }
        out
    }

    /// Parses a persisted index; `None` for anything that is not a whole, valid one.
    pub(crate) fn decode(mut data: &[u8]) -> Option<Self> {
        fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            if data.len() < n {
                return None;
            }
            let (head, rest) = data.split_at(n);
            *data = rest;
            Some(head)
        }
        fn u64_of(data: &mut &[u8]) -> Option<u64> {
            Some(u64::from_le_bytes(take(data, 8)?.try_into().ok()?))
        }
        if take(&mut data, 8)? != MAGIC {
            return None;
        }
        let key_len = usize::try_from(u64_of(&mut data)?).ok()?;
        let key = String::from_utf8(take(&mut data, key_len)?.to_vec()).ok()?;
        let header_len = usize::try_from(u64_of(&mut data)?).ok()?;
        let header = take(&mut data, header_len)?.to_vec();
        let rows = u64_of(&mut data)?;
        let count = usize::try_from(u64_of(&mut data)?).ok()?;
        if data.len() != count.checked_mul(8)? {
            return None;
        }
        let offsets: Vec<u64> = data
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        let consistent = offsets.is_empty()
            || (rows.checked_add(1) == Some(offsets.len() as u64)
                && offsets.windows(2).all(|w| w[0] <= w[1]));
        consistent.then_some(Self {
            key,
            rows,
            offsets,
            header,
        })
    }
}

/// What a stream format offers for indexing: finding its records, and decoding a run of
/// whole records read by range.
pub trait RecordCodec: Send + Sync {
    /// Reads a shard from its first byte and finds its records. `key` goes into the
    /// index as is.
    fn scan(
        &self,
        shard: &ShardMeta,
        stream: Box<dyn Read + Send>,
        key: String,
    ) -> Result<ShardIndex>;
    /// Decodes `data`, the bytes of records `first..` of an uncompressed shard.
    fn decode_records(
        &self,
        shard: &ShardMeta,
        index: &ShardIndex,
        data: Bytes,
        first: u64,
    ) -> Result<Decoded>;
}

/// Per-record reads of an indexed dataset, for random access.
#[derive(Clone)]
pub struct RecordAccess {
    pub codec: Arc<dyn RecordCodec>,
    pub indexes: Vec<Arc<ShardIndex>>,
    /// As in `IndexedJobs`: each unit's records, by shard and part.
    pub parts: Vec<Vec<(u64, u64)>>,
}

impl RecordAccess {
    /// The first record of `unit`, when its shard is read by range.
    pub fn first_record(&self, unit: &WorkUnit) -> Option<u64> {
        self.indexes[unit.shard]
            .by_range()
            .then(|| self.parts[unit.shard][unit.part].0)
    }
}
