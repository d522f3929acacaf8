//! `FrameQueue`: encoded frames waiting for a socket, shared by the client's and
//! the server's writer tasks.
//!
//! Owns: the bytes queued since the writer's last write, and writing them out in
//! as few vectored writes as the socket takes. Guarantees: frames leave in the
//! order they were pushed; payloads of at least `ZERO_COPY_BYTES_MIN` (ADD
//! entries, READ answers) are queued as the caller's `Bytes`, never copied;
//! smaller ones are copied into the header buffer (one more iovec costs more
//! than the copy). Never: bounds itself (the callers' in-flight bounds do) or
//! holds a lock (the caller swaps it out of its lock, then writes).

use std::collections::VecDeque;
use std::io::{self, IoSlice};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::frame::RawFrame;
use crate::message::{
    Request, Response, encode_bad_version, encode_request_head, encode_response_head,
};

/// Payloads at least this long are queued by reference; shorter ones copied.
const ZERO_COPY_BYTES_MIN: usize = 4096;
/// iovecs per `writev`: far below Linux's IOV_MAX (1024); every big payload
/// takes two, so 64 carry 32 of them (2 MiB of 64 KiB entries) per call.
const IOVECS_PER_WRITE_MAX: usize = 64;

/// Frames in order: `chunks` first, then `tail`.
#[derive(Debug, Default)]
pub struct FrameQueue {
    chunks: VecDeque<Bytes>,
    tail: BytesMut,
}

impl FrameQueue {
    /// Queues a request frame (an ADD's entry by reference when large).
    pub fn push_request(&mut self, request_id: u64, request: &Request) {
        if let Some(entry) = encode_request_head(request_id, request, &mut self.tail) {
            self.push_payload(entry);
        }
    }

    /// Queues a response frame (a READ's entry by reference when large).
    pub fn push_response(&mut self, request_id: u64, response: &Response) {
        if let Some(entry) = encode_response_head(request_id, response, &mut self.tail) {
            self.push_payload(entry);
        }
    }

    /// Queues the BAD_VERSION answer to `raw`; false when its op is unknown
    /// (see `encode_bad_version`).
    pub fn push_bad_version(&mut self, raw: &RawFrame) -> bool {
        encode_bad_version(raw, &mut self.tail)
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty() && self.tail.is_empty()
    }

    /// Drops everything queued.
    pub fn clear(&mut self) {
        self.chunks.clear();
        self.tail.clear();
    }

    fn push_payload(&mut self, payload: &Bytes) {
        if payload.len() < ZERO_COPY_BYTES_MIN {
            self.tail.put_slice(payload);
            return;
        }
        if !self.tail.is_empty() {
            self.chunks.push_back(self.tail.split().freeze());
        }
        self.chunks.push_back(payload.clone());
    }

    /// Writes every queued byte to `socket` (vectored), leaving the queue empty.
    pub async fn write_to<W: AsyncWrite + Unpin>(&mut self, socket: &mut W) -> io::Result<()> {
        self.seal_tail();
        while !self.chunks.is_empty() {
            let written = socket.write_vectored(&self.front_slices()).await?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.consume(written);
        }
        Ok(())
    }

    /// Bytes queued.
    pub fn len_bytes(&self) -> usize {
        self.chunks.iter().map(Bytes::len).sum::<usize>() + self.tail.len()
    }

    /// Writes what `try_write` takes now (a non-blocking vectored write):
    /// `Ok(true)` once the queue is empty, `Ok(false)` if the socket would
    /// block first (the rest stays queued, in order).
    pub fn write_now(
        &mut self,
        mut try_write: impl FnMut(&[IoSlice<'_>]) -> io::Result<usize>,
    ) -> io::Result<bool> {
        self.seal_tail();
        while !self.chunks.is_empty() {
            let written = match try_write(&self.front_slices()) {
                Ok(written) => written,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            };
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.consume(written);
        }
        Ok(true)
    }

    /// Moves the copied small frames into `chunks`, behind the frames before them.
    fn seal_tail(&mut self) {
        if !self.tail.is_empty() {
            self.chunks.push_back(self.tail.split().freeze());
        }
    }

    /// The iovecs of one vectored write, from the front.
    fn front_slices(&self) -> Vec<IoSlice<'_>> {
        self.chunks
            .iter()
            .take(IOVECS_PER_WRITE_MAX)
            .map(|chunk| IoSlice::new(chunk))
            .collect()
    }

    /// Drops `written` bytes off the front.
    fn consume(&mut self, mut written: usize) {
        while written > 0 {
            let Some(front) = self.chunks.front_mut() else {
                debug_assert!(false, "wrote more than was queued");
                return;
            };
            if written < front.len() {
                front.advance(written);
                return;
            }
            written -= front.len();
            self.chunks.pop_front();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::frame::decode_frame;
    use crate::message::AddMode;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A socket that takes at most `step` bytes per write.
    struct Trickle {
        written: Vec<u8>,
        step: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.step);
            self.written.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut n = 0;
            for buf in bufs {
                let take = buf.len().min(self.step - n);
                self.written.extend_from_slice(&buf[..take]);
                n += take;
                if n == self.step {
                    break;
                }
            }
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn frames_leave_in_order_through_partial_vectored_writes() {
        let mut queue = FrameQueue::default();
        let mut expected = BytesMut::new();
        let mut requests = Vec::new();
        for id in 0..200u64 {
            // Mix of small (copied) and big (by reference) entries.
            let len = if id % 3 == 0 {
                10_000 + id as usize
            } else {
                100
            };
            let request = Request::Add {
                mode: AddMode::Normal,
                entry: Bytes::from(vec![id as u8; len]),
            };
            queue.push_request(id, &request);
            crate::message::encode_request(id, &request, &mut expected);
            requests.push(request);
            if id % 7 == 0 {
                let request = Request::ReadLac { ledger_id: id };
                queue.push_request(id + 1000, &request);
                crate::message::encode_request(id + 1000, &request, &mut expected);
            }
        }
        for step in [1, 7, 4096, 1 << 20] {
            let mut copy = FrameQueue {
                chunks: queue.chunks.clone(),
                tail: queue.tail.clone(),
            };
            let mut socket = Trickle {
                written: Vec::new(),
                step,
            };
            copy.write_to(&mut socket).await.unwrap();
            assert!(copy.is_empty());
            assert_eq!(socket.written, expected.to_vec(), "step {step}");
        }
        let mut wire = BytesMut::from(&expected[..]);
        let mut decoded = 0;
        while let Some(frame) = decode_frame(&mut wire).unwrap() {
            frame.into_request().unwrap();
            decoded += 1;
        }
        assert_eq!(decoded, 200 + 29);
    }
}
