//! Commands: [`Command`] (what the frame decoder hands out: SEND compact,
//! the rest as prost's BaseCommand), `decode_command`, and BaseCommand
//! helpers: the table that ties each command type to its sub-message field,
//! `From<CommandX> for BaseCommand` constructors, and the check that a
//! decoded command carries the body its type names.
//!
//! Owns: the type <-> field mapping (field number == type value), which
//! decoder (scanner or prost) reads a command. Never does I/O or framing.

use prost::Message;

use crate::error::WireError;
use crate::proto::{self, BaseCommand, base_command::Type};
use crate::send::{self, SendCommand};

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

/// A decoded command: SEND in its compact form, everything else as prost's
/// BaseCommand.
///
/// The decoder guarantees: every SEND is `Send` (also the rare ones the
/// scanner leaves to prost), `Other` holds a command whose `type` is known
/// and whose sub-message is present, and never a SEND.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// SEND, read by the hand-written scanner (the hot command).
    Send(SendCommand),
    /// Every other command, decoded by prost. Boxed: BaseCommand is ~470
    /// bytes and a frame should stay cheap to move.
    Other(Box<BaseCommand>),
}

impl Command {
    /// The command type; `None` only if an `Other` command's `type` was set
    /// to an unknown value after decoding.
    pub fn command_type(&self) -> Option<Type> {
        match self {
            Command::Send(_) => Some(Type::Send),
            Command::Other(command) => command_type(command),
        }
    }

    /// The SEND, if this is one.
    #[inline]
    pub fn as_send(&self) -> Option<&SendCommand> {
        match self {
            Command::Send(send) => Some(send),
            Command::Other(_) => None,
        }
    }

    /// The prost command, for every command but SEND.
    pub fn as_other(&self) -> Option<&BaseCommand> {
        match self {
            Command::Send(_) => None,
            Command::Other(command) => Some(command),
        }
    }

    /// The command as prost's BaseCommand (for encoding, or code that reads
    /// commands other than SEND). Copies: `into_base_command` moves.
    pub fn to_base_command(&self) -> BaseCommand {
        match self {
            Command::Send(send) => BaseCommand::from(*send),
            Command::Other(command) => BaseCommand::clone(command),
        }
    }

    /// The command as prost's BaseCommand, without copying an `Other`.
    pub fn into_base_command(self) -> BaseCommand {
        match self {
            Command::Send(send) => BaseCommand::from(send),
            Command::Other(command) => *command,
        }
    }
}

impl From<Command> for BaseCommand {
    fn from(command: Command) -> Self {
        command.into_base_command()
    }
}

impl From<SendCommand> for Command {
    fn from(send: SendCommand) -> Self {
        Command::Send(send)
    }
}

impl From<BaseCommand> for Command {
    /// A SEND with its body becomes `Send` (dropping `message_id`, see
    /// [`SendCommand`]), anything else `Other`, as the decoder does.
    fn from(command: BaseCommand) -> Self {
        match (command_type(&command), command.send.as_deref()) {
            (Some(Type::Send), Some(send)) => Command::Send(SendCommand::from(send)),
            _ => Command::Other(Box::new(command)),
        }
    }
}

impl PartialEq<BaseCommand> for Command {
    /// Equal when the command, as a BaseCommand, equals `other` (a `Send`
    /// equals the SEND with the same fields and no `message_id`).
    fn eq(&self, other: &BaseCommand) -> bool {
        match self {
            Command::Send(send) => {
                other.r#type == Type::Send as i32
                    && other.send.as_deref() == Some(&send.to_command_send())
                    && body_count(other) == 1
            }
            Command::Other(command) => **command == *other,
        }
    }
}

/// Decodes BaseCommand bytes: SEND by the scanner, everything else (and any
/// SEND the scanner leaves alone) by prost. Checks that the type is known and
/// its sub-message present, and returns that type too. Errors:
/// [`WireError::Protobuf`], [`WireError::UnknownCommandType`],
/// [`WireError::MissingCommandBody`]. (The frame decoder's SEND fast path
/// calls the scanner itself; this is the general path's.)
pub(crate) fn decode_command(bytes: &[u8]) -> Result<(Command, Type), WireError> {
    if let Some(send) = send::scan_send(bytes) {
        // Tests run with debug assertions: every SEND they decode is checked
        // against prost.
        debug_assert_eq!(
            BaseCommand::decode(bytes)
                .ok()
                .as_ref()
                .and_then(|command| command.send.as_deref())
                .map(SendCommand::from),
            Some(send)
        );
        return Ok((Command::Send(send), Type::Send));
    }
    decode_command_prost(bytes)
}

#[cold]
fn decode_command_prost(bytes: &[u8]) -> Result<(Command, Type), WireError> {
    let command = BaseCommand::decode(bytes).map_err(WireError::protobuf("BaseCommand"))?;
    let Some(command_type) = command_type(&command) else {
        return Err(WireError::UnknownCommandType {
            value: command.r#type,
        });
    };
    if !has_body(&command, command_type) {
        return Err(WireError::MissingCommandBody { command_type });
    }
    Ok((Command::from(command), command_type))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
