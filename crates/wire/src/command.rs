//! BaseCommand helpers: the table that ties each command type to its
//! sub-message field, `From<CommandX> for BaseCommand` constructors, and the
//! check that a decoded command carries the body its type names.
//!
//! Owns: the type <-> field mapping (field number == type value). Never does
//! I/O or framing.

use crate::metadata::ProtoReader;
use crate::proto::{self, BaseCommand, CommandSend, base_command::Type};

/// Defines, from one table, `From<body> for BaseCommand` (sets `type` and the
/// matching boxed field) and `has_body`.
macro_rules! command_table {
    ($($variant:ident => $field:ident: $body:ident,)*) => {
        $(
            impl From<proto::$body> for BaseCommand {
                fn from(body: proto::$body) -> Self {
                    BaseCommand {
                        r#type: Type::$variant as i32,
                        $field: Some(Box::new(body)),
                        ..BaseCommand::default()
                    }
                }
            }
        )*

        /// True when `command` carries the sub-message that `command_type` names.
        pub fn has_body(command: &BaseCommand, command_type: Type) -> bool {
            match command_type {
                $(Type::$variant => command.$field.is_some(),)*
            }
        }

        /// A command of `command_type` with a default (all-empty) body. Required
        /// scalar fields are zero; useful for tests and for answering.
        pub fn with_default_body(command_type: Type) -> BaseCommand {
            match command_type {
                $(Type::$variant => BaseCommand::from(proto::$body::default()),)*
            }
        }

        /// Number of sub-message fields set in `command` (exactly one in a
        /// well-formed command).
        pub fn body_count(command: &BaseCommand) -> usize {
            let mut count = 0;
            $(count += usize::from(command.$field.is_some());)*
            count
        }
    };
}

command_table! {
Connect => connect: CommandConnect,
Connected => connected: CommandConnected,
Subscribe => subscribe: CommandSubscribe,
Producer => producer: CommandProducer,
Send => send: CommandSend,
SendReceipt => send_receipt: CommandSendReceipt,
SendError => send_error: CommandSendError,
Message => message: CommandMessage,
Ack => ack: CommandAck,
Flow => flow: CommandFlow,
Unsubscribe => unsubscribe: CommandUnsubscribe,
Success => success: CommandSuccess,
Error => error: CommandError,
CloseProducer => close_producer: CommandCloseProducer,
CloseConsumer => close_consumer: CommandCloseConsumer,
ProducerSuccess => producer_success: CommandProducerSuccess,
Ping => ping: CommandPing,
Pong => pong: CommandPong,
RedeliverUnacknowledgedMessages => redeliver_unacknowledged_messages: CommandRedeliverUnacknowledgedMessages,
PartitionedMetadata => partition_metadata: CommandPartitionedTopicMetadata,
PartitionedMetadataResponse => partition_metadata_response: CommandPartitionedTopicMetadataResponse,
Lookup => lookup_topic: CommandLookupTopic,
LookupResponse => lookup_topic_response: CommandLookupTopicResponse,
ConsumerStats => consumer_stats: CommandConsumerStats,
ConsumerStatsResponse => consumer_stats_response: CommandConsumerStatsResponse,
ReachedEndOfTopic => reached_end_of_topic: CommandReachedEndOfTopic,
Seek => seek: CommandSeek,
GetLastMessageId => get_last_message_id: CommandGetLastMessageId,
GetLastMessageIdResponse => get_last_message_id_response: CommandGetLastMessageIdResponse,
ActiveConsumerChange => active_consumer_change: CommandActiveConsumerChange,
GetTopicsOfNamespace => get_topics_of_namespace: CommandGetTopicsOfNamespace,
GetTopicsOfNamespaceResponse => get_topics_of_namespace_response: CommandGetTopicsOfNamespaceResponse,
GetSchema => get_schema: CommandGetSchema,
GetSchemaResponse => get_schema_response: CommandGetSchemaResponse,
AuthChallenge => auth_challenge: CommandAuthChallenge,
AuthResponse => auth_response: CommandAuthResponse,
AckResponse => ack_response: CommandAckResponse,
GetOrCreateSchema => get_or_create_schema: CommandGetOrCreateSchema,
GetOrCreateSchemaResponse => get_or_create_schema_response: CommandGetOrCreateSchemaResponse,
NewTxn => new_txn: CommandNewTxn,
NewTxnResponse => new_txn_response: CommandNewTxnResponse,
AddPartitionToTxn => add_partition_to_txn: CommandAddPartitionToTxn,
AddPartitionToTxnResponse => add_partition_to_txn_response: CommandAddPartitionToTxnResponse,
AddSubscriptionToTxn => add_subscription_to_txn: CommandAddSubscriptionToTxn,
AddSubscriptionToTxnResponse => add_subscription_to_txn_response: CommandAddSubscriptionToTxnResponse,
EndTxn => end_txn: CommandEndTxn,
EndTxnResponse => end_txn_response: CommandEndTxnResponse,
EndTxnOnPartition => end_txn_on_partition: CommandEndTxnOnPartition,
EndTxnOnPartitionResponse => end_txn_on_partition_response: CommandEndTxnOnPartitionResponse,
EndTxnOnSubscription => end_txn_on_subscription: CommandEndTxnOnSubscription,
EndTxnOnSubscriptionResponse => end_txn_on_subscription_response: CommandEndTxnOnSubscriptionResponse,
TcClientConnectRequest => tc_client_connect_request: CommandTcClientConnectRequest,
TcClientConnectResponse => tc_client_connect_response: CommandTcClientConnectResponse,
WatchTopicList => watch_topic_list: CommandWatchTopicList,
WatchTopicListSuccess => watch_topic_list_success: CommandWatchTopicListSuccess,
WatchTopicUpdate => watch_topic_update: CommandWatchTopicUpdate,
WatchTopicListClose => watch_topic_list_close: CommandWatchTopicListClose,
TopicMigrated => topic_migrated: CommandTopicMigrated,}

