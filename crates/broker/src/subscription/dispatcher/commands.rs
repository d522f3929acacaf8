//! The subscription task's commands: each `SubCommand` handled in arrival
//! order (consumers attached and detached, permits, acknowledgements,
//! redelivery requests, seek, unsubscribe, stats, admin acks, shutdown),
//! and the consumer-facing answers they cause (ACK_RESPONSE,
//! CLOSE_CONSUMER, REACHED_END_OF_TOPIC, the active consumer's change).
//!
//! Owns no state of its own: it changes the task's `acks`, `consumers`,
//! `outstanding`, `delayed` and `reader`. Never: sends an entry (`delivery`
//! does, after each command), reads the log, or acknowledges beyond the
//! last confirmed entry.

use vela_log::Position;
use vela_wire::proto::{
    self, CommandCloseConsumer, CommandReachedEndOfTopic, MessageIdData, ServerError,
    command_ack::AckType, command_subscribe::SubType,
};

use super::{Dispatcher, Flow};
use crate::codec;
use crate::error::ServiceError;
use crate::subscription::acks::ACK_SET_WORDS_MAX;
use crate::subscription::command::{
    ConnEvent, ConsumerInfo, ConsumerKey, ConsumerStatsSnapshot, SeekTarget, SubCommand, key_of,
};
use crate::subscription::delayed;
use crate::subscription::seek::resolve_seek;

impl Dispatcher {
    pub(super) async fn handle(&mut self, command: SubCommand) -> Flow {
        match command {
            SubCommand::Add {
                info,
                sub_type,
                reply,
            } => {
                let result = self.add_consumer(info, sub_type).await;
                let _ = reply.send(result);
            }
            SubCommand::Remove { key, reply } => {
                self.remove_consumer(key).await;
                let ended = !self.durable && self.consumers.is_empty();
                if let Some(reply) = reply {
                    let _ = reply.send(ended);
                }
                if ended {
                    return Flow::Stop;
                }
            }
            SubCommand::Flow { key, permits } => {
                if let Some(slot) = self.consumers.get_mut(key) {
                    slot.permits = slot.permits.saturating_add(i64::from(permits));
                    slot.last_flow_ms = delayed::now_ms();
                    slot.flowed = true;
                    self.reader.caught_up = false;
                }
            }
            SubCommand::Ack {
                key,
                ack_type,
                ids,
                request_id,
            } => self.ack(key, ack_type, ids, request_id).await,
            SubCommand::Redeliver { key, ids, epoch } => self.redeliver(key, &ids, epoch),
            SubCommand::TxnCommitted {
                positions,
                cumulative,
                reply,
            } => {
                self.txn_committed(positions, cumulative).await;
                let _ = reply.send(());
            }
            SubCommand::TxnAborted { positions } => self.txn_aborted(&positions),
            SubCommand::Seek { target, reply } => {
                let result = self.seek(target).await;
                let _ = reply.send(result);
            }
            SubCommand::Unsubscribe { key, force, reply } => {
                if self.consumers.has_others_than(key) && !force {
                    let _ = reply.send(Err(ServiceError::new(
                        ServerError::UnknownError,
                        "subscription has other active consumers",
                    )));
                    return Flow::Continue;
                }
                if self.acks.is_durable()
                    && let Err(e) = self.log.delete_cursor(&self.name).await
                {
                    let _ = reply.send(Err(e.into()));
                    return Flow::Continue;
                }
                self.close_all_consumers(Some(key)).await;
                let _ = reply.send(Ok(()));
                return Flow::Stop;
            }
            SubCommand::Stats { key, reply } => {
                let backlog = self.acks.backlog(&self.log);
                let snapshot = self.consumers.get(key).map(|s| ConsumerStatsSnapshot {
                    available_permits: s.permits,
                    unacked_messages: s.unacked,
                    backlog,
                    name: s.info.name.clone(),
                    address: s.info.address.to_string(),
                });
                let _ = reply.send(snapshot);
            }
            SubCommand::SubStats { reply } => {
                let _ = reply.send(self.stats());
            }
            SubCommand::AckUpTo {
                position,
                expired,
                reply,
            } => {
                let result = self.ack_up_to(position, expired);
                let _ = reply.send(result);
            }
            SubCommand::MarkDelete { reply } => {
                let _ = reply.send(self.acks.mark_delete());
            }
            SubCommand::TopicTerminated => self.terminated = true,
            SubCommand::Shutdown { reply } => {
                self.close_all_consumers(None).await;
                let _ = reply.send(());
                return Flow::Stop;
            }
        }
        Flow::Continue
    }

