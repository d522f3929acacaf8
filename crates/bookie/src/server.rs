//! `Server`: the TCP server of the bookie protocol, over a `Bookie`.
//!
//! Owns: the listening socket and, per connection, a reader task (decodes
//! frames, hands each request to the `Bookie`) and a writer task (writes every
//! response queued since its last write in one vectored write, READ entries
//! by reference; TCP_NODELAY). A small answer completed while the writer task
//! has nothing in hand is written at once by the completing thread (a
//! non-blocking write under the outbox lock; the task takes over what the
//! socket does not): at depth 1 that saves waking a runtime thread per ADD.
//! With TLS (`with_tls`), every connection first completes a handshake
//! (bounded by `TLS_HANDSHAKE_TIMEOUT`, in its own task) and answers always
//! go through the writer task (a TLS stream has one writer).
//! Guarantees: ADDs are pipelined (the reader never waits for entry N's answer
//! before reading N+1); a connection has at most `CONNECTION_IN_FLIGHT_MAX`
//! requests between "read off the socket" and "answer written", and past that
//! stops reading its socket (TCP back-pressure reaches the client); a malformed
//! frame closes that connection only, with a log line; reads run on the
//! blocking pool (`spawn_blocking`), at most `READS_IN_FLIGHT_MAX` at once.
//! Never: blocks a tokio worker on disk I/O; holds a lock across an `.await`;
//! interprets entries (that is the `Bookie`'s job).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use vela_bookie_protocol::{
    FrameQueue, PROTOCOL_VERSION, ProtocolError, RawFrame, ReadMode, Request, RequestFrame,
    Response, Status, decode_frame,
};
use vela_tls::TlsCertificates;
use vela_tls::server::TlsStream;

use crate::bookie::Bookie;

/// Requests one connection may have in flight (read off the socket, not yet
/// answered on it). 1024 pipelined 1 KiB adds cover a 256-deep producer with
/// room to spare; reaching it makes the reader stop reading the socket until
/// answers go out, so a client that floods or never reads its answers holds at
/// most this many requests (and their answers) in memory.
pub const CONNECTION_IN_FLIGHT_MAX: usize = 1024;
/// Reads one connection may have in flight: a read answer can be 5 MiB, so
/// this caps a connection's answer buffer for reads at 32 x 5 MiB.
pub const CONNECTION_READS_IN_FLIGHT_MAX: usize = 32;
/// Blocking reads (disk I/O on the blocking pool) in flight across the server:
/// more than the disk can overlap usefully would only grow the blocking pool.
pub const READS_IN_FLIGHT_MAX: usize = 64;
/// Connections served at once; past it new connections wait in the listen
/// backlog until one closes. A bookie's clients are brokers (one connection
/// each, per ledger client) and tools, so 1024 is generous; it also caps read
/// buffers at 1024 x `READ_BUFFER_BYTES` = 256 MiB.
pub const CONNECTIONS_MAX: usize = 1024;
/// Answers up to this size (with what is queued before them) are written by
/// the completing thread when the writer task is idle; bigger ones (READ
/// entries) go through the task, so nobody copies megabytes under the lock.
const DIRECT_WRITE_BYTES_MAX: usize = 16 * 1024;
/// Time a client has to finish its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a connection the client half-closed waits for its pending
/// answers (adds wait for an fdatasync: far below this unless the disk hangs).
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Size of each read buffer chunk of a connection. Entries are slices of these
/// chunks (no copy) and keep a chunk alive until the last of them leaves the
/// write cache; the bytes of a frame cut by the chunk's end are copied into the
/// next chunk, and wasted in the old one. So memory beyond the entries
/// themselves is at most one frame per chunk: with 256 KiB chunks, 25% for 64 KiB
/// entries, nothing notable for small ones.
const READ_BUFFER_BYTES: usize = 256 * 1024;
/// A new chunk is started when less than this is free in the current one (a
/// read of a few bytes per syscall would waste CPU).
const READ_SPARE_BYTES_MIN: usize = 8 * 1024;

