//! `ds.pack(seq_length, ...)`: token sequences packed into rows of at most `seq_length`
//! tokens, as TRL's `pack_dataset` packs them, window by window.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use arrow_array::builder::{Int32Builder, ListBuilder};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, ListArray, RecordBatch, RecordBatchOptions};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::pipeline::BatchTransform;

/// Columns packed beside `input_ids` when the caller names none: the per-token columns
/// transformers and TRL build.
const SIBLINGS: [&str; 5] = [
    "assistant_masks",
    "labels",
    "attention_mask",
    "completion_mask",
    "token_type_ids",
];

/// What to do with a sequence longer than `seq_length` (best-fit packing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TooLong {
    /// Keep its first `seq_length` tokens (TRL's `bfd`).
    Truncate,
    /// Cut it into pieces of `seq_length` tokens, the last shorter (TRL's `bfd_split`).
    Split,
    /// Refuse it.
    Error,
}

/// How sequences are packed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Best fit decreasing over each window, sequence boundaries kept (`seq_lengths`).
    BestFit(TooLong),
    /// The window's tokens concatenated and cut every `seq_length` (TRL's `wrapped`).
    Wrapped,
}

/// The pack op: each window of `window_rows` rows (TRL's map batch) packed on its own.
pub struct Pack {
    /// Tokens a packed row holds at most.
    pub seq_length: usize,
    /// How sequences go into rows.
    pub strategy: Strategy,
    /// The columns packed; `None`: `input_ids` and the per-token columns beside it
    /// (`assistant_masks`, `labels`, ...) that are present.
    pub columns: Option<Vec<String>>,
    /// Rows packed together (TRL's map `batch_size`).
    pub window_rows: usize,
}

/// One sequence (or, split, one piece of one) of a window: its row and token range.
#[derive(Clone, Copy)]
struct Item {
    row: usize,
    start: usize,
    len: usize,
}

impl Pack {
    /// The columns this op packs in `schema`, each a list column.
    fn packed_columns(&self, schema: &Schema) -> Result<Vec<(usize, Field)>> {
        let names: Vec<String> = match &self.columns {
            Some(names) => names.clone(),
            None => std::iter::once("input_ids")
                .chain(
                    SIBLINGS
                        .iter()
                        .copied()
                        .filter(|n| schema.index_of(n).is_ok()),
                )
                .map(str::to_string)
                .collect(),
        };
        names
            .iter()
            .map(|name| {
                let index = schema.index_of(name).map_err(|_| Error::Schema {
                    url: String::new(),
                    message: format!(
                        "pack: no column {name:?}; the columns are {:?}",
                        crate::format::field_names(&Arc::new(schema.clone()))
                    ),
                })?;
                let field = schema.field(index);
                match field.data_type() {
                    DataType::List(item) | DataType::LargeList(item) => Ok((
                        index,
                        Field::new(name, DataType::List(item.clone()), field.is_nullable()),
                    )),
                    other => Err(Error::Schema {
                        url: String::new(),
                        message: format!(
                            "pack: column {name:?} is {other}, not a list of token values"
                        ),
                    }),
                }
            })
            .collect()
    }

    fn schema_for(&self, packed: &[(usize, Field)]) -> SchemaRef {
        let mut fields: Vec<Field> = packed.iter().map(|(_, f)| f.clone()).collect();
        if matches!(self.strategy, Strategy::BestFit(_)) {
            fields.push(Field::new(
                "seq_lengths",
                DataType::List(Arc::new(Field::new("item", DataType::Int32, true))),
                true,
            ));
        }
        Arc::new(Schema::new(fields))
    }

    /// The window's sequences as best fit decreasing packs them: the packs in the order
    /// they were opened, each with its items in the order they went in.
    fn best_fit(&self, items: &[Item]) -> Vec<Vec<usize>> {
        // Longest first; a stable sort keeps equal lengths in row order, as pyarrow's does.
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by(|&a, &b| items[b].len.cmp(&items[a].len));
        let mut packs: Vec<Vec<usize>> = Vec::new();
        // Room left -> the packs with that much room, oldest first. The smallest room
        // that fits is taken, as TRL's segment tree finds it; a new pack otherwise.
        let mut by_room: BTreeMap<usize, VecDeque<usize>> = BTreeMap::new();
        let mut room_of: Vec<usize> = Vec::new();
        for i in order {
            let len = items[i].len;
            // Rooms listed hold at least one pack each (an emptied room is removed).
            let fit = by_room
                .range_mut(len.max(1)..self.seq_length)
                .next()
                .and_then(|(&room, queue)| Some((room, queue.pop_front()?, queue.is_empty())));
            let pack = match fit {
                Some((room, pack, emptied)) => {
                    if emptied {
                        by_room.remove(&room);
                    }
                    pack
                }
                None => {
                    packs.push(Vec::new());
                    room_of.push(self.seq_length);
                    packs.len() - 1
                }
            };
            packs[pack].push(i);
            room_of[pack] -= len;
            if room_of[pack] > 0 {
                by_room.entry(room_of[pack]).or_default().push_back(pack);
            }
        }
        packs
    }
}

