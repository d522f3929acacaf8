//! The socket writer of one connection: the only code that writes to the
//! socket. It drains the outbound queue in one vectored write per wake-up
//! (at most `frames_per_wakeup` frames: one busy connection does not starve
//! the others), then records the broker publish latency of every receipt
//! that went out (the publish stage ends when its receipt is written).
//! Owns: the write half of the socket. Never: copies a stored entry (a
//! MESSAGE is its header plus the entry's `Bytes`), or reads.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::codec::Outbound;
use crate::service::Service;

/// iovecs per `writev` (Linux IOV_MAX is 1024).
const IOVECS_PER_WRITE_MAX: usize = 1024;

pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut frames: mpsc::Receiver<Outbound>,
    frames_per_wakeup: usize,
    service: Arc<Service>,
) {
    let budget = frames_per_wakeup.max(1);
    let mut batch: Vec<Bytes> = Vec::with_capacity(budget * 2);
    let mut timings: Vec<crate::metrics::PublishTiming> = Vec::with_capacity(budget);
    let mut charges: Vec<crate::inflight::Charge> = Vec::with_capacity(budget);
    while let Some(first) = frames.recv().await {
        push_frame(&mut batch, &mut timings, &mut charges, first);
        let mut count = 1;
        while count < budget {
            match frames.try_recv() {
                Ok(frame) => {
                    push_frame(&mut batch, &mut timings, &mut charges, frame);
                    count += 1;
                }
                Err(_) => break,
            }
        }
        if let Err(e) = write_all(&mut writer, &mut batch).await {
            tracing::debug!(error = %e, "write failed");
            return;
        }
        let written = Instant::now();
        for timing in timings.drain(..) {
            timing.record(written, &service.metrics);
        }
        // Written: the in-flight bytes of non-persistent messages come back.
        charges.clear();
        batch.clear();
    }
    let _ = writer.shutdown().await;
}

fn push_frame(
    batch: &mut Vec<Bytes>,
    timings: &mut Vec<crate::metrics::PublishTiming>,
    charges: &mut Vec<crate::inflight::Charge>,
    frame: Outbound,
) {
    match frame {
        Outbound::Simple(bytes) => batch.push(bytes),
        Outbound::Message { header, entry } => {
            batch.push(header);
            batch.push(entry);
        }
        Outbound::Charged {
            header,
            entry,
            charge,
        } => {
            batch.push(header);
            batch.push(entry);
            charges.push(charge);
        }
        Outbound::Receipt { frame, timing } => {
            batch.push(frame);
            timings.push(timing);
        }
    }
}

/// Writes every buffer with vectored writes, handling partial writes.
async fn write_all<W: AsyncWrite + Unpin>(
    writer: &mut W,
    buffers: &mut [Bytes],
) -> std::io::Result<()> {
    let mut index = 0;
    while index < buffers.len() {
        if buffers[index].is_empty() {
            index += 1;
            continue;
        }
        let slices: Vec<IoSlice<'_>> = buffers[index..]
            .iter()
            .take(IOVECS_PER_WRITE_MAX)
            .map(|b| IoSlice::new(b))
            .collect();
        let mut written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 && index < buffers.len() {
            let len = buffers[index].len();
            if written >= len {
                written -= len;
                index += 1;
            } else {
                buffers[index].advance(written);
                written = 0;
            }
        }
    }
    Ok(())
}
