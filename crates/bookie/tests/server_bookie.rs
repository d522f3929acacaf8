//! The bookie server end to end in one process: a real `Bookie` (journal +
//! ledger storage in temp dirs) behind a real `Server` on 127.0.0.1, driven by
//! `BookieClient`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vela_bookie::bookie::{Bookie, BookieConfig};
use vela_bookie::server::Server;
use vela_bookie_protocol::BookieError;
use vela_bookie_protocol::client::BookieClient;
use vela_bookie_protocol::entry::{EntryHeader, decode_entry, encode_entry};
use vela_bookie_protocol::{
    AddMode, LAST_ENTRY, Op, ReadMode, Request, Response, Status, decode_frame, encode_request,
};

/// A bookie served on a free port; `stop` shuts it down cleanly and hands the
/// directories back for a restart.
struct Running {
    dirs: Arc<tempfile::TempDir>,
    addr: SocketAddr,
    bookie: Arc<Bookie>,
    shutdown: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
}

fn config(dirs: &tempfile::TempDir) -> BookieConfig {
    let mut config = BookieConfig::new(dirs.path().join("journal"), dirs.path().join("ledgers"));
    // Small files keep the tests' preallocation cheap.
    config.journal.prealloc_chunk_bytes = 1 << 20;
    config.journal.file_bytes_max = 64 << 20;
    config
}

async fn start_with(dirs: Arc<tempfile::TempDir>, config: BookieConfig) -> Running {
    let bookie = tokio::task::spawn_blocking(move || Bookie::open(config))
        .await
        .unwrap()
        .expect("bookie opens");
    let bookie = Arc::new(bookie);
    let server = Server::bind("127.0.0.1:0".parse().unwrap(), bookie.clone())
        .await
        .unwrap();
    let addr = server.local_addr();
    let (shutdown, stop_signal) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        server
            .run(async {
                let _ = stop_signal.await;
            })
            .await
            .unwrap();
    });
    Running {
        dirs,
        addr,
        bookie,
        shutdown,
        served,
    }
}

async fn start() -> Running {
    let dirs = Arc::new(tempfile::tempdir().unwrap());
    let config = config(&dirs);
    start_with(dirs, config).await
}

impl Running {
    async fn client(&self) -> BookieClient {
        BookieClient::connect(self.addr).await.unwrap()
    }

    async fn stop(self) -> Arc<tempfile::TempDir> {
        let _ = self.shutdown.send(());
        self.served.await.unwrap();
        let bookie = self.bookie;
        tokio::task::spawn_blocking(move || {
            bookie.shutdown();
            drop(bookie);
        })
        .await
        .unwrap();
        self.dirs
    }

    async fn restart(self) -> Running {
        let dirs = self.stop().await;
        let config = config(&dirs);
        start_with(dirs, config).await
    }
}

/// Entry `entry_id` of `ledger_id`, carrying LAC `entry_id - 1` and a payload
/// that names it.
fn entry(ledger_id: u64, entry_id: u64) -> Bytes {
    let payload = payload(ledger_id, entry_id);
    let header = EntryHeader {
        ledger_id,
        entry_id,
        last_add_confirmed: entry_id.checked_sub(1),
        ledger_length: (entry_id + 1) * payload.len() as u64,
    };
    encode_entry(&header, &payload)
}

