//! When a client's bytes reached the broker: kernel receive timestamps for
//! plain TCP connections.
//!
//! Owns: `split`, which turns an accepted `TcpStream` into an `ArrivalReader`
//! (each read also notes when the kernel received the newest bytes it
//! returned, from `SO_TIMESTAMPNS`) and a `SharedWriter` over the same socket.
//! The broker publish stage starts at that arrival, so it covers the broker's
//! own wake-up and read of a SEND, not only what follows the read: on a
//! virtual machine an idle CPU takes tens of µs to wake, and that time is the
//! broker's, not the client's.
//!
//! Never: changes the bytes read or written, or fails a read for want of a
//! timestamp (then the read's own time stands in, as for TLS connections).
//!
//! The only `unsafe` of the broker is here: `setsockopt` and `recvmsg`
//! through libc (std and tokio expose neither control messages nor this
//! option), each block with its argument.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// A stamp older than this at read time is not believed (the wall clock
/// moved): the read's own time stands in.
const ARRIVAL_AGE_MAX: Duration = Duration::from_secs(1);

/// What the connection reads from: bytes, and when the newest of them arrived.
pub(crate) trait ConnectionRead: AsyncRead + Unpin {
    /// When the kernel received the newest bytes of the last read, if known.
    fn arrival(&self) -> Option<Instant> {
        None
    }
}

impl<T: AsyncRead + AsyncWrite> ConnectionRead for tokio::io::ReadHalf<T> {}

/// Splits `stream` into halves that share it; turns on receive timestamps
/// (without them reads work the same, with `arrival` None).
pub(crate) fn split(stream: TcpStream) -> (ArrivalReader, SharedWriter) {
    let stamped = match enable_receive_timestamps(stream.as_raw_fd()) {
        Ok(()) => true,
        Err(error) => {
            tracing::debug!(%error, "SO_TIMESTAMPNS not available; publish timing starts at the read");
            false
        }
    };
    let stream = Arc::new(stream);
    (
        ArrivalReader {
            stream: stream.clone(),
            stamped,
            arrival: None,
        },
        SharedWriter { stream },
    )
}

/// The read side of a plain TCP connection.
#[derive(Debug)]
pub(crate) struct ArrivalReader {
    stream: Arc<TcpStream>,
    stamped: bool,
    arrival: Option<Instant>,
}

impl ConnectionRead for ArrivalReader {
    fn arrival(&self) -> Option<Instant> {
        self.arrival
    }
}

impl AsyncRead for ArrivalReader {
    #[allow(unsafe_code)]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let fd = this.stream.as_raw_fd();
        loop {
            ready!(this.stream.poll_read_ready(cx))?;
            // SAFETY: `recv_stamped` only writes into the slice (the kernel
            // fills its first `n` bytes), never de-initializes any of it.
            let unfilled = unsafe { buf.unfilled_mut() };
            let received = this
                .stream
                .try_io(Interest::READABLE, || recv_stamped(fd, unfilled));
            match received {
                Ok((n, stamp)) => {
                    // SAFETY: recvmsg wrote `n` bytes at the start of `unfilled`.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    this.arrival = if this.stamped {
                        stamp.map(instant_of)
                    } else {
                        None
                    };
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// The write side of a plain TCP connection.
#[derive(Debug)]
pub(crate) struct SharedWriter {
    stream: Arc<TcpStream>,
}

impl SharedWriter {
    /// `write` (a `try_write*`) once the socket is writable, again while it
    /// would block.
    fn poll_try_write(
        &self,
        cx: &mut Context<'_>,
        mut write: impl FnMut(&TcpStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match write(&self.stream) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                written => return Poll::Ready(written),
            }
        }
    }
}

impl AsyncWrite for SharedWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_try_write(cx, |stream| stream.try_write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_try_write(cx, |stream| stream.try_write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(socket2::SockRef::from(&*self.stream).shutdown(std::net::Shutdown::Write))
    }
}

/// The monotonic instant of a wall-clock kernel stamp.
fn instant_of(stamp: SystemTime) -> Instant {
    let now = Instant::now();
    match SystemTime::now().duration_since(stamp) {
        Ok(age) if age <= ARRIVAL_AGE_MAX => now.checked_sub(age).unwrap_or(now),
        _ => now,
    }
}

#[allow(unsafe_code)]
fn enable_receive_timestamps(fd: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `fd` is an open socket owned by the caller; the option value
    // points at a live c_int of the length passed.
    let result = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One non-blocking `recvmsg` into `buf`: the bytes read and the kernel's
/// receive stamp of the newest of them, if it sent one.
#[allow(unsafe_code)]
fn recv_stamped(fd: RawFd, buf: &mut [MaybeUninit<u8>]) -> io::Result<(usize, Option<SystemTime>)> {
    // Room for one SCM_TIMESTAMPNS message (a cmsghdr and a timespec: 32
    // bytes on 64-bit Linux), u64s for cmsghdr alignment.
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` points at one iovec over `buf` (writable, its length) and
    // at `control` (writable, its length); all outlive the call.
    let read = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    let Ok(read) = usize::try_from(read) else {
        return Err(io::Error::last_os_error());
    };
    let mut stamp = None;
    // SAFETY: the CMSG_* walk stays within `msg_controllen` bytes of
    // `control`, which the kernel set to what it wrote; the timespec is read
    // unaligned from inside the message the header describes.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
            {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                if let (Ok(secs), Ok(nanos)) = (u64::try_from(ts.tv_sec), u32::try_from(ts.tv_nsec))
                    && nanos < 1_000_000_000
                {
                    stamp = Some(UNIX_EPOCH + Duration::new(secs, nanos));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((read, stamp))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn reads_what_was_sent_with_an_arrival_before_the_read_returns() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (mut reader, mut writer) = split(server);
        let mut got = vec![0u8; 64];
        // The kernel turns stamping on for the first stamped socket a moment
        // later (a deferred static key): wait until bytes come stamped.
        let deadline = Instant::now() + Duration::from_secs(5);
        while reader.arrival().is_none() {
            assert!(
                Instant::now() < deadline,
                "loopback TCP gives no receive stamps"
            );
            client.write_all(b"x").await.unwrap();
            assert_eq!(reader.read(&mut got).await.unwrap(), 1);
        }

        let sent_before = Instant::now();
        client.write_all(b"hello broker").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let n = reader.read(&mut got).await.unwrap();
        let read_done = Instant::now();
        assert_eq!(&got[..n], b"hello broker");
        let arrival = reader.arrival().expect("loopback TCP gives receive stamps");
        // The bytes waited ~20 ms in the socket: the stamp says when they
        // came, not when they were read.
        assert!(arrival >= sent_before.checked_sub(Duration::from_millis(5)).unwrap());
        assert!(read_done.duration_since(arrival) >= Duration::from_millis(15));

        writer.write_all(b"answer").await.unwrap();
        writer.shutdown().await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"answer");
    }
}