/// The bookie protocol server. `bind`, then `run` until a shutdown signal.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    local_addr: SocketAddr,
    bookie: Arc<Bookie>,
    tls: Option<Arc<TlsCertificates>>,
}

impl Server {
    /// Binds `addr` (port 0 picks a free port: see `local_addr`).
    pub async fn bind(addr: SocketAddr, bookie: Arc<Bookie>) -> io::Result<Server> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        Ok(Server {
            listener,
            local_addr,
            bookie,
            tls: None,
        })
    }

    /// Serves TLS only, with `certs` (reloaded by their owner's
    /// `vela_tls::reload_loop`): a plain client fails its first request.
    pub fn with_tls(mut self, certs: Arc<TlsCertificates>) -> Server {
        self.tls = Some(certs);
        self
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Accepts and serves connections until `shutdown` resolves, then closes
    /// every connection (answers not yet written are dropped: their clients see
    /// the connection close, so the outcome is "unknown", never a false OK).
    /// The caller shuts the `Bookie` down afterwards.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let limits = Arc::new(ServerLimits {
            connections: Arc::new(Semaphore::new(CONNECTIONS_MAX)),
            reads: Arc::new(Semaphore::new(READS_IN_FLIGHT_MAX)),
        });
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                () = &mut shutdown => break,
                permit = limits.connections.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break,
                },
            };
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                accepted = self.listener.accept() => accepted,
            };
            // Reap finished connection tasks so the set stays bounded.
            while connections.try_join_next().is_some() {}
            match accepted {
                Ok((socket, peer)) => {
                    let bookie = self.bookie.clone();
                    let limits = limits.clone();
                    let tls = self.tls.clone();
                    connections.spawn(async move {
                        serve_connection(socket, peer, bookie, limits, tls).await;
                        drop(permit);
                    });
                }
                Err(error) => {
                    // EMFILE and friends: log and keep accepting (the failed
                    // accept consumed nothing).
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
        connections.shutdown().await;
        Ok(())
    }
}

#[derive(Debug)]
struct ServerLimits {
    connections: Arc<Semaphore>,
    reads: Arc<Semaphore>,
}

/// What a connection's reader and the `Bookie`'s completions share with its
/// writer.
#[derive(Debug)]
struct Connection {
    peer: SocketAddr,
    out: Mutex<Outbox>,
    wake: Notify,
    /// A plain connection's socket: written by the writer task, or by
    /// `respond` under the outbox lock while the task holds nothing
    /// (`Outbox::writer_busy`), so frames never interleave. None with TLS.
    plain: Option<OwnedWriteHalf>,
}

#[derive(Debug, Default)]
struct Outbox {
    closed: bool,
    /// Encoded answers not yet written.
    queue: FrameQueue,
    /// In-flight permits of the answers in `bytes`: released once written, so
    /// unwritten answers count against `CONNECTION_IN_FLIGHT_MAX`.
    permits: Vec<InFlight>,
    /// The writer task took answers off `queue` and has not finished writing
    /// them: nobody else may write to the socket.
    writer_busy: bool,
}

/// Holds a connection's in-flight slot (and, for reads, a read slot).
#[derive(Debug)]
struct InFlight {
    _request: OwnedSemaphorePermit,
    _read: Option<OwnedSemaphorePermit>,
}

impl Connection {
    fn lock(&self) -> MutexGuard<'_, Outbox> {
        // Every mutation under this lock is a single append or swap: a panic
        // elsewhere cannot leave it half done.
        self.out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends the answer to `request_id`: at once if the writer task is idle
    /// and the answer small, else (or for what the socket did not take) by
    /// the writer task at its next wake.
    fn respond(&self, request_id: u64, response: &Response, in_flight: InFlight) {
        let mut out = self.lock();
        if out.closed {
            return;
        }
        out.queue.push_response(request_id, response);
        out.permits.push(in_flight);
        if let Some(socket) = &self.plain
            && !out.writer_busy
            && out.queue.len_bytes() <= DIRECT_WRITE_BYTES_MAX
        {
            match out
                .queue
                .write_now(|slices| socket.try_write_vectored(slices))
            {
                Ok(true) => {
                    out.permits.clear();
                    return;
                }
                // The socket is full: the writer task waits for it.
                Ok(false) => {}
                Err(error) => {
                    tracing::debug!(peer = %self.peer, %error, "bookie connection write failed");
                    drop(out);
                    self.close();
                    return;
                }
            }
        }
        drop(out);
        self.wake.notify_one();
    }

