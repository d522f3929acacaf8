//! Sending a stored entry as it is: what a replicator does (Pulsar's
//! replicator producer sends each entry of its source log, batch or not,
//! with the metadata it was stored with plus `replicated_from`).
//!
//! The caller picks each entry's sequence id; they must increase (receipts
//! are matched in order, and the receiving broker's deduplication drops a
//! re-send of an id it stored). Never: batches, compresses or otherwise
//! rewrites the entry; the producer's pending bound and the client's memory
//! limit apply as for `send`.

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;
use tokio::time::Instant;
use vela_wire::encode_payload_frame;
use vela_wire::proto::{BaseCommand, CommandSend, MessageMetadata};

use super::{Completion, InFlight, Producer, SendFuture, TopicProducer};
use crate::error::ClientError;

impl Producer {
    /// Sends one entry (`metadata` as it will be stored, `payload` the
    /// entry's payload: a batch when `num_messages_in_batch` says so) with
    /// the SEND sequence id `sequence_id`, greater than every earlier one of
    /// this producer. Only for a non-partitioned topic (or one partition).
    pub async fn send_entry(
        &self,
        sequence_id: u64,
        metadata: MessageMetadata,
        payload: Bytes,
    ) -> Result<SendFuture, ClientError> {
        let [partition] = self.partitions.as_slice() else {
            return Err(ClientError::Protocol(
                "send_entry needs a producer of one topic or partition".into(),
            ));
        };
        partition.send_entry(sequence_id, metadata, payload).await
    }

    /// The least sequence id `send_entry` takes next: one past the last
    /// sent, or past what the broker said it stored for this producer name
    /// when the producer was created (its deduplication's last sequence id).
    pub fn next_sequence_id(&self) -> u64 {
        self.partitions
            .first()
            .map_or(0, |p| p.core.state.lock().next_sequence_id)
    }
}

impl TopicProducer {
    async fn send_entry(
        &self,
        sequence_id: u64,
        metadata: MessageMetadata,
        payload: Bytes,
    ) -> Result<SendFuture, ClientError> {
        let core = &self.core;
        let permits = core.acquire(payload.len()).await?;
        let (reply, receipt) = oneshot::channel();
        let completion = Completion {
            reply,
            _permits: permits,
        };
        let mut state = core.state.lock();
        if let Some(error) = &state.closed {
            return Err(error.clone());
        }
        if payload.len() > state.max_message_size_bytes {
            return Err(ClientError::MessageTooLarge {
                len_bytes: payload.len(),
                max_bytes: state.max_message_size_bytes,
            });
        }
        if state
            .pending
            .back()
            .is_some_and(|last| last.sequence_id >= sequence_id)
            || state.next_sequence_id > sequence_id
        {
            return Err(ClientError::Protocol(format!(
                "sequence id {sequence_id} does not follow the ones sent before"
            )));
        }
        state.next_sequence_id = sequence_id + 1;
        let command = BaseCommand::from(CommandSend {
            producer_id: core.producer_id,
            sequence_id,
            num_messages: metadata.num_messages_in_batch,
            ..Default::default()
        });
        let mut frame = BytesMut::new();
        encode_payload_frame(&command, &metadata, &payload, &mut frame);
        state.pending.push_back(InFlight {
            sequence_id,
            frame: frame.freeze(),
            completions: vec![completion],
            batched: false,
            created_at: Instant::now(),
        });
        core.pump(&mut state);
        Ok(SendFuture(receipt))
    }
}
