//! Non-persistent topics as Pulsar serves them: receipts (0, 0), messages
//! with id (0, 0) to consumers with permits, drops counted otherwise, the
//! four subscription types, acks answered and forgotten, and the admin
//! routes under /admin/v2/non-persistent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Client, expect_nothing_but_pong, message_of};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vela_wire::proto::{self, ServerError, command_subscribe::SubType};

const TOPIC: &str = "non-persistent://public/default/np";

fn receipt_id(frame: &common::Frame) -> (u64, u64) {
    let receipt = frame.command.send_receipt.as_ref().expect("SEND_RECEIPT");
    let id = receipt.message_id.as_ref().expect("message id");
    (id.ledger_id, id.entry_id)
}

/// One HTTP/1.1 request; (status, body).
async fn http(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

#[tokio::test]
async fn messages_go_to_consumers_with_permits_and_are_dropped_otherwise() {
    let broker = common::start_broker().await;
    let mut producer = Client::connect(broker.pulsar_addr()).await;
    producer.create_producer(TOPIC, 1).await;
    // Nobody subscribed: the message is gone, the receipt says (0, 0).
    producer.produce(1, 0, b"lost").await;
    assert_eq!(receipt_id(&producer.recv().await), (0, 0));

    let mut consumer = Client::connect(broker.pulsar_addr()).await;
    consumer.subscribe(TOPIC, "s", SubType::Exclusive, 1).await;
    producer.produce(1, 1, b"no permits").await;
    assert_eq!(receipt_id(&producer.recv().await), (0, 0));
    consumer.flow(1, 1).await;
    expect_nothing_but_pong(&mut consumer).await;
    producer.produce(1, 2, b"taken").await;
    producer.produce(1, 3, b"no room").await;
    for _ in 0..2 {
        assert_eq!(receipt_id(&producer.recv().await), (0, 0));
    }
    let frame = consumer.recv().await;
    let (message, payload) = message_of(&frame);
    assert_eq!(payload.as_ref(), b"taken");
    let id = &message.message_id;
    assert_eq!((id.ledger_id, id.entry_id, id.partition), (0, 0, Some(-1)));
    // Acks are answered and forgotten.
    consumer
        .send(proto::CommandAck {
            consumer_id: 1,
            ack_type: 0,
            message_id: vec![id.clone()],
            request_id: Some(5),
            ..Default::default()
        })
        .await;
    assert!(consumer.recv().await.command.ack_response.is_some());
    expect_nothing_but_pong(&mut consumer).await;

    let stats = broker.topic_stats(TOPIC).await.unwrap().unwrap();
    assert_eq!(stats.msg_in_counter, 4);
    assert_eq!(stats.msg_out_counter, 1);
    let subscription = &stats.subscriptions[0];
    assert_eq!(subscription.msg_drop_counter, 2, "{subscription:?}");
    assert!(subscription.msg_drop_rate.is_some());

    // GET_LAST_MESSAGE_ID is refused as Pulsar refuses it.
    consumer
        .send(proto::CommandGetLastMessageId {
            consumer_id: 1,
            request_id: 6,
        })
        .await;
    let error = consumer.recv().await.command.error.expect("ERROR");
    assert_eq!(error.error, ServerError::UnknownError as i32);
}

#[tokio::test]
async fn shared_subscriptions_round_robin_and_failover_has_one_active() {
    let broker = common::start_broker().await;
    let topic = "non-persistent://public/default/np-shared";
    let mut producer = Client::connect(broker.pulsar_addr()).await;
    producer.create_producer(topic, 1).await;
    let mut a = Client::connect(broker.pulsar_addr()).await;
    let mut b = Client::connect(broker.pulsar_addr()).await;
    a.subscribe(topic, "shared", SubType::Shared, 1).await;
    b.subscribe(topic, "shared", SubType::Shared, 1).await;
    a.flow(1, 10).await;
    b.flow(1, 10).await;
    let mut fo = Client::connect(broker.pulsar_addr()).await;
    fo.send(proto::CommandSubscribe {
        topic: topic.into(),
        subscription: "fo".into(),
        sub_type: SubType::Failover as i32,
        consumer_id: 7,
        request_id: 7,
        ..Default::default()
    })
    .await;
    // SUCCESS and ACTIVE_CONSUMER_CHANGE(active), in some order.
    for _ in 0..2 {
        let command = fo.recv().await.command;
        assert!(command.success.is_some() || command.active_consumer_change.is_some());
    }
    fo.flow(7, 10).await;
    expect_nothing_but_pong(&mut fo).await;
    for seq in 0..4 {
        producer.produce(1, seq, b"m").await;
        receipt_id(&producer.recv().await);
    }
    for client in [&mut a, &mut b] {
        for _ in 0..2 {
            message_of(&client.recv().await);
        }
        expect_nothing_but_pong(client).await;
    }
    for _ in 0..4 {
        message_of(&fo.recv().await);
    }
    // A second Exclusive consumer is refused as on persistent topics.
    let mut other = Client::connect(broker.pulsar_addr()).await;
    other.subscribe(topic, "ex", SubType::Exclusive, 1).await;
    other
        .send(proto::CommandSubscribe {
            topic: topic.into(),
            subscription: "ex".into(),
            sub_type: SubType::Exclusive as i32,
            consumer_id: 2,
            request_id: 9,
            ..Default::default()
        })
        .await;
    let error = other.recv().await.command.error.expect("ERROR");
    assert_eq!(error.error, ServerError::ConsumerBusy as i32);
}

#[tokio::test]
async fn admin_routes_list_stats_partitions_and_unload() {
    let broker = common::start_broker().await;
    let http_server = broker
        .start_http(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let addr = http_server.local_addr();
    let mut producer = Client::connect(broker.pulsar_addr()).await;
    producer.create_producer(TOPIC, 1).await;
    let (status, body) = http(addr, "GET", "/admin/v2/non-persistent/public/default", "").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "[\"non-persistent://public/default/np\"]")
    );
    let (status, body) = http(
        addr,
        "GET",
        "/admin/v2/non-persistent/public/default/np/stats",
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"msgDropRate\""), "{body}");
    let (status, _) = http(
        addr,
        "GET",
        "/admin/v2/non-persistent/public/default/gone/stats",
        "",
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = http(
        addr,
        "PUT",
        "/admin/v2/non-persistent/public/default/npp/partitions",
        "2",
    )
    .await;
    assert_eq!(status, 204);
    let (status, body) = http(
        addr,
        "GET",
        "/admin/v2/non-persistent/public/default/npp/partitions",
        "",
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "{\"partitions\":2}"));
    let (status, body) = http(
        addr,
        "GET",
        "/admin/v2/non-persistent/public/default/partitioned",
        "",
    )
    .await;
    assert_eq!(
        (status, body.as_str()),
        (200, "[\"non-persistent://public/default/npp\"]")
    );
    let (status, body) = http(
        addr,
        "GET",
        "/admin/v2/non-persistent/public/default/npp/partitioned-stats",
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = http(
        addr,
        "POST",
        "/admin/v2/non-persistent/public/default/np/terminate",
        "",
    )
    .await;
    assert_eq!(status, 406);
    let (status, _) = http(
        addr,
        "PUT",
        "/admin/v2/non-persistent/public/default/np/unload",
        "",
    )
    .await;
    assert_eq!(status, 204);
    assert!(producer.recv().await.command.close_producer.is_some());
    http_server.stop().await;
}