    fn close(&self) {
        {
            let mut out = self.lock();
            out.closed = true;
            out.queue.clear();
            out.permits.clear();
        }
        self.wake.notify_one();
    }
}

async fn serve_connection(
    socket: TcpStream,
    peer: SocketAddr,
    bookie: Arc<Bookie>,
    limits: Arc<ServerLimits>,
    tls: Option<Arc<TlsCertificates>>,
) {
    if let Err(error) = socket.set_nodelay(true) {
        tracing::warn!(%peer, %error, "cannot set TCP_NODELAY; closing the connection");
        return;
    }
    tracing::debug!(%peer, "bookie connection opened");
    let Some(certs) = tls else {
        let (read_half, write_half) = socket.into_split();
        let output = Output::<tokio::io::WriteHalf<TlsStream<TcpStream>>>::Plain;
        serve_stream(peer, read_half, Some(write_half), output, bookie, limits).await;
        return;
    };
    let stream =
        match vela_tls::accept_within(&certs.acceptor(), socket, TLS_HANDSHAKE_TIMEOUT).await {
            Ok(stream) => stream,
            Err(error) => {
                tracing::info!(%peer, %error, "bookie TLS handshake failed");
                return;
            }
        };
    let (read_half, write_half) = tokio::io::split(stream);
    serve_stream(
        peer,
        read_half,
        None,
        Output::Tls(write_half),
        bookie,
        limits,
    )
    .await;
}

/// Where a connection's writer task writes.
enum Output<W> {
    /// The plain socket in `Connection::plain` (shared with `respond`).
    Plain,
    /// Its own half of a TLS stream.
    Tls(W),
}

async fn serve_stream<R, W>(
    peer: SocketAddr,
    read_half: R,
    plain: Option<OwnedWriteHalf>,
    output: Output<W>,
    bookie: Arc<Bookie>,
    limits: Arc<ServerLimits>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    debug_assert_eq!(plain.is_some(), matches!(output, Output::Plain));
    let connection = Arc::new(Connection {
        peer,
        out: Mutex::new(Outbox::default()),
        wake: Notify::new(),
        plain,
    });
    let writer = tokio::spawn(write_loop(connection.clone(), output));
    // If this task is aborted (server shutdown), the writer still stops.
    let _close_writer = CloseOnDrop(connection.clone());
    let requests = Arc::new(Semaphore::new(CONNECTION_IN_FLIGHT_MAX));
    match read_loop(&connection, read_half, &bookie, &limits, &requests).await {
        Ok(()) => {
            // The client half-closed: answer what is in flight (every slot back
            // means every answer is written), then close.
            tracing::debug!(%peer, "bookie connection closed by the client");
            let all_slots = CONNECTION_IN_FLIGHT_MAX as u32;
            let drained =
                tokio::time::timeout(DRAIN_TIMEOUT, requests.acquire_many(all_slots)).await;
            if drained.is_err() {
                tracing::warn!(%peer, "answers still pending after {DRAIN_TIMEOUT:?}; closing anyway");
            }
        }
        Err(ConnectionError::Io(error)) => {
            tracing::debug!(%peer, %error, "bookie connection read failed")
        }
        Err(ConnectionError::Protocol(error)) => {
            tracing::warn!(%peer, %error, "malformed frame from client; closing its connection");
        }
    }
    connection.close();
    let _ = writer.await;
}

/// Closes the connection (stopping its writer task) when dropped.
#[derive(Debug)]
struct CloseOnDrop(Arc<Connection>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
}

