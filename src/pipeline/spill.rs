//! The external two-pass shuffle: rows read by index (a full-permutation `shuffle`, a
//! `select`) whose units are decoded whole at every visit (compressed Parquet pages,
//! compressed stream units) and outgrow the memory budget. Gathering them visits each
//! unit once per gather, decoding the data many times over; here it is decoded once:
//!
//! 1. the units are read in their order, each once (on `threads` threads), and every row
//!    is written to the bucket file of its place in the stream, as Arrow IPC batches;
//! 2. the buckets are read back one at a time (the next read while the last is served),
//!    each put in the stream's order in memory and cut into gathers.
//!
//! The classic shuffle of MapReduce and Spark. Its cost is one read of the data in order,
//! one sequential write and one sequential read of local disk, whatever the compression
//! and row size; memory holds a few units and two buckets. The rows, and their order,
//! are those the gathers would give: the plan changes how they are read, never which.
//!
//! The bucket files are unlinked as soon as they are made (`O_TMPFILE`): the kernel frees
//! them when the stream is dropped (the epoch's end, `break`, Ctrl-C) or the process
//! dies (`kill -9` included), so a crash leaves nothing for a later run to trip over.

use std::fs::File;
use std::io::{BufWriter, Seek};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::thread::JoinHandle;

use arrow_array::RecordBatch;
use arrow_ipc::writer::StreamWriter;

use super::autotune::SpillOptions;
use super::pool::join_ended;
use super::random_access::RandomAccess;
use super::rows::RowList;
use super::stats::Stats;
use crate::batch_bytes::batch_bytes;
use crate::error::{Error, Result};

/// The bytes a stream may spill into `dir` (made if missing): `options`' own, or half
/// the free space there (0 if the directory cannot be made or measured).
fn budget(options: &SpillOptions, dir: &Path) -> u64 {
    if options.bytes == Some(0) || std::fs::create_dir_all(dir).is_err() {
        return 0;
    }
    options
        .bytes
        .unwrap_or_else(|| free_bytes(dir).unwrap_or(0) / 2)
}

/// Free bytes of the file system holding `dir`, for an unprivileged writer.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; the path is a valid NUL-terminated string and
    // `stat` a valid, writable struct for the duration of the call.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

/// A file in `dir` with no name: freed by the kernel when closed, however the process
/// ends.
fn anonymous_file(dir: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmpfile = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir);
    match tmpfile {
        Ok(file) => Ok(file),
        // File systems without O_TMPFILE: a named file, unlinked at once.
        Err(_) => {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let path = dir.join(format!(
                ".shardflow-spill-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Relaxed)
            ));
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            std::fs::remove_file(&path)?;
            Ok(file)
        }
    }
}

/// What the stream reading from a spill receives: a gather (its first position, its rows
/// in order), or word that spilling failed before any gather (the reason), so that the
/// stream reads its rows another way.
pub(super) enum Delivery {
    Gather(u64, Result<RecordBatch>),
    Fallback(String),
}

/// A spill in progress on its own thread, delivering its gathers in order.
pub(super) struct Spill {
    receiver: Receiver<Delivery>,
    /// A delivery taken by [`Self::ready`], not handed out yet.
    pending: Option<Delivery>,
    /// The plan and its sender, until [`Self::begin`] starts the thread.
    deferred: Option<(SpillPlan, SyncSender<Delivery>)>,
    stop: Arc<AtomicBool>,
    /// Joined once the last gather is out (see `next`).
    thread: Option<JoinHandle<()>>,
}

/// What the spill of one stream's rows is given.
pub(super) struct SpillPlan {
    pub access: Arc<RandomAccess>,
    pub stats: Arc<Stats>,
    /// The stream's rows: positions of `access`, in the order they are delivered.
    pub rows: RowList,
    /// Threads reading units at once, at most.
    pub threads: usize,
    /// Bytes the units read at once may take (each is fetched, decoded and its rows taken
    /// out: about three times its decoded size).
    pub units_bytes: u64,
    /// Bytes of rows per gather delivered, and per bucket file.
    pub gather_bytes: u64,
    pub bucket_bytes: u64,
    /// Rows of the loader's batches, where the gathers go straight to its re-batching (0
    /// if not): gathers of a multiple of them are cut into batches without a copy.
    pub batch_rows: u64,
    pub options: SpillOptions,
    /// Gathers give binary columns as views of the mapped bucket (see
    /// [`super::stream::interleave_viewing`]).
    pub views: bool,
}

