//! The subscription task's statistics snapshot (admin stats, `/metrics`).
//! Never: changes the subscription.

use super::Dispatcher;
use crate::stats::{ConsumerStats, SubscriptionStats};

impl Dispatcher {
    pub(super) fn stats(&mut self) -> SubscriptionStats {
        let counters = &mut self.counters;
        let [msg_rate_out, msg_throughput_out, msg_rate_redeliver] = counters.rates.rates(
            std::time::Instant::now(),
            [counters.msg_out, counters.bytes_out, counters.redelivered],
        );
        // Pulsar's names are the protocol's enum names.
        let sub_type = self.consumers.sub_type().as_str_name();
        SubscriptionStats {
            name: self.name.clone(),
            sub_type: sub_type.to_string(),
            durable: self.durable,
            // The topic's snapshot adds them (`Topic::stats`).
            replicated: false,
            cursor_properties: Default::default(),
            msg_backlog: self.acks.backlog(&self.log),
            unacked_messages: self.outstanding.pending_len() as u64,
            msg_out_counter: self.counters.msg_out,
            bytes_out_counter: self.counters.bytes_out,
            msg_redeliver_counter: self.counters.redelivered,
            msg_rate_out,
            msg_throughput_out,
            msg_rate_redeliver,
            msg_expired_counter: self.counters.expired,
            mark_delete: self.acks.mark_delete(),
            read_position: Some(self.reader.position()),
            msg_in_replay: self.outstanding.replay_len() as u64,
            read_in_flight: self.ahead.in_flight(),
            waiting_for_entries: self.reader.caught_up,
            consumers: self
                .consumers
                .iter()
                .map(|slot| ConsumerStats {
                    consumer_name: slot.info.name.clone(),
                    available_permits: slot.permits,
                    unacked_messages: slot.unacked,
                    msg_out_counter: slot.msg_out,
                    address: slot.info.address.to_string(),
                    client_version: slot.info.client_version.to_string(),
                    last_flow_ms: slot.last_flow_ms,
                    metadata: slot.info.metadata.clone(),
                    joined_fence: slot.fence,
                })
                .collect(),
            active_consumer: self.consumers.active_name(),
            msg_drop_rate: None,
            msg_drop_counter: 0,
        }
    }
}
