//! The writer thread: drains the append queue in groups (flush when idle or
//! at the batch byte limit), encodes each group into one aligned block,
//! writes it, and hands it to the force-write thread (or syncs and completes
//! it itself at depth 1); rotates to the next file at the size limit.
//!
//! Owns: the write offset and the group buffer. See `shared` for the access
//! rules it keeps with the other threads.
//! Never: fsyncs a group while the force-write thread has one (callbacks
//! stay in append order), writes into a range the preallocator claimed, or
//! retries a failed write (the journal turns broken).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

use super::error::JournalError;
use super::file::{AlignedBuf, JournalFile};
use super::force::sync_and_complete;
use super::format::{self};
use super::prealloc::{file_cap, install_file};
use super::shared::{ForceItem, GroupTimes, Pending, Shared, WriterWait};
use crate::mark::JournalMark;

/// The writer's own state.
struct Writer {
    shared: Arc<Shared>,
    to_force: SyncSender<ForceItem>,
    file_id: u64,
    file: Arc<dyn JournalFile>,
    offset: u64,
    buf: AlignedBuf,
    /// The one group the writer syncs itself (`sync_inline`), kept to reuse
    /// its allocation: empty between groups.
    inline_batch: Vec<ForceItem>,
}

pub(crate) fn run_writer(
    shared: Arc<Shared>,
    to_force: SyncSender<ForceItem>,
    file_id: u64,
    file: Arc<dyn JournalFile>,
) {
    let offset = shared.config.data_offset();
    let alignment = shared.config.alignment_bytes;
    let mut writer = Writer {
        shared,
        to_force,
        file_id,
        file,
        offset,
        buf: AlignedBuf::zeroed(alignment.max(64 << 10), alignment),
        inline_batch: Vec::with_capacity(1),
    };
    while let Some(group) = writer.gather() {
        writer.write_group(group);
    }
    writer.close();
}

impl Writer {
    /// Takes the next group from the queue, per the policy: at least one record;
    /// more while they are queued, until `group_bytes_max`; when the queue runs
    /// empty, flush at once if `flush_when_queue_empty` and the force-write thread
    /// is idle, else wait for more records (or for the force-write thread) until
    /// the oldest record has waited `group_wait_max`. `None` when closed and
    /// drained.
    fn gather(&mut self) -> Option<Vec<Pending>> {
        let config = &self.shared.config;
        let mut queue = self.shared.lock_queue();
        while queue.items.is_empty() {
            if queue.closed {
                return None;
            }
            queue.writer_waits_for = WriterWait::Records;
            queue = self
                .shared
                .queue_cv
                .wait(queue)
                .unwrap_or_else(|p| p.into_inner());
        }
        queue.writer_waits_for = WriterWait::Nothing;
        let mut group = Vec::new();
        let mut bytes = 0usize;
        let deadline = queue
            .items
            .front()
            .map(|p| p.enqueued + config.group_wait_max);
        loop {
            while let Some(p) = queue.items.pop_front() {
                let len = p.record.encoded_len();
                queue.bytes -= len;
                bytes += len;
                group.push(p);
                if bytes >= config.group_bytes_max {
                    return Some(group);
                }
            }
            if queue.closed {
                return Some(group);
            }
            // Flush when the queue is empty, but only once the force-write thread
            // can take the group: while it syncs, writing now would not make the
            // records durable any sooner, and waiting lets the group grow (fewer
            // writes and less padding under load; no delay at depth 1).
            if config.flush_when_queue_empty
                && self.shared.force_pending.load(Ordering::SeqCst) == 0
            {
                return Some(group);
            }
            let now = Instant::now();
            let Some(deadline) = deadline.filter(|d| *d > now) else {
                return Some(group);
            };
            queue.writer_waits_for = WriterWait::Bytes(config.group_bytes_max - bytes);
            let (q, _) = self
                .shared
                .queue_cv
                .wait_timeout(queue, deadline - now)
                .unwrap_or_else(|p| p.into_inner());
            queue = q;
            queue.writer_waits_for = WriterWait::Nothing;
        }
    }

    fn send(&self, item: ForceItem) {
        // The force-write thread only exits after `Stop`, which the writer sends
        // last; a send error means it panicked, and then waiters are dropped.
        let _ = self.to_force.send(item);
    }

    fn fail_group(&self, group: Vec<Pending>, error: JournalError) {
        self.send(ForceItem::Failed {
            waiters: group.into_iter().map(|p| p.done).collect(),
            error,
        });
    }