/// Bucket files one spill writes at most (each is an open file while it is written).
const MAX_BUCKETS: u64 = 256;
/// Rows per gather at most.
const GATHER_ROWS: u64 = 65_536;
/// A batch within this many gathers' bytes is delivered as one gather.
const NEAR_GATHERS: u64 = 2;
/// Buffer of each bucket's writer.
const WRITE_BUFFER: usize = 256 << 10;

impl Spill {
    /// Starts spilling `plan`'s rows (on a thread of its own).
    pub fn start(plan: SpillPlan) -> Self {
        let mut spill = Self::deferred(plan);
        spill.begin();
        spill
    }

    /// A spill of `plan`'s rows that starts at [`Self::begin`] (or when first waited on).
    pub fn deferred(plan: SpillPlan) -> Self {
        let (sender, receiver) = sync_channel(2);
        Self {
            receiver,
            pending: None,
            deferred: Some((plan, sender)),
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
        }
    }

    /// Starts the spill's thread, if not started yet.
    pub fn begin(&mut self) {
        let Some((plan, sender)) = self.deferred.take() else {
            return;
        };
        let stopped = self.stop.clone();
        let fallback = sender.clone();
        let spawned = std::thread::Builder::new()
            .name("shardflow-spill".into())
            .spawn(move || run(plan, &sender, &stopped));
        match spawned {
            Ok(thread) => self.thread = Some(thread),
            Err(e) => {
                // No thread: the stream reads its rows another way.
                let _ = fallback.send(Delivery::Fallback(format!("no spill thread: {e}")));
            }
        }
    }

    /// Whether [`Self::next`] would return without waiting (false before it begins).
    pub fn ready(&mut self) -> bool {
        if self.deferred.is_some() {
            return false;
        }
        if self.pending.is_none() {
            match self.receiver.try_recv() {
                Ok(delivery) => self.pending = Some(delivery),
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => {}
            }
        }
        true
    }

    /// The next delivery; None once every gather is out.
    pub fn next(&mut self) -> Option<Delivery> {
        self.begin();
        if let Some(delivery) = self.pending.take() {
            return Some(delivery);
        }
        let delivery = self.receiver.recv().ok();
        if delivery.is_none() {
            join_ended(&mut self.thread);
        }
        delivery
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        // The thread stops at its next unit or gather; its files close with it.
        self.stop.store(true, Relaxed);
    }
}

/// Why a spill ended early.
enum Failure {
    /// The spill itself failed (no room, no directory): the rows can be read another way.
    Spill(String),
    /// The rows could not be read (a corrupt unit): reading them another way fails too.
    Rows(Error),
    /// The stream was dropped.
    Stopped,
}

fn spill_error(what: &str, dir: &Path, e: impl std::fmt::Display) -> Failure {
    Failure::Spill(format!("{what} in {}: {e}", dir.display()))
}

fn run(plan: SpillPlan, sender: &SyncSender<Delivery>, stop: &AtomicBool) {
    match spill(&plan, stop) {
        Ok(buckets) => serve(buckets, plan.views, sender, stop),
        Err(Failure::Spill(why)) => {
            let _ = sender.send(Delivery::Fallback(why));
        }
        Err(Failure::Rows(e)) => {
            let first = plan.rows.first().map_or(0, |r| r.start);
            let _ = sender.send(Delivery::Gather(first, Err(e)));
        }
        Err(Failure::Stopped) => {}
    }
}

/// The stream's rows cut into gathers (within one range of positions each) and the
/// gathers grouped into buckets.
struct Layout {
    /// Each gather: its first place (index into the stream's rows), rows, first position.
    gathers: Vec<(u64, u64, u64)>,
    /// Each bucket: its first place, and its gathers.
    buckets: Vec<(u64, Range<usize>)>,
}

