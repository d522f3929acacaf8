//! Token authentication and authorization over the protocol: CONNECT
//! refusals, AUTH_CHALLENGE when a token expires on a live connection, and
//! AuthorizationError at PRODUCER / SUBSCRIBE / LOOKUP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::{Client, start_broker_with};
use vela_broker::auth::jwt::{self, SigningKey, VerifyKey};
use vela_broker::{AuthAction, AuthConfig, BrokerHandle, NamespaceName};
use vela_wire::proto::{self, ServerError, command_lookup_topic_response::LookupType};

/// Refresh checks this often in these tests (Pulsar: 60 s).
const REFRESH_CHECK: Duration = Duration::from_millis(200);

async fn secured_broker() -> (BrokerHandle, SigningKey) {
    let secret = jwt::new_secret().unwrap();
    let signer = SigningKey::secret(&secret).unwrap();
    let broker = start_broker_with(|config| {
        let mut auth = AuthConfig::new(VerifyKey::secret(&secret).unwrap());
        auth.superuser_roles = vec!["root".into()];
        auth.refresh_check_interval = REFRESH_CHECK;
        config.auth = Some(auth);
    })
    .await;
    (broker, signer)
}

/// CONNECT with `token` (none: no credentials); `refresh`: the client
/// says it answers AUTH_CHALLENGE.
async fn connect_with(addr: SocketAddr, token: Option<&str>, refresh: bool) -> Client {
    let mut client = Client::raw(addr).await;
    client
        .send(proto::CommandConnect {
            client_version: "vela-test".into(),
            protocol_version: Some(21),
            auth_method_name: token.map(|_| "token".to_string()),
            auth_data: token.map(|t| Bytes::copy_from_slice(t.as_bytes())),
            feature_flags: Some(proto::FeatureFlags {
                supports_auth_refresh: Some(refresh),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await;
    client
}

async fn expect_connected(client: &mut Client) {
    let command = client.recv().await.command;
    assert!(
        command.connected.is_some(),
        "expected CONNECTED, got {command:?}"
    );
}

async fn expect_authentication_error(client: &mut Client) {
    let command = client.recv().await.command;
    let error = command.error.expect("expected ERROR");
    assert_eq!(error.request_id, u64::MAX);
    assert_eq!(error.error, ServerError::AuthenticationError as i32);
    client.expect_closed().await;
}

fn token(signer: &SigningKey, role: &str, lifetime: Option<Duration>) -> String {
    signer
        .sign(role, lifetime.map(|l| SystemTime::now() + l))
        .unwrap()
}

#[tokio::test]
async fn connect_needs_a_valid_unexpired_token() {
    let (broker, signer) = secured_broker().await;
    let addr = broker.pulsar_addr();
    let mut none = connect_with(addr, None, false).await;
    expect_authentication_error(&mut none).await;
    let mut garbage = connect_with(addr, Some("not.a.token"), false).await;
    expect_authentication_error(&mut garbage).await;
    let other = SigningKey::secret(&jwt::new_secret().unwrap()).unwrap();
    let forged = token(&other, "root", None);
    let mut forged = connect_with(addr, Some(&forged), false).await;
    expect_authentication_error(&mut forged).await;
    // exp in the past (signed directly: sign() takes any time).
    let expired = signer
        .sign("root", Some(SystemTime::now() - Duration::from_secs(5)))
        .unwrap();
    let mut expired = connect_with(addr, Some(&expired), false).await;
    expect_authentication_error(&mut expired).await;

    let good = token(&signer, "root", Some(Duration::from_secs(3600)));
    let mut ok = connect_with(addr, Some(&good), false).await;
    expect_connected(&mut ok).await;
    ok.create_producer("persistent://public/default/t", 1).await;
}

#[tokio::test]
async fn expired_token_is_challenged_and_refreshed() {
    let (broker, signer) = secured_broker().await;
    let addr = broker.pulsar_addr();
    let short = token(&signer, "root", Some(Duration::from_secs(2)));
    let mut client = connect_with(addr, Some(&short), true).await;
    expect_connected(&mut client).await;

    let command = client.recv().await.command;
    let Some(challenge) = command.auth_challenge else {
        panic!("expected AUTH_CHALLENGE");
    };
    let data = challenge.challenge.unwrap();
    assert_eq!(data.auth_method_name.as_deref(), Some("token"));
    assert_eq!(data.auth_data.as_deref(), Some(&b"refresh"[..]));

    let fresh = token(&signer, "root", Some(Duration::from_secs(3600)));
    client
        .send(proto::CommandAuthResponse {
            client_version: Some("vela-test".into()),
            response: Some(proto::AuthData {
                auth_method_name: Some("token".into()),
                auth_data: Some(Bytes::from(fresh.into_bytes())),
            }),
            protocol_version: Some(21),
        })
        .await;
    // Several refresh checks later the connection still works and was not
    // challenged again.
    tokio::time::sleep(REFRESH_CHECK * 4).await;
    client.send(proto::CommandPing {}).await;
    let command = client.recv().await.command;
    assert!(command.pong.is_some(), "expected PONG, got {command:?}");
}

#[tokio::test]
async fn expired_token_not_refreshed_closes_the_connection() {
    let (broker, signer) = secured_broker().await;
    let addr = broker.pulsar_addr();
    // Each connection gets its own token: the previous one has expired.
    let short = || token(&signer, "root", Some(Duration::from_secs(2)));

    // Challenged, never answers: closed at the following check.
    let mut silent = connect_with(addr, Some(&short()), true).await;
    expect_connected(&mut silent).await;
    assert!(silent.recv().await.command.auth_challenge.is_some());
    silent.expect_closed().await;

    // Answers with a token for another role: closed.
    let mut switcher = connect_with(addr, Some(&short()), true).await;
    expect_connected(&mut switcher).await;
    assert!(switcher.recv().await.command.auth_challenge.is_some());
    let other = token(&signer, "someone-else", Some(Duration::from_secs(3600)));
    switcher
        .send(proto::CommandAuthResponse {
            response: Some(proto::AuthData {
                auth_method_name: Some("token".into()),
                auth_data: Some(Bytes::from(other.into_bytes())),
            }),
            ..Default::default()
        })
        .await;
    switcher.expect_closed().await;

    // Answers with garbage: ERROR(AuthenticationError), closed.
    let mut garbage = connect_with(addr, Some(&short()), true).await;
    expect_connected(&mut garbage).await;
    assert!(garbage.recv().await.command.auth_challenge.is_some());
    garbage
        .send(proto::CommandAuthResponse {
            response: Some(proto::AuthData {
                auth_method_name: Some("token".into()),
                auth_data: Some(Bytes::from_static(b"garbage")),
            }),
            ..Default::default()
        })
        .await;
    expect_authentication_error(&mut garbage).await;

    // A client that cannot refresh is closed when its token expires.
    let mut old = connect_with(addr, Some(&short()), false).await;
    expect_connected(&mut old).await;
    old.expect_closed().await;
}

#[tokio::test]
async fn commands_need_grants() {
    let (broker, signer) = secured_broker().await;
    let addr = broker.pulsar_addr();
    let ns = NamespaceName::parse("public/default").unwrap();
    broker
        .admin()
        .grant_permission(&ns, "writer", BTreeSet::from([AuthAction::Produce]))
        .await
        .unwrap();
    let topic = "persistent://public/default/granted";

    let writer = token(&signer, "writer", None);
    let mut client = connect_with(addr, Some(&writer), false).await;
    expect_connected(&mut client).await;
    client.create_producer(topic, 1).await;
    client
        .send(proto::CommandSubscribe {
            topic: topic.into(),
            subscription: "s".into(),
            consumer_id: 1,
            request_id: 7,
            ..Default::default()
        })
        .await;
    let error = client.recv().await.command.error.expect("expected ERROR");
    assert_eq!(error.request_id, 7);
    assert_eq!(error.error, ServerError::AuthorizationError as i32);

    let stranger = token(&signer, "stranger", None);
    let mut client = connect_with(addr, Some(&stranger), false).await;
    expect_connected(&mut client).await;
    client
        .send(proto::CommandLookupTopic {
            topic: topic.into(),
            request_id: 9,
            ..Default::default()
        })
        .await;
    let response = client
        .recv()
        .await
        .command
        .lookup_topic_response
        .expect("expected LOOKUP_RESPONSE");
    assert_eq!(response.response, Some(LookupType::Failed as i32));
    assert_eq!(response.error, Some(ServerError::AuthorizationError as i32));
    client
        .send(proto::CommandProducer {
            topic: topic.into(),
            producer_id: 1,
            request_id: 10,
            ..Default::default()
        })
        .await;
    let error = client.recv().await.command.error.expect("expected ERROR");
    assert_eq!(error.error, ServerError::AuthorizationError as i32);
}
