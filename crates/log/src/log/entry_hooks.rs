//! Wake-on-append hooks: a task that is not running (a parked
//! subscription) asks to be woken once an entry at or after a position is
//! confirmed, instead of keeping a task waiting in
//! `ManagedLog::wait_for_entry_at`.
//!
//! Owns: [`EntryHooks`] (one per log: the hooks registered, at most one per
//! [`EntryWaiter`]) and [`EntryWaiter`] (a registration handle; dropping it
//! cancels its hook).
//! Guarantees: a hook is called at most once, outside every lock of the
//! log, after the entry it waits for is confirmed (the log's last
//! confirmed position is set before hooks are looked at) or once the log
//! stopped taking appends (closed, failed, terminated); so a waiter that
//! registers, then reads `ManagedLog::last_confirmed` / `is_closed`, either
//! sees the entry (or the stop) or is woken by it.
//! Never: calls a hook under its lock, or keeps more than one hook per
//! waiter (a new registration replaces the waiter's previous one).

use std::sync::Weak;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::Shared;
use crate::position::Position;

/// What a hook does: wake its task (e.g. `vela_mailbox::Parking::wake`).
pub type EntryHook = Box<dyn FnOnce() + Send>;

/// Waiter ids, unique in the process (a waiter's hook is found by it).
static NEXT_WAITER_ID: AtomicU64 = AtomicU64::new(1);

struct Registered {
    waiter_id: u64,
    from: Position,
    hook: EntryHook,
}

/// A log's hooks.
#[derive(Default)]
pub(crate) struct EntryHooks {
    registered: Mutex<Vec<Registered>>,
}

impl EntryHooks {
    /// Registers (or replaces) `waiter_id`'s hook.
    fn set(&self, waiter_id: u64, from: Position, hook: EntryHook) {
        let replaced = {
            let mut registered = self.registered.lock();
            match registered.iter_mut().find(|r| r.waiter_id == waiter_id) {
                Some(existing) => {
                    existing.from = from;
                    Some(std::mem::replace(&mut existing.hook, hook))
                }
                None => {
                    // One hook per parked subscription, and a log has few:
                    // no spare slots (the default growth keeps four).
                    registered.reserve_exact(1);
                    registered.push(Registered {
                        waiter_id,
                        from,
                        hook,
                    });
                    None
                }
            }
        };
        // Dropped outside the lock: a hook's drop may release anything.
        drop(replaced);
    }

    /// Removes `waiter_id`'s hook, if any, without calling it.
    fn cancel(&self, waiter_id: u64) {
        let removed = {
            let mut registered = self.registered.lock();
            let found = registered.iter().position(|r| r.waiter_id == waiter_id);
            let removed = found.map(|index| registered.swap_remove(index));
            if registered.is_empty() {
                registered.shrink_to_fit();
            }
            removed
        };
        drop(removed);
    }

    /// `position` was confirmed (and is the log's last confirmed position
    /// already): calls the hooks waiting for it or an earlier one.
    pub(crate) fn confirmed(&self, position: Position) {
        self.call(|registered| registered.from <= position);
    }

    /// The log stopped taking appends: calls every hook.
    pub(crate) fn stopped(&self) {
        self.call(|_| true);
    }

    fn call(&self, due: impl Fn(&Registered) -> bool) {
        let fired: Vec<Registered> = {
            let mut registered = self.registered.lock();
            if !registered.iter().any(&due) {
                return;
            }
            let (fired, kept) = std::mem::take(&mut *registered)
                .into_iter()
                .partition(|r| due(r));
            *registered = kept;
            if registered.is_empty() {
                registered.shrink_to_fit();
            }
            fired
        };
        for registered in fired {
            (registered.hook)();
        }
    }

    /// Hooks registered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.registered.lock().len()
    }
}

/// A registration handle for one task's wake-on-append hook
/// (`ManagedLog::entry_waiter`): at most one hook at a time; dropping the
/// handle cancels it.
pub struct EntryWaiter {
    log: Weak<Shared>,
    id: u64,
}

impl std::fmt::Debug for EntryWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryWaiter").field("id", &self.id).finish()
    }
}

impl EntryWaiter {
    pub(crate) fn new(log: Weak<Shared>) -> EntryWaiter {
        EntryWaiter {
            log,
            id: NEXT_WAITER_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Calls `hook` once, when an entry at or after `from` is confirmed or
    /// the log stops taking appends; replaces this waiter's previous hook.
    /// An entry confirmed (or a stop) before this call does not call it:
    /// register, then look at `last_confirmed` / `is_closed`.
    pub fn wake_at(&self, from: Position, hook: EntryHook) {
        if let Some(log) = self.log.upgrade() {
            log.entry_hooks.set(self.id, from, hook);
        }
    }

    /// Removes this waiter's hook, if any.
    pub fn cancel(&self) {
        if let Some(log) = self.log.upgrade() {
            log.entry_hooks.cancel(self.id);
        }
    }
}

impl Drop for EntryWaiter {
    fn drop(&mut self) {
        self.cancel();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    fn counting(count: &Arc<AtomicUsize>) -> EntryHook {
        let count = Arc::clone(count);
        Box::new(move || {
            count.fetch_add(1, Ordering::Relaxed);
        })
    }

    #[test]
    fn a_hook_fires_once_at_its_position_and_a_new_one_replaces_it() {
        let hooks = EntryHooks::default();
        let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        hooks.set(1, Position::new(3, 5), counting(&a));
        hooks.set(2, Position::new(3, 2), counting(&b));
        hooks.confirmed(Position::new(3, 4));
        assert_eq!(
            (a.load(Ordering::Relaxed), b.load(Ordering::Relaxed)),
            (0, 1)
        );
        // Replaced: the first hook of waiter 1 is never called.
        let c = Arc::new(AtomicUsize::new(0));
        hooks.set(1, Position::new(3, 6), counting(&c));
        assert_eq!(hooks.len(), 1);
        hooks.confirmed(Position::new(3, 5));
        assert_eq!(c.load(Ordering::Relaxed), 0);
        hooks.confirmed(Position::new(4, 0));
        hooks.confirmed(Position::new(4, 1));
        assert_eq!(
            (a.load(Ordering::Relaxed), c.load(Ordering::Relaxed)),
            (0, 1)
        );
        assert_eq!(hooks.len(), 0);
    }

    #[test]
    fn a_stop_fires_every_hook_and_a_cancelled_one_never_fires() {
        let hooks = EntryHooks::default();
        let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        hooks.set(1, Position::new(9, 0), counting(&a));
        hooks.set(2, Position::new(9, 0), counting(&b));
        hooks.cancel(2);
        hooks.stopped();
        assert_eq!(
            (a.load(Ordering::Relaxed), b.load(Ordering::Relaxed)),
            (1, 0)
        );
    }
}