impl Layout {
    fn new(rows: &RowList, gather_rows: u64, bucket_rows: u64) -> Self {
        let mut gathers = Vec::new();
        let mut place = 0u64;
        for range in rows {
            let mut at = range.start;
            while at < range.end {
                let n = gather_rows.min(range.end - at);
                gathers.push((place, n, at));
                place += n;
                at += n;
            }
        }
        let mut buckets: Vec<(u64, Range<usize>)> = Vec::new();
        let mut filled = u64::MAX;
        for (g, &(first, n, _)) in gathers.iter().enumerate() {
            if filled >= bucket_rows {
                buckets.push((first, g..g));
                filled = 0;
            }
            if let Some(last) = buckets.last_mut() {
                last.1.end = g + 1;
            }
            filled += n;
        }
        Self { gathers, buckets }
    }

    /// The bucket of place `place`.
    fn bucket(&self, place: u64) -> usize {
        self.buckets.partition_point(|(first, _)| *first <= place) - 1
    }
}

/// A bucket file being written: where its rows went, in the order written.
struct Bucket {
    writer: Option<StreamWriter<BufWriter<File>>>,
    /// The place of each row written, in order.
    places: Vec<u32>,
}

/// The buckets, written: each file and the places of its rows in the order written.
struct Spilled {
    layout: Layout,
    files: Vec<(Option<File>, Vec<u32>)>,
}

/// Some of a unit's rows, ready for their buckets: their places (ascending) and the rows
/// in that order.
type Piece = (Vec<u32>, RecordBatch);

/// Decoded rows a unit streamed is cut into pieces by: enough for each bucket to get
/// several rows from a piece, few enough that a unit of any size is never held whole.
const PIECE_BYTES: u64 = 8 << 20;
/// Rows this wide are written to their buckets one by one, where they lie: a message's
/// header is a fraction of a percent of such a row.
const WIDE_ROW_BYTES: u64 = 64 << 10;

/// A row wanted of a unit: its offset in the unit, and its place in the stream.
type Wanted = (u64, u32);

/// Cuts one unit's rows, as the decoder hands them over in their stored order, into
/// pieces of the rows the stream wants from it.
struct Cutter<'a> {
    /// The wanted rows: (offset in the unit, place), by offset.
    wanted: &'a [Wanted],
    /// Decoded batches not cut yet, their bytes, and the offset of their first row.
    held: Vec<RecordBatch>,
    held_bytes: u64,
    held_from: u64,
}

impl<'a> Cutter<'a> {
    fn new(wanted: &'a [Wanted]) -> Self {
        Self {
            wanted,
            held: Vec::new(),
            held_bytes: 0,
            held_from: 0,
        }
    }

    /// Takes `batch`, the unit's next rows; pieces once enough are held.
    fn push(&mut self, batch: RecordBatch) -> Option<Result<Vec<Piece>>> {
        self.held_bytes += batch_bytes(&batch);
        self.held.push(batch);
        (self.held_bytes >= PIECE_BYTES)
            .then(|| self.cut())
            .flatten()
    }

    /// The wanted rows among those held, in place order (None if none is wanted): wide
    /// rows each as a piece of its own, a view of the decoded batch (the bucket's writer
    /// copies it once, to the file); narrow ones gathered into one piece, as a message
    /// per row would cost more than the copy.
    fn cut(&mut self) -> Option<Result<Vec<Piece>>> {
        let held = std::mem::take(&mut self.held);
        let held_bytes = std::mem::take(&mut self.held_bytes);
        let from = self.held_from;
        let rows: u64 = held.iter().map(|b| b.num_rows() as u64).sum();
        self.held_from += rows;
        let n = self
            .wanted
            .partition_point(|&(offset, _)| offset < from + rows);
        let (now, later) = self.wanted.split_at(n);
        self.wanted = later;
        if now.is_empty() {
            return None;
        }
        // Each held batch's first offset, to place the wanted rows among them.
        let mut starts = Vec::with_capacity(held.len());
        let mut at = from;
        for batch in &held {
            starts.push(at);
            at += batch.num_rows() as u64;
        }
        let mut picks: Vec<(u32, usize, usize)> = now
            .iter()
            .map(|&(offset, place)| {
                let b = starts.partition_point(|&s| s <= offset) - 1;
                (place, b, (offset - starts[b]) as usize)
            })
            .collect();
        picks.sort_unstable_by_key(|&(place, _, _)| place);
        if held_bytes / rows.max(1) >= WIDE_ROW_BYTES {
            let pieces = picks
                .into_iter()
                .map(|(place, b, row)| (vec![place], held[b].slice(row, 1)))
                .collect();
            return Some(Ok(pieces));
        }
        let flat: Vec<(usize, usize)> = picks.iter().map(|&(_, b, r)| (b, r)).collect();
        let sources: Vec<&RecordBatch> = held.iter().collect();
        let rows = super::stream::interleave_rows(&sources, &flat)
            .map_err(|e| Error::Internal(format!("gather failed: {e}")));
        Some(rows.map(|rows| vec![(picks.into_iter().map(|(p, _, _)| p).collect(), rows)]))
    }
}