async fn read_loop(
    connection: &Arc<Connection>,
    mut socket: impl AsyncRead + Unpin,
    bookie: &Arc<Bookie>,
    limits: &Arc<ServerLimits>,
    requests: &Arc<Semaphore>,
) -> Result<(), ConnectionError> {
    let reads = Arc::new(Semaphore::new(CONNECTION_READS_IN_FLIGHT_MAX));
    // Small until the client sends: idle connections stay cheap.
    let mut buf = BytesMut::with_capacity(2 * READ_SPARE_BYTES_MIN);
    loop {
        if buf.capacity() - buf.len() < READ_SPARE_BYTES_MIN {
            // The chunk is shared with entries in flight: this starts a new one
            // (copying only an incomplete frame's bytes).
            buf.reserve(READ_BUFFER_BYTES);
        }
        if socket.read_buf(&mut buf).await? == 0 {
            return Ok(());
        }
        while let Some(raw) = decode_frame(&mut buf)? {
            // Waiting here is the back-pressure: no more socket reads until
            // answers are written.
            let Ok(request_slot) = requests.clone().acquire_owned().await else {
                return Ok(());
            };
            if connection.lock().closed {
                return Ok(());
            }
            if raw.version != PROTOCOL_VERSION {
                answer_bad_version(connection, &raw, request_slot)?;
                continue;
            }
            let frame = raw.into_request()?;
            let in_flight = InFlight {
                _request: request_slot,
                _read: None,
            };
            dispatch(connection, bookie, limits, &reads, frame, in_flight).await;
        }
    }
}

/// Answers a frame of another protocol version with BAD_VERSION; an op we do
/// not know cannot be answered and closes the connection.
fn answer_bad_version(
    connection: &Connection,
    raw: &RawFrame,
    request_slot: OwnedSemaphorePermit,
) -> Result<(), ConnectionError> {
    {
        let mut out = connection.lock();
        if !out.queue.push_bad_version(raw) {
            return Err(ProtocolError::BadVersion {
                version: raw.version,
            }
            .into());
        }
        out.permits.push(InFlight {
            _request: request_slot,
            _read: None,
        });
    }
    connection.wake.notify_one();
    Ok(())
}

/// Hands one request to the bookie. Adds, fences and LAC writes complete from
/// the journal's force-write thread; reads run on the blocking pool.
async fn dispatch(
    connection: &Arc<Connection>,
    bookie: &Arc<Bookie>,
    limits: &Arc<ServerLimits>,
    reads: &Arc<Semaphore>,
    frame: RequestFrame,
    mut in_flight: InFlight,
) {
    let request_id = frame.request_id;
    let op = frame.request.op();
    let connection = connection.clone();
    let failed = move |status| Response::Failed { op, status };
    match frame.request {
        Request::Add { mode, entry } => {
            // An add waiting for write-cache room is awaited here, in the
            // connection's read loop, so a full cache holds back the client
            // through TCP (and, on this connection, the requests behind the
            // ADD) instead of reading more entries meanwhile: those would
            // leave their read chunks pinned by the accepted entries around
            // them (256 KiB held by one 64 KiB entry), beyond the cache's
            // budget.
            let admission = bookie.add(entry, mode, move |result| {
                let response = match result {
                    Ok((ledger_id, entry_id)) => Response::Add {
                        ledger_id,
                        entry_id,
                    },
                    Err(status) => failed(status),
                };
                connection.respond(request_id, &response, in_flight);
            });
            admission.await;
        }
        Request::WriteLac { ledger_id, lac } => bookie.write_lac(ledger_id, lac, move |result| {
            let response = match result {
                Ok(()) => Response::WriteLac { ledger_id },
                Err(status) => failed(status),
            };
            connection.respond(request_id, &response, in_flight);
        }),
        Request::DeleteLedger { ledger_id } => bookie.delete_ledger(ledger_id, move |result| {
            let response = match result {
                Ok(()) => Response::DeleteLedger { ledger_id },
                Err(status) => failed(status),
            };
            connection.respond(request_id, &response, in_flight);
        }),
        Request::Read {
            ledger_id,
            entry_id,
            mode,
        } => {
            let Ok(read_slot) = reads.clone().acquire_owned().await else {
                return;
            };
            in_flight._read = Some(read_slot);
            let bookie = bookie.clone();
            let limits = limits.clone();
            tokio::spawn(async move {
                if mode == ReadMode::Fence
                    && let Err(status) = fence(&bookie, ledger_id).await
                {
                    connection.respond(request_id, &failed(status), in_flight);
                    return;
                }
                let response =
                    match blocking_read(&limits, move || bookie.read_entry(ledger_id, entry_id))
                        .await
                    {
                        Ok(read) => Response::Read {
                            ledger_id,
                            entry_id: read.entry_id,
                            lac: read.lac,
                            entry: read.entry,
                        },
                        Err(status) => failed(status),
                    };
                connection.respond(request_id, &response, in_flight);
            });
        }
        Request::ReadLac { ledger_id } => {
            let Ok(read_slot) = reads.clone().acquire_owned().await else {
                return;
            };
            in_flight._read = Some(read_slot);
            let bookie = bookie.clone();
            let limits = limits.clone();
            tokio::spawn(async move {
                let response =
                    match blocking_read(&limits, move || bookie.read_lac(ledger_id)).await {
                        Ok(lac) => Response::ReadLac { ledger_id, lac },
                        Err(status) => failed(status),
                    };
                connection.respond(request_id, &response, in_flight);
            });
        }
    }
}