    fn write_group(&mut self, group: Vec<Pending>) {
        if self.shared.is_broken() {
            let error = self.shared.broken_error();
            self.fail_group(group, error);
            return;
        }
        let taken = Instant::now();
        let oldest = group.first().map(|p| p.enqueued);
        let align = self.shared.config.alignment_bytes as u64;
        // Groups start on a block: none rewrites a block holding acked bytes.
        debug_assert!(self.offset.is_multiple_of(align));
        let records_len: usize = group.iter().map(|p| p.record.encoded_len()).sum();
        let padding = format::padding_len(self.offset + records_len as u64, align);
        let total = records_len + padding;
        debug_assert!(total as u64 <= self.shared.config.group_len_max());
        // Keep one block free at the end of every file for its FileEnd record.
        let mut roll = Duration::ZERO;
        if self.offset + total as u64 + align > file_cap(&self.shared.config) {
            let rolling = Instant::now();
            if let Err(e) = self.rotate() {
                self.shared.fail(&e);
                self.fail_group(group, e);
                return;
            }
            roll = rolling.elapsed();
            // The group waits for this (ARCHITECTURE.md "Periodic work").
            tracing::debug!(
                target: "vela::periodic",
                kind = "journal_roll",
                elapsed_us = roll.as_micros() as u64,
                file_id = self.file_id,
                "journal file rolled"
            );
        }
        let reserving = Instant::now();
        if let Err(e) = self.reserve_space(self.offset + total as u64) {
            self.fail_group(group, e);
            return;
        }
        let reserve_wait = reserving.elapsed();
        // Encode.
        self.buf.reset_zeroed(total);
        let out = self.buf.as_mut_slice();
        let mut at = 0usize;
        let mut waiters = Vec::with_capacity(group.len());
        for p in group {
            let len = format::encode_record(&p.record, self.file_id, &mut out[at..]);
            at += len;
            let mark = JournalMark {
                file_id: self.file_id,
                offset: self.offset + at as u64,
            };
            waiters.push((p.done, mark));
        }
        if padding > 0 {
            format::encode_padding(padding, self.file_id, &mut out[at..]);
        }
        debug_assert_eq!(at + padding, total);
        debug_assert!((self.offset + total as u64).is_multiple_of(align));
        #[cfg(debug_assertions)]
        check_group(
            &self.shared.config,
            self.file_id,
            self.buf.as_slice(),
            waiters.len(),
        );
        let started = Instant::now();
        if let Err(e) = self.file.write_at(self.buf.as_slice(), self.offset) {
            let e = JournalError::io("pwrite", self.file.path(), e);
            self.shared.fail(&e);
            self.send(ForceItem::Failed {
                waiters: waiters.into_iter().map(|(done, _)| done).collect(),
                error: e,
            });
            return;
        }
        let written_at = Instant::now();
        let write_time = written_at.saturating_duration_since(started);
        let entries = waiters.len();
        self.offset += total as u64;
        self.publish_offset(total as u64);
        let queue_wait = oldest
            .map(|t| taken.saturating_duration_since(t))
            .unwrap_or_default();
        self.shared
            .stats
            .record_group(queue_wait, write_time, entries, total);
        let written = ForceItem::Written {
            file: self.file.clone(),
            end_mark: JournalMark {
                file_id: self.file_id,
                offset: self.offset,
            },
            waiters,
            oldest_enqueued: oldest,
            times: Some(GroupTimes {
                taken,
                roll,
                reserve_wait,
                write_started: started,
                written: written_at,
            }),
        };
        if self.sync_inline() {
            // Nothing to pipeline with: handing over would only add a thread
            // wake-up (tens of µs on an idle machine) to this group's latency.
            self.inline_batch.push(written);
            sync_and_complete(&self.shared, &mut self.inline_batch, written_at);
        } else {
            self.shared.force_pending.fetch_add(1, Ordering::SeqCst);
            self.send(written);
        }
    }

    /// Whether the writer syncs and completes the group it just wrote itself:
    /// when the force-write thread has nothing pending (so completions stay in
    /// append order) and no record is queued (so there is no next group to
    /// gather while this one syncs). That is the depth-1 case; under load the
    /// groups go to the force-write thread and the two threads pipeline.
    fn sync_inline(&self) -> bool {
        if self.shared.force_pending.load(Ordering::SeqCst) != 0 {
            return false;
        }
        self.shared.lock_queue().items.is_empty()
    }

    fn publish_offset(&self, group_bytes: u64) {
        let chunk = self.shared.config.prealloc_chunk_bytes;
        let mut space = self.shared.lock_space();
        space.writer_offset = self.offset;
        space.written_bytes_total += group_bytes;
        if space.allocated_end < self.offset + 2 * chunk {
            self.shared.space_cv.notify_all();
        }
    }