/// One unit's rows, `wanted` (sorted: by offset in the unit where it is streamed, else
/// by place), read once and handed to `each` as pieces. A unit the access can stream is
/// never decoded whole (see [`RandomAccess::stream_unit`]); otherwise its rows are
/// gathered at once, in place order.
fn read_unit(
    plan: &SpillPlan,
    places: &[u64],
    unit: u64,
    wanted: &[Wanted],
    each: &mut dyn FnMut(Result<Vec<Piece>>),
) {
    if !plan.access.streams_units() {
        let positions: Vec<u64> = wanted.iter().map(|&(_, p)| places[p as usize]).collect();
        let rows = plan.access.rows_charged(&positions, Some(&plan.stats.io));
        each(rows.map(|rows| vec![(wanted.iter().map(|&(_, p)| p).collect(), rows)]));
        return;
    }
    let mut cutter = Cutter::new(wanted);
    let streamed = plan.access.stream_unit(unit, &plan.stats.io, &mut |batch| {
        if let Some(piece) = cutter.push(batch) {
            each(piece);
        }
    });
    match streamed {
        Ok(()) => {
            if let Some(piece) = cutter.cut() {
                each(piece);
            }
        }
        Err(e) => each(Err(e)),
    }
}

/// Each unit's rows, `(offset in the unit, place)`, by offset where the unit is streamed
/// (the order the decoder hands its rows over), else by place (the order they are
/// gathered in): one read of the unit serves them all. The rows, unit after unit in
/// ascending order, and each unit's range of them.
///
/// Grouped by a counting pass (units are few beside rows), then each streamed unit's rows
/// sorted on `threads` threads: one sort of every row on the spill's thread took 0.25 s
/// for 4 million rows before any unit was read.
fn rows_by_unit(
    plan: &SpillPlan,
    places: &[u64],
    streams: bool,
) -> (Vec<Wanted>, Vec<(u64, Range<usize>)>) {
    let located: Vec<(u64, u64)> = places
        .iter()
        .map(|&position| {
            if streams {
                plan.access.unit_offset(position)
            } else {
                (plan.access.unit_of(position), 0)
            }
        })
        .collect();
    let Some(last_unit) = located.iter().map(|&(unit, _)| unit).max() else {
        return (Vec::new(), Vec::new());
    };
    // Each unit's first row among the grouped ones.
    let mut starts = vec![0usize; last_unit as usize + 2];
    for &(unit, _) in &located {
        starts[unit as usize + 1] += 1;
    }
    for u in 1..starts.len() {
        starts[u] += starts[u - 1];
    }
    // Places ascend within each unit: they are put in their order.
    let mut flat = vec![(0u64, 0u32); located.len()];
    let mut next = starts.clone();
    for (place, &(unit, offset)) in located.iter().enumerate() {
        flat[next[unit as usize]] = (offset, place as u32);
        next[unit as usize] += 1;
    }
    drop(located);
    let units: Vec<(u64, Range<usize>)> = starts
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[1] > w[0])
        .map(|(unit, w)| (unit as u64, w[0]..w[1]))
        .collect();
    if streams {
        // The units' slices dealt to the threads, largest first, each to the least loaded.
        let threads = plan.threads.clamp(1, units.len().max(1));
        let mut shares: Vec<(usize, Vec<&mut [Wanted]>)> =
            (0..threads).map(|_| (0, Vec::new())).collect();
        // The units' ranges follow one another from the first row.
        let mut slices: Vec<&mut [Wanted]> = Vec::with_capacity(units.len());
        let mut rest = flat.as_mut_slice();
        for (_, rows) in &units {
            let (slice, tail) = rest.split_at_mut(rows.len());
            slices.push(slice);
            rest = tail;
        }
        slices.sort_unstable_by_key(|slice| std::cmp::Reverse(slice.len()));
        for slice in slices {
            if let Some(share) = shares.iter_mut().min_by_key(|(load, _)| *load) {
                share.0 += slice.len();
                share.1.push(slice);
            }
        }
        let sort = |share: Vec<&mut [Wanted]>| share.into_iter().for_each(|s| s.sort_unstable());
        std::thread::scope(|scope| {
            let mut shares = shares.into_iter().map(|(_, share)| share);
            let own = shares.next();
            for share in shares {
                scope.spawn(move || sort(share));
            }
            if let Some(own) = own {
                sort(own);
            }
        });
    }
    (flat, units)
}