/// The command's type, or `None` when the `type` value is not one we know.
pub fn command_type(command: &BaseCommand) -> Option<Type> {
    Type::try_from(command.r#type).ok()
}

/// Parses a `BaseCommand { type: SEND, send: CommandSend }` without prost.
///
/// Returns `None`, and the caller falls back to prost, for anything else:
/// another command, a field outside fields 1..=8 of CommandSend (e.g. the
/// shadow-topic message_id), an unexpected wire type, or malformed bytes.
/// For every input it accepts, the result equals prost's (later occurrences
/// of a field win, int32 is the truncated varint, bool is `!= 0`).
pub(crate) fn decode_send_fast(bytes: &[u8]) -> Option<BaseCommand> {
    const WIRE_VARINT: u32 = 0;
    const WIRE_LEN: u32 = 2;
    let mut reader = ProtoReader::new(bytes, "BaseCommand");
    let mut command_type = None;
    let mut send: Option<CommandSend> = None;
    while !reader.is_empty() {
        match reader.tag().ok()? {
            (1, WIRE_VARINT) => command_type = Some(reader.varint().ok()? as i32),
            (6, WIRE_LEN) => {
                let (start, end) = reader.len_delimited().ok()?;
                // prost merges repeated occurrences of a message field.
                let body = send.get_or_insert_with(CommandSend::default);
                merge_send_fast(bytes.get(start..end)?, body)?;
            }
            _ => return None,
        }
    }
    if command_type != Some(Type::Send as i32) {
        return None;
    }
    Some(BaseCommand {
        r#type: Type::Send as i32,
        send: send.map(Box::new),
        ..BaseCommand::default()
    })
}

fn merge_send_fast(bytes: &[u8], send: &mut CommandSend) -> Option<()> {
    const WIRE_VARINT: u32 = 0;
    let mut reader = ProtoReader::new(bytes, "CommandSend");
    while !reader.is_empty() {
        let (field, wire_type) = reader.tag().ok()?;
        if wire_type != WIRE_VARINT {
            return None;
        }
        let value = reader.varint().ok()?;
        match field {
            1 => send.producer_id = value,
            2 => send.sequence_id = value,
            3 => send.num_messages = Some(value as i32),
            4 => send.txnid_least_bits = Some(value),
            5 => send.txnid_most_bits = Some(value),
            6 => send.highest_sequence_id = Some(value),
            7 => send.is_chunk = Some(value != 0),
            8 => send.marker = Some(value != 0),
            _ => return None,
        }
    }
    Some(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn fast_send_parser_matches_prost() {
        use prost::Message;
        let send = CommandSend {
            producer_id: u64::MAX,
            sequence_id: 1 << 40,
            num_messages: Some(-1),
            txnid_least_bits: Some(3),
            txnid_most_bits: Some(4),
            highest_sequence_id: Some(5),
            is_chunk: Some(true),
            marker: Some(false),
            message_id: None,
        };
        let command = BaseCommand::from(send.clone());
        let bytes = command.encode_to_vec();
        assert_eq!(decode_send_fast(&bytes), Some(command));
        // Falls back (None) for what it does not handle.
        let with_message_id = BaseCommand::from(CommandSend {
            message_id: Some(proto::MessageIdData::default()),
            ..send
        });
        assert_eq!(decode_send_fast(&with_message_id.encode_to_vec()), None);
        assert_eq!(
            decode_send_fast(&BaseCommand::from(proto::CommandPing {}).encode_to_vec()),
            None
        );
        assert_eq!(decode_send_fast(&[0x08]), None);
        // Type SEND without the body: prost's answer (no body) is kept.
        assert_eq!(
            decode_send_fast(&[0x08, 0x06]),
            Some(BaseCommand {
                r#type: 6,
                ..Default::default()
            })
        );
    }

    #[test]
    fn from_sets_type_and_body() {
        let command = BaseCommand::from(proto::CommandPing {});
        assert_eq!(command.r#type, Type::Ping as i32);
        assert!(has_body(&command, Type::Ping));
        assert!(!has_body(&command, Type::Pong));
        assert_eq!(body_count(&command), 1);
    }

    #[test]
    fn every_type_round_trips_through_its_body_field() {
        // Field number == type value: the table must agree for every type.
        let mut value = 0;
        while value < 128 {
            if let Ok(command_type) = Type::try_from(value) {
                let mut command = BaseCommand {
                    r#type: value,
                    ..BaseCommand::default()
                };
                assert!(!has_body(&command, command_type));
                command = with_default_body(command_type);
                assert!(has_body(&command, command_type), "{command_type:?}");
                assert_eq!(body_count(&command), 1);
            }
            value += 1;
        }
    }
}