    /// Reserves the current file up to `end` for the writer: waits only while
    /// a zero-fill step overlapping it is in progress, else takes unfilled space
    /// as it is (see `SpaceState`).
    fn reserve_space(&self, end: u64) -> Result<(), JournalError> {
        let mut space = self.shared.lock_space();
        space.writer_reserved = space.writer_reserved.max(end);
        let mut waited = false;
        loop {
            if self.shared.is_broken() {
                return Err(self.shared.broken_error());
            }
            if end <= space.allocated_end {
                return Ok(());
            }
            match space.filling {
                Some((file_id, from)) if file_id == self.file_id && from < end => {
                    if !waited {
                        waited = true;
                        self.shared.stats.record_prealloc_wait();
                    }
                    space = self
                        .shared
                        .space_cv
                        .wait(space)
                        .unwrap_or_else(|p| p.into_inner());
                }
                _ => {
                    space.allocated_end = end;
                    self.shared.stats.record_unfilled_write();
                    self.shared.space_cv.notify_all();
                    return Ok(());
                }
            }
        }
    }

    /// Writes a FileEnd record at the current offset and syncs it (so an older
    /// file always ends with a durable FileEnd). The space after it stays
    /// allocated for when the file is reused.
    fn end_file(&mut self) -> Result<JournalMark, JournalError> {
        let align = self.shared.config.alignment_bytes;
        self.reserve_space(self.offset + align as u64)?;
        self.buf.reset_zeroed(align);
        format::encode_file_end(self.file_id, self.buf.as_mut_slice());
        let path = self.file.path();
        self.file
            .write_at(self.buf.as_slice(), self.offset)
            .map_err(|e| JournalError::io("pwrite", &path, e))?;
        self.file
            .sync_data()
            .map_err(|e| JournalError::io("fdatasync", &path, e))?;
        Ok(JournalMark {
            file_id: self.file_id,
            offset: self.offset,
        })
    }

    /// Closes the current file and switches to the next one.
    fn rotate(&mut self) -> Result<(), JournalError> {
        self.end_file()?;
        let next_id = self.file_id + 1;
        let data_offset = self.shared.config.data_offset();
        // One critical section: the preallocator must neither prepare a file
        // under the id being installed nor reuse `NEXT_FILE_NAME` before the
        // rename, so the switch (and the rename) happen under its mutex.
        let mut space = self.shared.lock_space();
        let (file, allocated_end) = loop {
            if self.shared.is_broken() {
                return Err(self.shared.broken_error());
            }
            if let Some(next) = space.next.take() {
                break next;
            }
            self.shared.space_cv.notify_all();
            space = self
                .shared
                .space_cv
                .wait(space)
                .unwrap_or_else(|p| p.into_inner());
        };
        // Any zero-fill of it not yet synced must not ride on a group's sync.
        file.sync_data()
            .map_err(|e| JournalError::io("fdatasync", file.path(), e))?;
        install_file(
            &self.shared.backend,
            &self.shared.config.dir,
            next_id,
            file.as_ref(),
        )?;
        space.file_id = next_id;
        space.file = file.clone();
        space.allocated_end = allocated_end;
        space.writer_reserved = data_offset;
        space.writer_offset = data_offset;
        self.shared.space_cv.notify_all();
        drop(space);
        self.file_id = next_id;
        self.file = file;
        self.offset = data_offset;
        self.shared.writer_file_id.store(next_id, Ordering::SeqCst);
        Ok(())
    }

    /// Shutdown: end the file, let the force-write thread finish, stop.
    fn close(mut self) {
        if !self.shared.is_broken() {
            match self.end_file() {
                Ok(mark) => {
                    self.shared.force_pending.fetch_add(1, Ordering::SeqCst);
                    self.send(ForceItem::Written {
                        file: self.file.clone(),
                        end_mark: mark,
                        waiters: Vec::new(),
                        oldest_enqueued: None,
                        times: None,
                    });
                }
                Err(e) => self.shared.fail(&e),
            }
        }
        self.send(ForceItem::Stop);
        let mut space = self.shared.lock_space();
        space.stop = true;
        self.shared.space_cv.notify_all();
    }
}

/// Debug builds: decodes a group as replay will before it is written (each
/// record's length and CRC, then padding to the block), pairing the check
/// replay makes on every read.
#[cfg(debug_assertions)]
fn check_group(config: &super::config::JournalConfig, file_id: u64, group: &[u8], records: usize) {
    use super::format::{Decoded, DecodedRecord, RECORD_HEADER_BYTES};
    let record_bytes_max =
        RECORD_HEADER_BYTES + 16 + config.payload_bytes_max.max(config.alignment_bytes);
    let (mut at, mut seen, mut padded) = (0usize, 0usize, false);
    while at < group.len() {
        match format::decode_record(&group[at..], file_id, record_bytes_max) {
            Decoded::Record {
                record: DecodedRecord::User(_),
                len,
            } => {
                assert!(!padded, "journal group: a record after its padding");
                seen += 1;
                at += len;
            }
            Decoded::Record {
                record: DecodedRecord::Padding,
                len,
            } => {
                padded = true;
                at += len;
            }
            other => panic!("journal group does not decode at {at}: {other:?}"),
        }
    }
    assert_eq!(seen, records, "journal group: records encoded vs decoded");
}
