//! Admin operations on a topic's subscriptions (pulsar-admin `topics
//! create-subscription`, `reset-cursor`, `skip`, `clear-backlog`,
//! `expire-messages`) and the backlog eviction and message expiry of the
//! lifecycle pass.
//!
//! A subscription with a running task (consumers attached, or a reader) is
//! changed by that task, so its dispatch state follows; a durable one
//! without consumers through its cursor directly.
//! Owns: [`SubscriptionStart`] and these `Topic` methods. Never: moves a
//! running subscription's cursor behind its task's back.

use vela_log::{CursorStart, Position};

use super::Topic;
use super::subscriptions::subscription_closing;
use crate::error::{AdminError, ServiceError};
use crate::subscription::{SeekTarget, SubCommand, first_published_at_or_after, resolve_seek};

/// Where an admin-created subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SubscriptionStart {
    /// Before the oldest entry.
    Earliest,
    /// After the newest entry.
    Latest,
    /// At this entry (it is the first delivered).
    At(Position),
}

impl Topic {
    fn not_found(&self, name: &str) -> AdminError {
        AdminError::NotFound(format!(
            "Subscription {name} not found for topic {}",
            self.full_name
        ))
    }

    /// A PRODUCER's `initial_subscription_name`: creates the subscription at
    /// the earliest entry unless it exists; refused when the topic's
    /// policies forbid creating subscriptions automatically.
    pub(crate) async fn create_initial_subscription(&self, name: &str) -> Result<(), ServiceError> {
        if self.subscription_names().iter().any(|n| n == name) {
            return Ok(());
        }
        if self.lifecycle_policies().limits.auto_subscription_creation == Some(false) {
            return Err(ServiceError::new(
                vela_wire::proto::ServerError::NotAllowedError,
                "Could not create the initial subscription due to the auto subscription creation \
                 is not allowed.",
            ));
        }
        match self
            .create_subscription(name, SubscriptionStart::Earliest)
            .await
        {
            Ok(()) | Err(AdminError::Exists(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Creates a durable subscription (its cursor) without a consumer.
    pub(crate) async fn create_subscription(
        &self,
        name: &str,
        start: SubscriptionStart,
    ) -> Result<(), AdminError> {
        if name.is_empty() {
            return Err(AdminError::BadRequest("empty subscription name".into()));
        }
        if self.subscription_names().iter().any(|n| n == name) {
            return Err(AdminError::Exists(format!(
                "Subscription {name} for topic {}",
                self.full_name
            )));
        }
        let cursor_start = match start {
            SubscriptionStart::Earliest => CursorStart::Earliest,
            SubscriptionStart::Latest | SubscriptionStart::At(_) => CursorStart::Latest,
        };
        let cursor = self
            .log
            .open_cursor(name, cursor_start)
            .await
            .map_err(ServiceError::from)?;
        if let SubscriptionStart::At(position) = start {
            let target = SeekTarget::MessageId {
                ledger_id: position.ledger_id,
                entry_id: position.entry_id,
            };
            let next = resolve_seek(&self.log, target).await?;
            cursor.reset(next).await.map_err(ServiceError::from)?;
        }
        Ok(())
    }

    /// Moves a subscription to `target` (its consumers are disconnected and
    /// re-attach there, as on SEEK).
    pub(crate) async fn reset_cursor(
        &self,
        name: &str,
        target: SeekTarget,
    ) -> Result<(), AdminError> {
        match self
            .subscriptions
            .ask_live(name, |reply| SubCommand::Seek { target, reply })
            .await
        {
            Some(Some(result)) => return Ok(result?),
            Some(None) => return Err(subscription_closing().into()),
            None => {}
        }
        let Some(cursor) = self.log.cursor(name) else {
            return Err(self.not_found(name));
        };
        let next = resolve_seek(&self.log, target).await?;
        cursor.reset(next).await.map_err(ServiceError::from)?;
        tracing::info!(topic = %self.full_name, subscription = name, position = %next, "cursor reset");
        Ok(())
    }

    /// The subscription's mark-delete position (`Ok(None)`: nothing acked).
    async fn mark_delete_of(&self, name: &str) -> Result<Option<Position>, AdminError> {
        if let Some(Some(position)) = self
            .subscriptions
            .ask_live(name, |reply| SubCommand::MarkDelete { reply })
            .await
        {
            return Ok(position);
        }
        match self.log.cursor(name) {
            Some(cursor) => Ok(cursor.mark_delete_position()),
            None => Err(self.not_found(name)),
        }
    }

    /// Acknowledges everything up to `position`.
    async fn ack_up_to(
        &self,
        name: &str,
        position: Position,
        expired: bool,
    ) -> Result<(), AdminError> {
        let command = |reply| SubCommand::AckUpTo {
            position,
            expired,
            reply,
        };
        match self.subscriptions.ask_live(name, command).await {
            Some(Some(result)) => return Ok(result?),
            Some(None) => return Err(subscription_closing().into()),
            None => {}
        }
        let Some(cursor) = self.log.cursor(name) else {
            return Err(self.not_found(name));
        };
        cursor
            .ack_cumulative(position)
            .map_err(ServiceError::from)?;
        Ok(())
    }

    /// Skips `count` entries after the mark-delete position (`None`: the
    /// whole backlog, pulsar-admin `clear-backlog`). Entries acknowledged
    /// individually in that range count among the skipped ones.
    pub(crate) async fn skip(&self, name: &str, count: Option<u64>) -> Result<(), AdminError> {
        let mark_delete = self.mark_delete_of(name).await?;
        let Some(last) = self.log.last_confirmed() else {
            return Ok(());
        };
        let target = match count {
            None => last,
            Some(0) => return Ok(()),
            Some(count) => self.log.position_after(mark_delete, count).unwrap_or(last),
        };
        if Some(target) <= mark_delete {
            return Ok(());
        }
        self.ack_up_to(name, target, false).await?;
        tracing::info!(topic = %self.full_name, subscription = name, up_to = %target, "skipped entries");
        Ok(())
    }

    /// Backlog eviction (quota): acknowledges everything up to `target`.
    pub(crate) async fn evict_up_to(&self, name: &str, target: Position) -> Result<(), AdminError> {
        let mark_delete = self.mark_delete_of(name).await?;
        if Some(target) <= mark_delete {
            return Ok(());
        }
        self.ack_up_to(name, target, false).await
    }

    /// Acknowledges every entry published more than `age` ago.
    pub(crate) async fn expire(
        &self,
        name: &str,
        age: std::time::Duration,
    ) -> Result<(), AdminError> {
        let mark_delete = self.mark_delete_of(name).await?;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let cutoff_ms = now_ms.saturating_sub(age.as_millis() as u64);
        let first_kept = first_published_at_or_after(&self.log, cutoff_ms)
            .await
            .map_err(ServiceError::from)?;
        let Some(target) = self.log.previous_position(first_kept) else {
            return Ok(());
        };
        if Some(target) <= mark_delete {
            return Ok(());
        }
        self.ack_up_to(name, target, true).await?;
        tracing::info!(topic = %self.full_name, subscription = name, up_to = %target, "expired entries");
        Ok(())
    }
}
