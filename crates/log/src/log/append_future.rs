//! `AppendFuture`: what `ManagedLog::append` returns.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::error::LogError;
use crate::position::Position;

/// Future of one append: the entry's position once durable.
#[derive(Debug)]
pub struct AppendFuture {
    pub(super) receiver: oneshot::Receiver<Result<Position, LogError>>,
    pub(super) refused: bool,
}

impl AppendFuture {
    /// True when the log refused the append at once (`EntryTooLarge`,
    /// `Overloaded`, or the log had stopped): the entry is not and never
    /// will be in the log, and the future resolves to why. False when the
    /// append was queued (it may still fail later, stopping the log).
    pub fn is_refused(&self) -> bool {
        self.refused
    }
}

impl Future for AppendFuture {
    type Output = Result<Position, LogError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.receiver).poll(cx).map(|result| {
            result
                .unwrap_or_else(|_| Err(LogError::Closed("append dropped by the log".to_string())))
        })
    }
}