    /// A terminated topic whose every entry this subscription acknowledged:
    /// its consumers are told they reached the end (once each), as Pulsar
    /// does on termination, after an ack and on reading past the end.
    /// Clients that close the connection on the command (C++/Python, Go)
    /// and those below protocol v9 are not told.
    pub(super) async fn tell_end_of_topic(&mut self) {
        if !self.terminated || self.acks.backlog(&self.log) > 0 {
            return;
        }
        for index in 0..self.consumers.len() {
            let slot = self.consumers.at_mut(index);
            if slot.told_end_of_topic
                || !slot.flowed
                || !slot.info.handles_end_of_topic
                || slot.info.protocol_version < 9
            {
                continue;
            }
            slot.told_end_of_topic = true;
            let frame = codec::encode_command(CommandReachedEndOfTopic {
                consumer_id: slot.info.consumer_id,
            });
            let _ = slot.info.out.send(frame).await;
        }
    }

    /// Acknowledges everything up to `position` (admin skip/expire).
    pub(super) fn ack_up_to(
        &mut self,
        position: Position,
        expired: bool,
    ) -> Result<(), ServiceError> {
        let backlog_before = self.acks.backlog(&self.log);
        let mark_delete_before = self.acks.mark_delete();
        self.acks
            .ack_cumulative(&self.log, position)
            .map_err(ServiceError::from)?;
        debug_assert!(
            self.acks.mark_delete() >= mark_delete_before,
            "mark-delete position moved back"
        );
        for owner in self.outstanding.drop_through(position) {
            self.unacked_one_less(owner);
        }
        self.delayed.drop_through(position);
        self.reader.skip_through(position);
        if expired {
            let backlog_after = self.acks.backlog(&self.log);
            self.counters.expired += backlog_before.saturating_sub(backlog_after);
        }
        self.reader.caught_up = false;
        Ok(())
    }

    /// An entry out to `owner` is no longer out (acked or sent again).
    /// Saturating: the count is a statistic, and a REDELIVER naming an
    /// entry twice takes it down twice.
    pub(super) fn unacked_one_less(&mut self, owner: ConsumerKey) {
        if let Some(slot) = self.consumers.get_mut(owner) {
            slot.unacked = slot.unacked.saturating_sub(1);
        }
    }

    pub(super) async fn add_consumer(
        &mut self,
        info: ConsumerInfo,
        sub_type: SubType,
    ) -> Result<(), ServiceError> {
        // Key_Shared: a consumer joining beside others while entries are out
        // or waiting is fenced at the read position (Pulsar's "recently
        // joined consumers": not the first one, and only while something
        // is unacknowledged). Alone it takes every key; what waits in
        // replay goes first anyway.
        let fence_at = (!self.outstanding.is_empty() && !self.consumers.is_empty())
            .then_some(self.reader.position());
        self.consumers
            .attach(info, sub_type, &self.name, fence_at)?;
        if self.consumers.has_active_consumer() {
            self.pick_active().await;
        }
        Ok(())
    }

    pub(super) async fn remove_consumer(&mut self, key: ConsumerKey) {
        if !self.consumers.detach(key) {
            return;
        }
        // Every entry it had not acked goes back to the replay set; on
        // Shared and Key_Shared, counted as redelivered as Pulsar counts it.
        if matches!(
            self.consumers.sub_type(),
            SubType::Shared | SubType::KeyShared
        ) {
            let consumers_left = !self.consumers.is_empty();
            self.outstanding.requeue_left_by(key, consumers_left);
        } else {
            self.outstanding.requeue_owned_by(key);
        }
        if self.consumers.is_empty() {
            // Nobody to read ahead for: give the budget back.
            self.ahead.clear();
        }
        if self.consumers.len() == 1 {
            // Alone, it may take every key: its earlier entries wait in
            // replay and go first (Pulsar clears its recently joined
            // consumers when one is left).
            self.consumers.lift_fences(|_| false);
        }
        if self.consumers.has_active_consumer() {
            self.pick_active().await;
        }
    }

    /// Failover/Exclusive: picks the active consumer; entries the previous
    /// one had not acked go to the new one.
    pub(super) async fn pick_active(&mut self) {
        if let Some(previous) = self.consumers.choose_active(self.partition) {
            self.outstanding.requeue_owned_by(previous);
        }
        self.consumers.announce_active().await;
    }

