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
/// Bytes per `writev` at most (a large entry goes out in several). A catch-up consumer's batch of 1 MiB entries in one
/// syscall kept a core in the kernel (copy and loopback TCP work) for the
/// whole megabyte; on a kernel without preemption the publish path's
/// threads woke up only after it (issue 27: broker_issue p99 0.1 -> 0.9 ms
/// during a drain). Smaller writes give the scheduler a point between them.
const WRITE_BYTES_MAX: usize = 256 << 10;

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
        let mut room = WRITE_BYTES_MAX;
        let slices: Vec<IoSlice<'_>> = buffers[index..]
            .iter()
            .take(IOVECS_PER_WRITE_MAX)
            .map_while(|b| {
                if room == 0 {
                    return None;
                }
                let part = &b[..b.len().min(room)];
                room -= part.len();
                Some(IoSlice::new(part))
            })
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

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    /// Takes everything it is given and remembers each write's size.
    #[derive(Default)]
    struct Recorder {
        written: Vec<u8>,
        write_sizes: Vec<usize>,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let this = self.get_mut();
            this.written.extend_from_slice(buf);
            this.write_sizes.push(buf.len());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let this = self.get_mut();
            let mut total = 0;
            for b in bufs {
                this.written.extend_from_slice(b);
                total += b.len();
            }
            this.write_sizes.push(total);
            Poll::Ready(Ok(total))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn large_entries_go_out_in_bounded_writes_in_order() {
        // A frame header, a 1 MiB entry, an empty buffer, a small frame and
        // another entry larger than one write.
        let big: Vec<u8> = (0..(1usize << 20)).map(|i| (i % 251) as u8).collect();
        let bigger: Vec<u8> = (0..(300usize << 10)).map(|i| (i % 13) as u8).collect();
        let mut buffers = vec![
            Bytes::from_static(b"header"),
            Bytes::from(big.clone()),
            Bytes::new(),
            Bytes::from_static(b"receipt"),
            Bytes::from(bigger.clone()),
        ];
        let mut expected = b"header".to_vec();
        expected.extend_from_slice(&big);
        expected.extend_from_slice(b"receipt");
        expected.extend_from_slice(&bigger);

        let mut recorder = Recorder::default();
        write_all(&mut recorder, &mut buffers).await.unwrap();

        assert_eq!(recorder.written, expected, "every byte once, in order");
        assert!(
            recorder.write_sizes.iter().all(|&n| n <= WRITE_BYTES_MAX),
            "no write above {WRITE_BYTES_MAX} bytes: {:?}",
            recorder.write_sizes
        );
        assert_eq!(
            recorder.write_sizes.len(),
            expected.len().div_ceil(WRITE_BYTES_MAX),
            "writes are full up to the bound"
        );
    }
}