fn payload(ledger_id: u64, entry_id: u64) -> Vec<u8> {
    format!("ledger {ledger_id} entry {entry_id} ")
        .repeat(8)
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_entries_read_back_with_lac() {
    let bookie = start().await;
    let client = bookie.client().await;
    for entry_id in 0..10 {
        client
            .add(entry(1, entry_id), AddMode::Normal)
            .await
            .unwrap();
    }
    for entry_id in 0..10 {
        let read = client.read(1, entry_id, ReadMode::Normal).await.unwrap();
        assert_eq!(read.payload, payload(1, entry_id));
        assert_eq!(read.entry, entry(1, entry_id));
        assert_eq!(read.lac, Some(8));
    }
    let last = client.read(1, LAST_ENTRY, ReadMode::Normal).await.unwrap();
    assert_eq!(last.entry_id, 9);
    assert_eq!(client.read_lac(1).await.unwrap(), Some(8));
    assert!(matches!(
        client.read(1, 10, ReadMode::Normal).await,
        Err(BookieError::NoSuchEntry)
    ));
    assert!(matches!(
        client.read(2, 0, ReadMode::Normal).await,
        Err(BookieError::NoSuchLedger)
    ));
    assert!(matches!(
        client.read_lac(2).await,
        Err(BookieError::NoSuchLedger)
    ));
    bookie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_adds_all_complete_and_survive_restart() {
    let bookie = start().await;
    let client = bookie.client().await;
    // Every add is queued before any answer is awaited.
    let adds: Vec<_> = (0..3)
        .flat_map(|ledger_id| (0..400).map(move |entry_id| (ledger_id, entry_id)))
        .map(|(ledger_id, entry_id)| client.add(entry(ledger_id, entry_id), AddMode::Normal))
        .collect();
    for add in adds {
        add.await.unwrap();
    }
    let bookie = bookie.restart().await;
    let client = bookie.client().await;
    let reads: Vec<_> = (0..3)
        .flat_map(|ledger_id| (0..400).map(move |entry_id| (ledger_id, entry_id)))
        .map(|(ledger_id, entry_id)| {
            (
                ledger_id,
                entry_id,
                client.read(ledger_id, entry_id, ReadMode::Normal),
            )
        })
        .collect();
    for (ledger_id, entry_id, read) in reads {
        assert_eq!(read.await.unwrap().payload, payload(ledger_id, entry_id));
    }
    assert_eq!(client.read_lac(2).await.unwrap(), Some(398));
    bookie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_ledger_refuses_normal_adds_and_takes_recovery_adds() {
    let bookie = start().await;
    let client = bookie.client().await;
    client.add(entry(5, 0), AddMode::Normal).await.unwrap();
    client.add(entry(5, 1), AddMode::Normal).await.unwrap();
    let fenced = client.read(5, LAST_ENTRY, ReadMode::Fence).await.unwrap();
    assert_eq!((fenced.entry_id, fenced.lac), (1, Some(0)));
    assert!(matches!(
        client.add(entry(5, 2), AddMode::Normal).await,
        Err(BookieError::Fenced)
    ));
    client.add(entry(5, 2), AddMode::Recovery).await.unwrap();
    assert_eq!(
        client
            .read(5, LAST_ENTRY, ReadMode::Normal)
            .await
            .unwrap()
            .entry_id,
        2
    );
    // Other ledgers are untouched.
    client.add(entry(6, 0), AddMode::Normal).await.unwrap();
    // Fencing a ledger this bookie never saw works too (recovery reaches
    // bookies that missed every entry); the read itself finds nothing.
    assert!(matches!(
        client.read(7, LAST_ENTRY, ReadMode::Fence).await,
        Err(BookieError::NoSuchEntry)
    ));
    assert!(matches!(
        client.add(entry(7, 0), AddMode::Normal).await,
        Err(BookieError::Fenced)
    ));

    let bookie = bookie.restart().await;
    let client = bookie.client().await;
    assert!(matches!(
        client.add(entry(5, 3), AddMode::Normal).await,
        Err(BookieError::Fenced)
    ));
    assert!(matches!(
        client.add(entry(7, 0), AddMode::Normal).await,
        Err(BookieError::Fenced)
    ));
    client.add(entry(6, 1), AddMode::Normal).await.unwrap();
    bookie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_lac_and_deletion() {
    let bookie = start().await;
    let client = bookie.client().await;
    for entry_id in 0..3 {
        client
            .add(entry(9, entry_id), AddMode::Normal)
            .await
            .unwrap();
    }
    assert_eq!(client.read_lac(9).await.unwrap(), Some(1));
    client.write_lac(9, 2).await.unwrap();
    assert_eq!(client.read_lac(9).await.unwrap(), Some(2));
    // A lower explicit LAC never moves it back.
    client.write_lac(9, 0).await.unwrap();
    assert_eq!(client.read_lac(9).await.unwrap(), Some(2));
    client.add(entry(10, 0), AddMode::Normal).await.unwrap();
    client.delete_ledger(10).await.unwrap();
    assert!(matches!(
        client.read(10, 0, ReadMode::Normal).await,
        Err(BookieError::NoSuchLedger)
    ));

    let bookie = bookie.restart().await;
    let client = bookie.client().await;
    assert_eq!(client.read_lac(9).await.unwrap(), Some(2));
    assert!(matches!(
        client.read(10, 0, ReadMode::Normal).await,
        Err(BookieError::NoSuchLedger)
    ));
    assert!(matches!(
        client.read_lac(10).await,
        Err(BookieError::NoSuchLedger)
    ));
    bookie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frame_closes_only_its_connection() {
    let bookie = start().await;
    let good = bookie.client().await;
    good.add(entry(1, 0), AddMode::Normal).await.unwrap();

    let mut bad = TcpStream::connect(bookie.addr).await.unwrap();
    bad.write_all(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3])
        .await
        .unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), bad.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "server kept the bad connection open"
    );

    // An ADD whose entry is too short to have a header is a bad request, answered.
    let mut raw = TcpStream::connect(bookie.addr).await.unwrap();
    let mut frame = BytesMut::new();
    encode_request(
        7,
        &Request::Add {
            mode: AddMode::Normal,
            entry: Bytes::from_static(b"short"),
        },
        &mut frame,
    );
    // And a frame of a future protocol version is answered with BAD_VERSION.
    let mut future = BytesMut::new();
    encode_request(8, &Request::ReadLac { ledger_id: 1 }, &mut future);
    future[4] = 200;
    frame.put_slice(&future);
    raw.write_all(&frame).await.unwrap();
    let answers = read_responses(&mut raw, 2).await;
    assert!(answers.contains(&(
        7,
        Response::Failed {
            op: Op::Add,
            status: Status::BadRequest
        }
    )));
    assert!(answers.contains(&(
        8,
        Response::Failed {
            op: Op::ReadLac,
            status: Status::BadVersion
        }
    )));

    good.add(entry(1, 1), AddMode::Normal).await.unwrap();
    assert_eq!(
        good.read(1, 1, ReadMode::Normal).await.unwrap().payload,
        payload(1, 1)
    );
    bookie.stop().await;
}

async fn read_responses(socket: &mut TcpStream, count: usize) -> Vec<(u64, Response)> {
    let mut buf = BytesMut::new();
    let mut responses = Vec::new();
    while responses.len() < count {
        let read = tokio::time::timeout(Duration::from_secs(5), socket.read_buf(&mut buf)).await;
        assert!(read.unwrap().unwrap() > 0, "connection closed early");
        while let Some(raw) = decode_frame(&mut buf).unwrap() {
            let frame = raw.into_response().unwrap();
            responses.push((frame.request_id, frame.response));
        }
    }
    responses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_journal_queue_answers_too_many_requests() {
    let dirs = Arc::new(tempfile::tempdir().unwrap());
    let mut config = config(&dirs);
    config.journal.queue_depth_max = 1;
    let bookie = start_with(dirs, config).await;
    let client = bookie.client().await;
    let adds: Vec<_> = (0..2000)
        .map(|entry_id| client.add(entry(3, entry_id), AddMode::Normal))
        .collect();
    let mut stored = Vec::new();
    let mut refused = 0;
    for (entry_id, add) in adds.into_iter().enumerate() {
        match add.await {
            Ok(()) => stored.push(entry_id as u64),
            Err(BookieError::TooManyRequests) => refused += 1,
            Err(other) => panic!("unexpected error {other:?}"),
        }
    }
    assert!(
        refused > 0,
        "a 1-deep journal queue never filled under 2000 pipelined adds"
    );
    assert!(!stored.is_empty());
    for entry_id in stored {
        assert_eq!(
            client
                .read(3, entry_id, ReadMode::Normal)
                .await
                .unwrap()
                .payload,
            payload(3, entry_id)
        );
    }
    bookie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_beyond_the_write_cache_waits_for_flushes_and_every_add_lands() {
    let dirs = Arc::new(tempfile::tempdir().unwrap());
    let mut config = config(&dirs);
    // The smallest cache storage accepts (two max-size entries); flush only when
    // it is full, so a burst overruns it.
    config.storage.write_cache_bytes_max =
        2 * (u64::from(vela_bookie::storage::ENTRY_PAYLOAD_BYTES_MAX) + 4096);
    config.storage.flush_threshold_bytes = config.storage.write_cache_bytes_max;
    config.storage.flush_interval = Duration::from_secs(600);
    let bookie = start_with(dirs, config).await;
    let client = bookie.client().await;
    let big_entry = |entry_id: u64| {
        let header = EntryHeader {
            ledger_id: 4,
            entry_id,
            last_add_confirmed: None,
            ledger_length: 0,
        };
        encode_entry(&header, &vec![entry_id as u8; 256 * 1024])
    };
    // 50 MiB pipelined into a 10 MiB cache: the server stops reading while the
    // cache is full (back-pressure through TCP) instead of refusing entries.
    let adds: Vec<_> = (0..200)
        .map(|entry_id| client.add(big_entry(entry_id), AddMode::Normal))
        .collect();
    for (entry_id, add) in adds.into_iter().enumerate() {
        if let Err(error) = add.await {
            panic!("add {entry_id} failed: {error:?}");
        }
    }
    for entry_id in 0..200 {
        let read = client.read(4, entry_id, ReadMode::Normal).await.unwrap();
        assert_eq!(read.payload, big_entry(entry_id).slice(36..));
    }
    bookie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_are_stored_verbatim_and_verified_by_reader() {
    let bookie = start().await;
    let client = bookie.client().await;
    // The bookie stores whatever packaged entry it gets; a corrupted one (bad
    // CRC) is caught by the reader, end to end.
    let mut corrupt = entry(11, 0).to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0x40;
    client
        .add(Bytes::from(corrupt), AddMode::Normal)
        .await
        .unwrap();
    assert!(matches!(
        client.read(11, 0, ReadMode::Normal).await,
        Err(BookieError::CorruptEntry(_))
    ));
    client.add(entry(11, 1), AddMode::Normal).await.unwrap();
    let read = client.read(11, 1, ReadMode::Normal).await.unwrap();
    assert_eq!(decode_entry(&read.entry).unwrap().1, payload(11, 1));
    bookie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_garbage_connections_never_disturb_others() {
    let bookie = start().await;
    let good = bookie.client().await;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for round in 0..50u64 {
        let mut garbage = Vec::new();
        // Half the rounds start with a plausible header so the decoder gets
        // past the length check into op, flags and body parsing.
        if round % 2 == 0 {
            garbage.extend_from_slice(&[0, 0, 0, 20, 1, (round % 7) as u8, 0, (round % 3) as u8]);
        }
        for _ in 0..(round * 7 % 64) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            garbage.push(state as u8);
        }
        let mut socket = TcpStream::connect(bookie.addr).await.unwrap();
        socket.write_all(&garbage).await.unwrap();
        drop(socket);
        good.add(entry(12, round), AddMode::Normal).await.unwrap();
    }
    for round in 0..50u64 {
        assert_eq!(
            good.read(12, round, ReadMode::Normal)
                .await
                .unwrap()
                .payload,
            payload(12, round)
        );
    }
    bookie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_shutdown_closes_client_connections() {
    let bookie = start().await;
    let client = bookie.client().await;
    client.add(entry(13, 0), AddMode::Normal).await.unwrap();
    let _ = bookie.shutdown.send(());
    bookie.served.await.unwrap();
    // The client learns at once (not at a timeout) that the connection is gone.
    let answer = tokio::time::timeout(Duration::from_secs(2), client.read_lac(13)).await;
    assert!(
        matches!(answer, Ok(Err(BookieError::ConnectionLost { .. }))),
        "{answer:?}"
    );
    let bookie = bookie.bookie;
    tokio::task::spawn_blocking(move || bookie.shutdown())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_pipelined_requests_past_the_in_flight_bound_all_answered() {
    // More requests than `CONNECTION_IN_FLIGHT_MAX` (and reads past the per
    // connection read bound) written in one go by a raw client that reads its
    // answers concurrently: the server pauses reading, never drops or deadlocks.
    let requests = 3 * vela_bookie::server::CONNECTION_IN_FLIGHT_MAX as u64;
    let bookie = start().await;
    let socket = TcpStream::connect(bookie.addr).await.unwrap();
    let (mut read_half, mut write_half) = socket.into_split();
    let writer = tokio::spawn(async move {
        let mut frames = BytesMut::new();
        for request_id in 0..requests {
            let request = if request_id % 4 == 3 {
                Request::ReadLac { ledger_id: 14 }
            } else {
                Request::Add {
                    mode: AddMode::Normal,
                    entry: entry(14, request_id),
                }
            };
            encode_request(request_id, &request, &mut frames);
        }
        write_half.write_all(&frames).await.unwrap();
        write_half
    });
    let mut buf = BytesMut::new();
    let mut answered = vec![false; requests as usize];
    let mut count = 0;
    while count < requests {
        let read =
            tokio::time::timeout(Duration::from_secs(20), read_half.read_buf(&mut buf)).await;
        assert!(
            read.unwrap().unwrap() > 0,
            "connection closed after {count} answers"
        );
        while let Some(raw) = decode_frame(&mut buf).unwrap() {
            let frame = raw.into_response().unwrap();
            let request_id = frame.request_id;
            assert!(
                !answered[request_id as usize],
                "request {request_id} answered twice"
            );
            answered[request_id as usize] = true;
            count += 1;
            if request_id % 4 == 3 {
                assert!(
                    matches!(frame.response, Response::ReadLac { .. }),
                    "{:?}",
                    frame.response
                );
            } else {
                assert_eq!(
                    frame.response,
                    Response::Add {
                        ledger_id: 14,
                        entry_id: request_id
                    }
                );
            }
        }
    }
    drop(writer.await.unwrap());
    bookie.stop().await;
}