/// Fences `ledger_id` and waits until the fence is durable.
async fn fence(bookie: &Bookie, ledger_id: u64) -> Result<(), Status> {
    let (done, fenced) = tokio::sync::oneshot::channel();
    bookie.fence(ledger_id, move |result| {
        let _ = done.send(result);
    });
    fenced.await.unwrap_or(Err(Status::IoError))
}

/// Runs a storage read on the blocking pool, within `READS_IN_FLIGHT_MAX`.
async fn blocking_read<T: Send + 'static>(
    limits: &ServerLimits,
    read: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    let Ok(_slot) = limits.reads.clone().acquire_owned().await else {
        return Err(Status::ReadOnly);
    };
    tokio::task::spawn_blocking(read)
        .await
        .unwrap_or(Err(Status::IoError))
}

async fn write_loop<W: AsyncWrite + Unpin>(connection: Arc<Connection>, mut output: Output<W>) {
    let mut sending = FrameQueue::default();
    let mut written_permits = Vec::new();
    loop {
        let closed = {
            let mut out = connection.lock();
            std::mem::swap(&mut out.queue, &mut sending);
            std::mem::swap(&mut out.permits, &mut written_permits);
            out.writer_busy = !sending.is_empty();
            out.closed
        };
        if closed {
            break;
        }
        if sending.is_empty() {
            connection.wake.notified().await;
            continue;
        }
        // Every answer queued since the last write, in one vectored write
        // (more only if the socket takes less).
        let written = match (&mut output, &connection.plain) {
            (Output::Tls(stream), _) => sending.write_to(stream).await,
            (Output::Plain, Some(socket)) => write_all(socket, &mut sending).await,
            (Output::Plain, None) => Err(io::ErrorKind::NotConnected.into()),
        };
        if let Err(error) = written {
            tracing::debug!(peer = %connection.peer, %error, "bookie connection write failed");
            connection.close();
            break;
        }
        written_permits.clear();
    }
    match (&mut output, &connection.plain) {
        (Output::Tls(stream), _) => {
            let _ = stream.shutdown().await;
        }
        (Output::Plain, Some(socket)) => {
            let _ = socket2::SockRef::from(socket.as_ref()).shutdown(std::net::Shutdown::Write);
        }
        (Output::Plain, None) => {}
    }
}

async fn write_all(socket: &OwnedWriteHalf, frames: &mut FrameQueue) -> io::Result<()> {
    while !frames.write_now(|slices| socket.try_write_vectored(slices))? {
        socket.writable().await?;
    }
    Ok(())
}