/// The values of `column` at the token ranges `ranges` (row, start, len), in order: each
/// range copied whole (a pack's sequences are runs of a row's values).
fn gather(
    column: &ListArray,
    ranges: impl Iterator<Item = (usize, usize, usize)>,
) -> Result<ArrayRef> {
    let offsets = column.value_offsets();
    let runs: Vec<(usize, usize)> = ranges
        .map(|(row, start, len)| (offsets[row] as usize + start, len))
        .collect();
    let values = column.values().to_data();
    let capacity = runs.iter().map(|&(_, len)| len).sum();
    let mut out = arrow_data::transform::MutableArrayData::new(vec![&values], false, capacity);
    for (first, len) in runs {
        out.try_extend(0, first, first + len)
            .map_err(|e| Error::Internal(format!("packing tokens: {e}")))?;
    }
    Ok(arrow_array::make_array(out.freeze()))
}

fn list(field: &Field, offsets: Vec<i32>, values: ArrayRef) -> Result<ArrayRef> {
    let DataType::List(item) = field.data_type() else {
        return Err(Error::Internal("a packed column is a list".into()));
    };
    Ok(Arc::new(
        ListArray::try_new(
            item.clone(),
            OffsetBuffer::new(offsets.into()),
            values,
            None,
        )
        .map_err(|e| Error::Internal(format!("packed column: {e}")))?,
    ))
}

impl BatchTransform for Pack {
    fn apply(&self, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        let packed = self.packed_columns(&batch.schema())?;
        let schema = self.schema_for(&packed);
        let columns: Vec<ListArray> = packed
            .iter()
            .map(|(index, field)| {
                let column = arrow_cast::cast(batch.column(*index), field.data_type())
                    .map_err(|e| Error::Internal(format!("pack: column {}: {e}", field.name())))?;
                Ok(column.as_list::<i32>().clone())
            })
            .collect::<Result<_>>()?;
        let lengths: Vec<usize> = (0..batch.num_rows())
            .map(|row| {
                if columns[0].is_null(row) {
                    0
                } else {
                    columns[0].value_length(row) as usize
                }
            })
            .collect();
        for (column, (_, field)) in columns.iter().zip(&packed).skip(1) {
            for (row, &len) in lengths.iter().enumerate() {
                let other = if column.is_null(row) {
                    0
                } else {
                    column.value_length(row) as usize
                };
                if other != len {
                    return Err(Error::Schema {
                        url: String::new(),
                        message: format!(
                            "pack: a row's {:?} has {other} values and its {:?} {len}; packed columns run side by side",
                            field.name(),
                            packed[0].1.name()
                        ),
                    });
                }
            }
        }
        let seq = self.seq_length;
        let mut out: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        let rows = match self.strategy {
            Strategy::Wrapped => {
                let total: usize = lengths.iter().sum();
                let mut offsets: Vec<i32> = (0..total).step_by(seq).map(|o| o as i32).collect();
                offsets.push(total as i32);
                for (column, (_, field)) in columns.iter().zip(&packed) {
                    let values = gather(
                        column,
                        lengths.iter().enumerate().map(|(row, &len)| (row, 0, len)),
                    )?;
                    out.push(list(field, offsets.clone(), values)?);
                }
                offsets.len() - 1
            }
            Strategy::BestFit(too_long) => {
                let mut items = Vec::new();
                for (row, &len) in lengths.iter().enumerate() {
                    match too_long {
                        _ if len == 0 => {}
                        TooLong::Truncate => items.push(Item {
                            row,
                            start: 0,
                            len: len.min(seq),
                        }),
                        TooLong::Split => items.extend((0..len).step_by(seq).map(|start| Item {
                            row,
                            start,
                            len: seq.min(len - start),
                        })),
                        TooLong::Error if len > seq => {
                            return Err(Error::invalid_argument(format!(
                                "pack: a sequence of {len} tokens is longer than seq_length={seq} (on_too_long=\"error\"; \"truncate\" or \"split\" pack it)"
                            )));
                        }
                        TooLong::Error => items.push(Item { row, start: 0, len }),
                    }
                }
                let packs = self.best_fit(&items);
                let mut offsets = vec![0i32];
                let mut seq_lengths = ListBuilder::new(Int32Builder::new());
                for pack in &packs {
                    let tokens: usize = pack.iter().map(|&i| items[i].len).sum();
                    offsets.push(offsets[offsets.len() - 1] + tokens as i32);
                    seq_lengths.values().append_values(
                        &pack
                            .iter()
                            .map(|&i| items[i].len as i32)
                            .collect::<Vec<_>>(),
                        &vec![true; pack.len()],
                    );
                    seq_lengths.append(true);
                }
                let ranges = || {
                    packs
                        .iter()
                        .flatten()
                        .map(|&i| (items[i].row, items[i].start, items[i].len))
                };
                for (column, (_, field)) in columns.iter().zip(&packed) {
                    out.push(list(field, offsets.clone(), gather(column, ranges())?)?);
                }
                out.push(Arc::new(seq_lengths.finish()));
                packs.len()
            }
        };
        if rows == 0 {
            return Ok(Vec::new());
        }
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        Ok(vec![
            RecordBatch::try_new_with_options(schema, out, &options)
                .map_err(|e| Error::Internal(format!("packed rows: {e}")))?,
        ])
    }