    pub(super) async fn ack(
        &mut self,
        key: ConsumerKey,
        ack_type: AckType,
        ids: Vec<MessageIdData>,
        request_id: Option<u64>,
    ) {
        let mut error: Option<String> = None;
        let cumulative = ack_type == AckType::Cumulative;
        if cumulative
            && matches!(
                self.consumers.sub_type(),
                SubType::Shared | SubType::KeyShared
            )
        {
            error =
                Some("cumulative ack is not allowed on Shared and Key_Shared subscriptions".into());
        } else {
            let last = self.log.last_confirmed();
            for id in &ids {
                let pos = Position::new(id.ledger_id, id.entry_id);
                if last.is_none_or(|last| pos > last) {
                    // As the Java cursor: never mark beyond the last entry
                    // (it would silently ack messages not yet published).
                    error = Some(format!("ack of {pos}, beyond the last entry"));
                    continue;
                }
                if id.ack_set.len() > ACK_SET_WORDS_MAX {
                    error = Some(format!("ack_set of {} words is too long", id.ack_set.len()));
                    continue;
                }
                let ack_set: Vec<u64> = id.ack_set.iter().map(|w| *w as u64).collect();
                let mark_delete_before = self.acks.mark_delete();
                let result = if cumulative {
                    if ack_set.is_empty() {
                        self.acks.ack_cumulative(&self.log, pos)
                    } else {
                        let before = self.log.previous_position(pos);
                        let r = match before {
                            Some(b) => self.acks.ack_cumulative(&self.log, b),
                            None => Ok(()),
                        };
                        r.and_then(|()| self.acks.ack_batch(&self.log, pos, &ack_set))
                    }
                } else if ack_set.is_empty() {
                    self.acks.ack(&self.log, &[pos])
                } else {
                    self.acks.ack_batch(&self.log, pos, &ack_set)
                };
                debug_assert!(
                    self.acks.mark_delete() >= mark_delete_before,
                    "mark-delete position moved back"
                );
                if let Err(e) = result {
                    error = Some(e.to_string());
                }
                if cumulative {
                    let acks = &self.acks;
                    let owners = self.outstanding.acked_through(pos, |p| acks.is_acked(p));
                    for owner in owners {
                        self.unacked_one_less(owner);
                    }
                } else if self.acks.is_acked(pos) {
                    if let Some(owner) = self.outstanding.forget(pos) {
                        self.unacked_one_less(owner);
                    }
                    self.outstanding.unreplay(pos);
                }
            }
        }
        if let Some(message) = &error {
            tracing::info!(topic = %self.topic, subscription = %self.name, error = %message, "ack refused");
        }
        let Some(request_id) = request_id else { return };
        let Some(slot) = self.consumers.get(key) else {
            return;
        };
        // ACK_RESPONSE exists since v17; older clients never set request_id.
        if slot.info.protocol_version < 17 {
            return;
        }
        let response = proto::CommandAckResponse {
            consumer_id: key.1,
            txnid_least_bits: None,
            txnid_most_bits: None,
            error: error.as_ref().map(|_| ServerError::NotAllowedError as i32),
            message: error,
            request_id: Some(request_id),
        };
        let _ = slot.info.out.send(codec::encode_command(response)).await;
    }

    pub(super) fn redeliver(
        &mut self,
        key: ConsumerKey,
        ids: &[MessageIdData],
        epoch: Option<u64>,
    ) {
        if ids.is_empty()
            && let Some(epoch) = epoch
            && let Some(slot) = self.consumers.get_mut(key)
        {
            // Entries stamped with an older epoch are dropped by the client;
            // they are all in `pending` and come again below.
            slot.epoch = Some(slot.epoch.map_or(epoch, |e| e.max(epoch)));
        }
        let positions: Vec<Position> = if ids.is_empty() {
            self.outstanding.owned_by(key)
        } else {
            ids.iter()
                .map(|id| Position::new(id.ledger_id, id.entry_id))
                .filter(|pos| self.outstanding.is_out_to(*pos, key))
                .collect()
        };
        for pos in positions {
            // A position named twice counts twice, as it always has.
            self.outstanding.redeliver(pos);
            self.unacked_one_less(key);
            self.counters.redelivered += 1;
        }
        self.reader.caught_up = false;
    }

    pub(super) async fn seek(&mut self, target: SeekTarget) -> Result<(), ServiceError> {
        let next = resolve_seek(&self.log, target).await?;
        // As the Java broker: disconnect the consumers, then reset.
        self.close_all_consumers(None).await;
        self.acks
            .reset(&self.log, next)
            .await
            .map_err(ServiceError::from)?;
        self.outstanding.clear();
        self.delayed.clear();
        self.ahead.clear();
        self.reader.seek(next);
        tracing::info!(topic = %self.topic, subscription = %self.name, position = %next, "seek");
        Ok(())
    }

    pub(super) async fn close_all_consumers(&mut self, except_reply_for: Option<ConsumerKey>) {
        let slots = self.consumers.detach_all();
        for slot in &slots {
            let key = key_of(&slot.info);
            let _ = slot
                .info
                .events
                .send(ConnEvent::ConsumerClosed(slot.info.consumer_id))
                .await;
            if Some(key) == except_reply_for {
                // The unsubscribing consumer gets SUCCESS, not CLOSE_CONSUMER.
                continue;
            }
            let frame = codec::encode_command(CommandCloseConsumer {
                consumer_id: slot.info.consumer_id,
                request_id: u64::MAX,
                assigned_broker_service_url: None,
                assigned_broker_service_url_tls: None,
            });
            let _ = slot.info.out.send(frame).await;
        }
        self.outstanding.requeue_all();
        self.ahead.clear();
    }
}
