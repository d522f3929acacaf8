//! vela-client: an async Rust client for the Pulsar binary protocol, used by
//! `vela perf` and the tests; it talks to Vela and to Apache Pulsar alike.
//!
//! Owns: connections (`connection`: handshake, request/answer matching, one
//! reader and one writer task each), the client entry point with lookup and
//! the connection pool (`client`), producers (`producer`: batching,
//! compression, pending bounds, ordered receipts, reconnect and resend,
//! partition routing) and consumers (`consumer`: permits, batches, acks,
//! reconnect).
//! Never: blocks a tokio worker, holds a lock across an `.await`, or grows a
//! queue without a bound (pending messages per producer, the client's memory
//! limit, requests and frames per connection, messages per consumer queue).
//!
//! ```no_run
//! # async fn demo() -> Result<(), vela_client::ClientError> {
//! use vela_client::{Client, ClientConfig, ConsumerOptions, OutgoingMessage, ProducerOptions};
//! let client = Client::new("pulsar://127.0.0.1:6650", ClientConfig::default())?;
//! let producer = client.create_producer("persistent://public/default/t", ProducerOptions::default()).await?;
//! let id = producer.send_and_wait(OutgoingMessage::new("hello")).await?;
//! let consumer = client.subscribe("persistent://public/default/t", ConsumerOptions::new("sub")).await?;
//! # Ok(()) }
//! ```

mod client;
mod connection;
mod consumer;
mod error;
mod message;
mod producer;
mod receive_queue;

pub use client::{Client, ClientConfig, LOOKUP_REDIRECTS_MAX};
pub use consumer::{Consumer, ConsumerOptions, DECOMPRESSED_BYTES_MAX};
pub use error::ClientError;
pub use message::{Message, MessageId, OutgoingMessage};
pub use producer::{BatchingOptions, Producer, ProducerOptions, SendFuture};
pub use vela_wire::proto::CompressionType;
pub use vela_wire::proto::command_subscribe::{InitialPosition, SubType};
