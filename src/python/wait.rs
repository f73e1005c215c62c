//! The consumer's wait for the next batch: with the GIL released, waking to let Ctrl-C
//! through.

use std::time::Duration;

use arrow_array::RecordBatch;
use pyo3::prelude::*;

use crate::pipeline::{BatchReceiver, Received};

/// How often a waiting consumer wakes to let Ctrl-C through.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// Waits for the next batch with the GIL released, raising KeyboardInterrupt promptly.
pub(super) fn next_batch(
    py: Python<'_>,
    receiver: &mut BatchReceiver,
) -> PyResult<Option<RecordBatch>> {
    loop {
        // A batch that is ready is taken with the GIL held: letting go of the GIL and
        // taking it back cost the consumer's thread (the serial path) at every batch.
        let received = match receiver.try_recv()? {
            Some(received) => received,
            None => {
                let _span = receiver
                    .stats()
                    .trace()
                    .map(|t| t.span("wait for a batch", "consumer"));
                py.detach(|| receiver.recv_timeout(SIGNAL_CHECK))?
            }
        };
        match received {
            Received::Batch(batch) => {
                let stats = receiver.stats();
                let mut notices = stats.take_notices();
                if let Some(rows) = stats.take_shuffle_bound_report() {
                    notices.push(format!(
                        "the shuffle buffer holds only {rows} rows: its byte bound (buffer_bytes) is reached first, which weakens the shuffle; raise buffer_bytes if memory allows"
                    ));
                }
                for message in notices {
                    py.import("warnings")?.call_method1(
                        "warn",
                        (message, py.get_type::<pyo3::exceptions::PyUserWarning>()),
                    )?;
                }
                return Ok(Some(batch));
            }
            Received::End => return Ok(None),
            Received::Timeout => py.check_signals()?,
        }
    }
}