/// Pass 1: every unit read once, its rows written to their buckets.
fn spill(plan: &SpillPlan, stop: &AtomicBool) -> std::result::Result<Spilled, Failure> {
    let dir = plan.options.dir();
    let budget = budget(&plan.options, &dir);
    if budget == 0 {
        return Err(Failure::Spill(format!(
            "spilling is off (spill_bytes=0), or {} cannot be made or measured",
            dir.display()
        )));
    }
    let places: Vec<u64> = plan.rows.iter().flat_map(|r| r.clone()).collect();
    if places.len() as u64 > u32::MAX as u64 {
        return Err(Failure::Spill("more rows than a spill numbers".into()));
    }
    let streams = plan.access.streams_units();
    let (flat, units) = rows_by_unit(plan, &places, streams);
    let units: Vec<(u64, &[Wanted])> = units
        .into_iter()
        .map(|(unit, rows)| (unit, &flat[rows]))
        .collect();
    let Some((first_unit, first_rows)) = units.first() else {
        return Ok(Spilled {
            layout: Layout::new(&plan.rows, 1, 1),
            files: Vec::new(),
        });
    };
    // The first unit is read on this thread. Its first piece teaches the row size the
    // gathers and buckets are cut by, and what a unit's read holds at once: a gathered
    // unit, three times its rows (fetched, decoded, taken out); a streamed one, what it
    // fetched so far (the pages being decoded: a row group of 1,000 rows of 256 KiB is
    // one page of 256 MiB) and two pieces. That bounds the threads reading units at once
    // within the budget, and the other threads start then: a Parquet file of small rows
    // is often one row group, a tenth of the data, which this thread read alone before
    // any other started (0.5 s of a 2.5 s first pass over 784-byte rows).
    let read_before = plan.stats.io.bytes_read.load(Relaxed);
    let next = AtomicUsize::new(1);
    let (sender, receiver) = sync_channel::<Result<Vec<Piece>>>(plan.threads.max(1));
    let mut writer: Option<Writer> = None;
    let outcome = std::thread::scope(|scope| {
        let start_reader = || {
            let sender = sender.clone();
            let (next, units, places) = (&next, &units, &places);
            scope.spawn(move || {
                loop {
                    let u = next.fetch_add(1, Relaxed);
                    if stop.load(Relaxed) {
                        break;
                    }
                    let Some((unit, wanted)) = units.get(u) else {
                        break;
                    };
                    let mut gone = false;
                    read_unit(plan, places, *unit, wanted, &mut |piece| {
                        gone = gone || sender.send(piece).is_err();
                    });
                    if gone {
                        break;
                    }
                }
            });
        };
        // Threads reading units at once, this one included while it reads the first
        // (0 until its first piece).
        let mut threads = 0usize;
        let mut started = 0usize;
        let mut outcome = Ok(());
        read_unit(plan, &places, *first_unit, first_rows, &mut |piece| {
            if outcome.is_err() {
                return;
            }
            outcome = piece.map_err(Failure::Rows).and_then(|pieces| {
                if threads == 0 {
                    let bytes: u64 = pieces.iter().map(|(_, rows)| batch_bytes(rows)).sum();
                    let unit_bytes = if streams {
                        plan.stats.io.bytes_read.load(Relaxed) - read_before + 2 * bytes
                    } else {
                        3 * bytes
                    };
                    threads = (plan.units_bytes / unit_bytes.max(1))
                        .clamp(1, plan.threads.max(1) as u64)
                        as usize;
                    while started + 1 < threads {
                        start_reader();
                        started += 1;
                    }
                }
                if let (None, Some((_, rows))) = (&writer, pieces.first()) {
                    writer = Some(Writer::new(plan, &dir, budget, places.len(), rows));
                }
                write_pieces(&mut writer, Ok(pieces))
            });
            // What the other threads read meanwhile, written as it comes.
            while outcome.is_ok() {
                let Ok(piece) = receiver.try_recv() else {
                    break;
                };
                outcome = write_pieces(&mut writer, piece);
            }
        });
        // The first unit read: this thread only writes from now on (no readers if it gave
        // no piece: an error below).
        while outcome.is_ok() && started < threads {
            start_reader();
            started += 1;
        }
        drop(sender);
        if outcome.is_ok() {
            for piece in receiver.iter() {
                outcome = write_pieces(&mut writer, piece);
                if outcome.is_ok() && stop.load(Relaxed) {
                    outcome = Err(Failure::Stopped);
                }
                if outcome.is_err() {
                    break;
                }
            }
        }
        if outcome.is_err() {
            // The readers stop at their next unit; one waiting to hand over a piece is
            // let go (its send fails).
            next.store(units.len(), Relaxed);
        }
        drop(receiver);
        outcome
    });
    outcome?;
    let Some(Writer {
        layout, buckets, ..
    }) = writer
    else {
        return Err(Failure::Rows(Error::Internal(
            "a unit gave none of the rows asked of it".into(),
        )));
    };
    let files = buckets
        .into_iter()
        .map(|bucket| {
            let file = match bucket.writer {
                Some(mut w) => {
                    w.finish()
                        .map_err(|e| spill_error("finishing a bucket", &dir, e))?;
                    let mut file = w
                        .into_inner()
                        .and_then(|b| b.into_inner().map_err(|e| e.into_error().into()))
                        .map_err(|e| spill_error("finishing a bucket", &dir, e))?;
                    file.rewind()
                        .map_err(|e| spill_error("rewinding a bucket", &dir, e))?;
                    Some(file)
                }
                None => None,
            };
            Ok((file, bucket.places))
        })
        .collect::<std::result::Result<_, Failure>>()?;
    Ok(Spilled { layout, files })
}