    fn preserves_rows(&self) -> bool {
        false
    }

    fn batch_rows(&self) -> Option<usize> {
        Some(self.window_rows)
    }

    fn describe(&self) -> String {
        format!(
            "pack(seq_length={}, strategy={:?}, columns={:?}, buffer_rows={})",
            self.seq_length, self.strategy, self.columns, self.window_rows
        )
    }

    fn output_schema(&self, input: &SchemaRef) -> Option<SchemaRef> {
        Some(self.schema_for(&self.packed_columns(input).ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(
        strategy: Strategy,
        seq_length: usize,
        rows: &[&[i32]],
    ) -> (Vec<Vec<i32>>, Option<Vec<Vec<i32>>>) {
        let mut ids = ListBuilder::new(Int32Builder::new());
        for row in rows {
            ids.values().append_slice(row);
            ids.append(true);
        }
        let ids: ArrayRef = Arc::new(ids.finish());
        let batch = RecordBatch::try_from_iter([("input_ids", ids)]).unwrap();
        let op = Pack {
            seq_length,
            strategy,
            columns: None,
            window_rows: 1000,
        };
        let out = op.apply(batch).unwrap().remove(0);
        let lists = |c: &ArrayRef| -> Vec<Vec<i32>> {
            let c = c.as_list::<i32>();
            (0..c.len())
                .map(|i| {
                    c.value(i)
                        .as_primitive::<arrow_array::types::Int32Type>()
                        .values()
                        .to_vec()
                })
                .collect()
        };
        (
            lists(out.column(0)),
            out.column_by_name("seq_lengths").map(lists),
        )
    }

    #[test]
    fn packs_as_trl_documents_it() {
        // TRL's pack_dataset docstring example.
        let rows: [&[i32]; 4] = [&[1, 2, 3, 4, 5], &[6, 7], &[8, 9, 10], &[11]];
        let (ids, lengths) = pack(Strategy::BestFit(TooLong::Truncate), 4, &rows);
        assert_eq!(ids, [vec![1, 2, 3, 4], vec![8, 9, 10, 11], vec![6, 7]]);
        assert_eq!(lengths.unwrap(), [vec![4], vec![3, 1], vec![2]]);
        let (ids, lengths) = pack(Strategy::BestFit(TooLong::Split), 4, &rows);
        assert_eq!(ids, [vec![1, 2, 3, 4], vec![8, 9, 10, 5], vec![6, 7, 11]]);
        assert_eq!(lengths.unwrap(), [vec![4], vec![3, 1], vec![2, 1]]);
        let (ids, lengths) = pack(Strategy::Wrapped, 4, &rows);
        assert_eq!(ids, [vec![1, 2, 3, 4], vec![5, 6, 7, 8], vec![9, 10, 11]]);
        assert!(lengths.is_none());
    }
}
