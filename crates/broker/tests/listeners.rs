//! Advertised listeners: lookups naming a listener get its URLs, naming
//! none the internal one's, naming an unknown one Pulsar's refusal.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Client;
use vela_broker::listeners::parse_advertised_listeners;
use vela_wire::proto::{self, ServerError, command_lookup_topic_response::LookupType};

async fn lookup(client: &mut Client, listener: Option<&str>) -> proto::CommandLookupTopicResponse {
    client
        .send(proto::CommandLookupTopic {
            topic: "persistent://public/default/listened".into(),
            request_id: 1,
            advertised_listener_name: listener.map(String::from),
            ..Default::default()
        })
        .await;
    *client.recv().await.command.lookup_topic_response.unwrap()
}

#[tokio::test]
async fn lookups_answer_the_named_listener() {
    let listeners = parse_advertised_listeners(
        "internal:pulsar://10.1.2.3:6650,internal:pulsar+ssl://10.1.2.3:6651,\
         external:pulsar://broker.example.com:16650",
        None,
    )
    .unwrap();
    let broker = common::start_broker_with(|config| config.advertised_listeners = listeners).await;
    assert_eq!(broker.service_url(), "pulsar://10.1.2.3:6650");
    let mut client = Client::connect(broker.pulsar_addr()).await;

    for name in [None, Some(""), Some("internal")] {
        let answer = lookup(&mut client, name).await;
        assert_eq!(answer.response, Some(LookupType::Connect as i32));
        assert_eq!(
            answer.broker_service_url.as_deref(),
            Some("pulsar://10.1.2.3:6650")
        );
        assert_eq!(
            answer.broker_service_url_tls.as_deref(),
            Some("pulsar+ssl://10.1.2.3:6651")
        );
    }
    let external = lookup(&mut client, Some("external")).await;
    assert_eq!(
        external.broker_service_url.as_deref(),
        Some("pulsar://broker.example.com:16650")
    );
    assert_eq!(external.broker_service_url_tls, None);

    let unknown = lookup(&mut client, Some("nope")).await;
    assert_eq!(unknown.response, Some(LookupType::Failed as i32));
    assert_eq!(unknown.error, Some(ServerError::ServiceNotReady as i32));
    assert_eq!(
        unknown.message.as_deref(),
        Some("the broker do not have nope listener")
    );
    broker.shutdown().await.unwrap();
}