/// Pieces written to their buckets (the writer is made by the first unit's first piece,
/// before any reader starts).
fn write_pieces(
    writer: &mut Option<Writer>,
    piece: Result<Vec<Piece>>,
) -> std::result::Result<(), Failure> {
    let pieces = piece.map_err(Failure::Rows)?;
    let writer = writer.as_mut().ok_or_else(|| {
        Failure::Rows(Error::Internal(
            "a piece came before the first unit's".into(),
        ))
    })?;
    pieces
        .iter()
        .try_for_each(|(at, rows)| writer.write(at, rows))
}

/// Writes rows to their buckets, within the spill budget.
struct Writer<'a> {
    dir: &'a Path,
    budget: u64,
    written: u64,
    layout: Layout,
    buckets: Vec<Bucket>,
    stats: &'a Stats,
}

impl<'a> Writer<'a> {
    /// The buckets of `places` rows, cut by the row size of `rows` (the first rows read).
    fn new(
        plan: &'a SpillPlan,
        dir: &'a Path,
        budget: u64,
        places: usize,
        rows: &RecordBatch,
    ) -> Self {
        let row_bytes = batch_bytes(rows)
            .checked_div(rows.num_rows() as u64)
            .unwrap_or(1)
            .max(1);
        let mut gather_rows = (plan.gather_bytes / row_bytes).clamp(1, GATHER_ROWS);
        if plan.batch_rows > 0 && gather_rows >= plan.batch_rows {
            // Not 31 rows of 256 KiB where batches take 32: each batch would be copied
            // together from two gathers.
            gather_rows = gather_rows / plan.batch_rows * plan.batch_rows;
        } else if plan.batch_rows > 0
            && plan.batch_rows.saturating_mul(row_bytes) <= NEAR_GATHERS * plan.gather_bytes
        {
            // A batch just over a gather's bytes (32 rows of 256 KiB and their ids, 4 bytes
            // past 8 MiB) is one gather, handed on as it is, not joined from two halves:
            // that copied every row a second time, on the pipeline thread.
            gather_rows = plan.batch_rows;
        } else if plan.batch_rows > 0 {
            // Batches larger than a gather are joined from whole gathers (into pooled
            // buffers), each gather its share: not gathers of a whole batch each, which
            // at 64 MiB (256 rows of 256 KiB) mimalloc maps afresh every time, 16,000
            // page faults a gather.
            gather_rows = plan.batch_rows / plan.batch_rows.div_ceil(gather_rows);
        }
        // At most MAX_BUCKETS files open at once (larger buckets past that).
        let bucket_rows = (plan.bucket_bytes / row_bytes)
            .max(gather_rows)
            .max((places as u64).div_ceil(MAX_BUCKETS));
        let layout = Layout::new(&plan.rows, gather_rows, bucket_rows);
        let buckets = (0..layout.buckets.len())
            .map(|_| Bucket {
                writer: None,
                places: Vec::new(),
            })
            .collect();
        Self {
            dir,
            budget,
            written: 0,
            layout,
            buckets,
            stats: &plan.stats,
        }
    }

    /// `rows`, at places `at` (ascending), each to its bucket: places in order fall into
    /// buckets in order, so each bucket's rows are one slice.
    fn write(&mut self, at: &[u32], rows: &RecordBatch) -> std::result::Result<(), Failure> {
        let bytes = batch_bytes(rows);
        self.written += bytes;
        if self.written > self.budget {
            return Err(Failure::Spill(format!(
                "the rows need more than the {} bytes spill_bytes allows in {}",
                self.budget,
                self.dir.display()
            )));
        }
        let mut start = 0;
        while start < at.len() {
            let bucket = self.layout.bucket(at[start] as u64);
            let end = self
                .layout
                .buckets
                .get(bucket + 1)
                .map_or(at.len(), |(next, _)| {
                    start + at[start..].partition_point(|&p| (p as u64) < *next)
                });
            let target = &mut self.buckets[bucket];
            if target.writer.is_none() {
                let file = anonymous_file(self.dir)
                    .map_err(|e| spill_error("making a bucket file", self.dir, e))?;
                let writer = StreamWriter::try_new(
                    BufWriter::with_capacity(WRITE_BUFFER, file),
                    &rows.schema(),
                )
                .map_err(|e| spill_error("writing a bucket", self.dir, e))?;
                target.writer = Some(writer);
            }
            if let Some(writer) = target.writer.as_mut() {
                writer
                    .write(&rows.slice(start, end - start))
                    .map_err(|e| spill_error("writing a bucket", self.dir, e))?;
            }
            target.places.extend_from_slice(&at[start..end]);
            start = end;
        }
        self.stats.spilled_bytes.fetch_add(bytes, Relaxed);
        Ok(())
    }
}

/// Pass 2: each bucket read back (the next one on a thread of its own while this one is
/// served), put in order and cut into gathers.
///
/// A served bucket is handed back to that thread to drop: unmapping it frees the last
/// hold on its nameless file, and the kernel then drops the file's pages from the page
/// cache, a fifth of the serving thread's time when it did so itself (`perf`: 256 KiB
/// rows, in `block_invalidate_folio` and the slab frees under `munmap`).
fn serve(spilled: Spilled, views: bool, sender: &SyncSender<Delivery>, stop: &AtomicBool) {
    let Spilled { layout, files } = spilled;
    let (ready, buckets) = sync_channel::<Result<(Vec<RecordBatch>, Vec<u32>)>>(0);
    let (served, to_drop) = std::sync::mpsc::channel::<Vec<RecordBatch>>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            for (file, places) in files {
                if stop.load(Relaxed) {
                    break;
                }
                let batches = match file {
                    Some(file) => read_bucket(file),
                    None => Ok(Vec::new()),
                };
                if ready.send(batches.map(|b| (b, places))).is_err() {
                    break;
                }
                // The bucket served before the one just handed over (handed back before
                // that one was taken).
                to_drop.try_iter().for_each(drop);
            }
            drop(ready);
            to_drop.iter().for_each(drop);
        });
        for (b, bucket) in buckets.iter().enumerate() {
            let (first_place, gathers) = layout.buckets[b].clone();
            let delivered = bucket.and_then(|(batches, places)| {
                // Where each of the bucket's places was written: (batch, row).
                let mut at = vec![(0usize, 0usize); places.len()];
                let mut k = 0;
                for (i, batch) in batches.iter().enumerate() {
                    for row in 0..batch.num_rows() {
                        let place = places.get(k).copied().ok_or_else(|| {
                            Error::Internal("a bucket holds more rows than were spilled".into())
                        })?;
                        k += 1;
                        at[(place as u64 - first_place) as usize] = (i, row);
                    }
                }
                if k != places.len() {
                    return Err(Error::Internal(format!(
                        "a bucket gave back {k} of its {} rows",
                        places.len()
                    )));
                }
                let sources: Vec<&RecordBatch> = batches.iter().collect();
                for &(first, n, position) in &layout.gathers[gathers] {
                    let from = (first - first_place) as usize;
                    let picks = &at[from..from + n as usize];
                    // As views, the gathers hold the bucket's mapping (not memory of the
                    // loader's) until their batches are dropped: the serving thread's
                    // copy of every row was a third of the second pass.
                    let rows = match views {
                        true => super::stream::interleave_viewing(&sources, picks),
                        false => super::stream::interleave_rows(&sources, picks),
                    }
                    .map_err(|e| Error::Internal(format!("gather failed: {e}")));
                    if stop.load(Relaxed) || sender.send(Delivery::Gather(position, rows)).is_err()
                    {
                        return Ok(false);
                    }
                }
                drop(sources);
                let _ = served.send(batches);
                Ok(true)
            });
            match delivered {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    let position = layout.gathers[layout.buckets[b].1.start].2;
                    let _ = sender.send(Delivery::Gather(position, Err(e)));
                    break;
                }
            }
        }
        drop(buckets);
        drop(served);
    });
}

/// A bucket's batches, read back from its file without a copy: the file mapped (its
/// pages already in the page cache, mapped at once), the batches' buffers pointing into
/// the mapping, which goes (and with it the file) when the last of them does. Read into
/// memory instead, each bucket's bytes would be copied into fresh pages, and a fresh
/// page costs more than the copy (760 ms of 2.0 s for a 1.5 GB epoch).
fn read_bucket(file: File) -> Result<Vec<RecordBatch>> {
    let failed =
        |e: &dyn std::fmt::Display| Error::Internal(format!("reading back a spilled bucket: {e}"));
    let Some(mut buffer) = crate::mapped::map_file(&file, true).map_err(|e| failed(&e))? else {
        return Ok(Vec::new());
    };
    let mut decoder = arrow_ipc::reader::StreamDecoder::new();
    let mut batches = Vec::new();
    while let Some(batch) = decoder.decode(&mut buffer).map_err(|e| failed(&e))? {
        batches.push(batch);
    }
    decoder.finish().map_err(|e| failed(&e))?;
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_cuts_gathers_within_ranges_and_buckets_by_gathers() {
        let layout = Layout::new(&vec![10..15, 40..43], 2, 4);
        assert_eq!(
            layout.gathers,
            vec![(0, 2, 10), (2, 2, 12), (4, 1, 14), (5, 2, 40), (7, 1, 42)]
        );
        assert_eq!(layout.buckets, vec![(0, 0..2), (4, 2..5)]);
        let buckets: Vec<usize> = (0..8).map(|p| layout.bucket(p)).collect();
        assert_eq!(buckets, vec![0, 0, 0, 0, 1, 1, 1, 1]);
    }

    #[test]
    fn bucket_files_have_no_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = anonymous_file(dir.path()).unwrap();
        std::io::Write::write_all(&mut file, b"rows").unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
