//! The journal on persistent memory (`JournalBackendKind::Pmem`): one region
//! file on a DAX filesystem, mapped with `MAP_SHARED_VALIDATE | MAP_SYNC`,
//! holding a ring of fixed-size slots, each slot one journal file in the file
//! journal's own format.
//!
//! Owns: the region file `journal.pmem` in `PmemConfig::dir` (an exclusive
//! `flock` on it for as long as the journal is open), its superblock and slot
//! table (`layout`), the mapping (`mapping`, the journal's only `unsafe`), and
//! the names the journal threads and replay use for their files
//! (`0000000000000042.jnl`, `next.jnl.tmp`), which here name slots.
//!
//! Durability, per path:
//! - DAX (MAP_SYNC granted): the writer copies a group into the slot with
//!   plain stores (the `journal_write` stage); the completing thread flushes
//!   the group's cache lines (CLWB, else CLFLUSHOPT, else CLFLUSH, detected
//!   with CPUID when the region opens) and issues one SFENCE (the stage
//!   histograms call it `fdatasync`): no system call. MAP_SYNC guarantees the
//!   file's block mapping is durable before any store through the mapping can
//!   land, so a flushed, fenced record survives power loss. Flushes run on
//!   whichever thread completes the group, which is sound because a
//!   cache-line flush acts on the line wherever it is cached and the stores
//!   are visible to that thread (the group was handed over through a mutex or
//!   channel). Non-temporal stores are not used: they would have to be fenced
//!   by the writer thread itself, taking the flush off the force-write thread.
//! - Emulation (MAP_SYNC refused, the operator allowed it with
//!   `PmemEmulation::Allow`): the region is mapped plainly and each sync is an
//!   `msync(MS_SYNC)` of the written pages. That is not persistent-memory
//!   durability: on a disk filesystem it is a page write-back plus a device
//!   flush (like fdatasync); on tmpfs, where the tests run, it survives kill -9
//!   of the bookie but nothing survives a reboot. Logged at warn on open.
//! - Refused (MAP_SYNC refused, emulation not allowed): `Journal::open` fails
//!   with `JournalError::PmemNotDax` naming the file and the kernel's answer.
//!
//! The ring: slot i of the region holds one journal file at a time. The slot
//! table maps slots to states: free, next (being prepared: never replayed) or
//! live with a file id. Each change is one aligned 8-byte store, flushed
//! before the call returns, so the table is never half updated: preparing the
//! next file marks a free slot `next`; installing it (rotation, the rename of
//! the file journal) marks it `live(id)`; retiring a file once ledger storage
//! checkpointed past it (`Journal::delete_files_before`) marks it free. The
//! writer takes slots in ring order, after the slot of the newest file.
//!
//! Laps: a slot reused for file id N still holds records of the file it held
//! on an earlier lap. They are never replayed as new because every record's
//! crc is seeded with its file id (`format::encode_record`), the file header
//! at the start of the slot names N, and ids only grow: a stale record fails
//! its crc under N (a 2^-32 chance of a false match per stale position, the
//! same as a reused journal file). Replay finds the end as in a file: the live
//! slots in id order, each but the newest a clean run of records ending in a
//! FileEnd (the writer flushes one before it installs the next slot), the
//! newest ending at its first zero, short, bad-crc (torn, or stale from an
//! earlier lap) record, where replay writes a FileEnd.
//!
//! Space: a full ring is back-pressure, not failure. The writer never takes
//! the last free slot while running (one stays for the first file after a
//! restart, so a bookie that crashed with a full ring can open), the
//! preallocator waits for a checkpoint to free a slot (`RingFull`), the
//! appends queue up to `queue_depth_max` and ADDs then get TOO_MANY_REQUESTS.
//! `Journal::wants_checkpoint` asks the bookie's sync thread for a checkpoint
//! once more than half the slots are live.
//!
//! Never: truncates or grows the region after formatting it; writes outside a
//! slot except the table entries; trusts a slot the table does not call live.

mod layout;
mod mapping;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::config::JournalConfig;
use super::error::JournalError;
use super::file::JournalFile;
use super::format::{self, Decoded, DecodedRecord, RECORD_HEADER_BYTES};
use super::shared::Shared;
use crate::mark::JournalMark;
use layout::{Geometry, HEADER_AREA_BYTES, SlotState, Superblock};
use mapping::{FlushInstruction, MapSync, Mapping, Persistence};

pub(crate) use mapping::CACHE_LINE_BYTES as PMEM_CACHE_LINE_BYTES;

/// Name of the region file in `PmemConfig::dir`.
pub const PMEM_REGION_FILE_NAME: &str = "journal.pmem";

/// Group alignment for the pmem backend: Optane media writes 256-byte units
/// (XPLines), so a group padded to 256 bytes never makes the module
/// read-modify-write a unit holding acknowledged records, and a lone 1 KiB
/// entry takes 1.25 KiB of the ring instead of a 4 KiB block. A multiple of
/// the cache line, so groups never share a line (see `mapping`).
pub const PMEM_ALIGNMENT_BYTES: usize = 256;
const _: () = assert!(PMEM_ALIGNMENT_BYTES.is_multiple_of(mapping::CACHE_LINE_BYTES));
const _: () = assert!((layout::SLOT_ROUNDING_BYTES as usize).is_multiple_of(PMEM_ALIGNMENT_BYTES));

/// Default region size: 16 slots of 64 MiB. At the default write cache (256
/// MiB, flushed at 64 MiB) a checkpoint frees slots long before the ring
/// fills, even at depth 1 where each 1 KiB entry takes 1.25 KiB.
pub const PMEM_REGION_BYTES_DEFAULT: u64 = 1 << 30;

/// Zero-fill of a new region goes out in writes of this size.
const FORMAT_WRITE_BYTES: usize = 1 << 20;

/// What to do when the filesystem refuses MAP_SYNC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmemEmulation {
    /// Refuse to open (the default): without MAP_SYNC, flushing CPU caches does
    /// not make a record durable.
    Refuse,
    /// Map without MAP_SYNC and `msync` each group, logged at warn as not
    /// persistent-memory durable. For tests and benchmarks on tmpfs, and for
    /// trying the backend on ordinary disks.
    Allow,
}

/// Where the persistent-memory journal lives and how large it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmemConfig {
    /// Directory (on a DAX filesystem) holding the region file
    /// `PMEM_REGION_FILE_NAME`.
    pub dir: PathBuf,
    /// Size of the region. A new region is created (zero-filled) at this size;
    /// an existing one must have been created with it.
    pub region_bytes: u64,
    /// MAP_SYNC refused: refuse, or emulate with msync.
    pub emulation: PmemEmulation,
}

impl PmemConfig {
    /// A region of `PMEM_REGION_BYTES_DEFAULT` in `dir`, emulation refused.
    pub fn new(dir: impl Into<PathBuf>) -> PmemConfig {
        PmemConfig {
            dir: dir.into(),
            region_bytes: PMEM_REGION_BYTES_DEFAULT,
            emulation: PmemEmulation::Refuse,
        }
    }
}

/// How a directory's filesystem answers MAP_SYNC (for `vela doctor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapSyncProbe {
    /// MAP_SYNC granted: the directory is on a DAX filesystem; records would be
    /// made durable with this cache-flush instruction (`None`: this CPU
    /// architecture has none the journal knows).
    Granted {
        /// `clwb`, `clflushopt` or `clflush`.
        flush_instruction: Option<&'static str>,
    },
    /// MAP_SYNC refused: the kernel's answer.
    Refused {
        /// The error from mmap(2) (EOPNOTSUPP: not DAX).
        error: String,
    },
}

/// Maps a one-page scratch file in `dir` with MAP_SYNC and removes it.
pub fn probe_map_sync(dir: &Path) -> io::Result<MapSyncProbe> {
    let path = dir.join(format!(".vela-map-sync-probe-{}", std::process::id()));
    let result = (|| {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        file.write_all_at(&[0u8; 4096], 0)?;
        Ok(match Mapping::map(&file, 4096, MapSync::Required) {
            Ok(_mapping) => MapSyncProbe::Granted {
                flush_instruction: FlushInstruction::detect().map(FlushInstruction::name),
            },
            Err(error) => MapSyncProbe::Refused {
                error: error.to_string(),
            },
        })
    })();
    let _ = std::fs::remove_file(&path);
    result
}

/// Where journal file `file_id` lies in the region file of `dir` (read with
/// pread, so the journal may be closed): the region file, the slot's offset in
/// it and the slot's size; `None` when no live slot holds that file. For
/// tools and tests that inspect or damage a journal file as they would a
/// `.jnl` file.
pub fn locate_file(dir: &Path, file_id: u64) -> Result<Option<(PathBuf, u64, u64)>, JournalError> {
    let path = dir.join(PMEM_REGION_FILE_NAME);
    let file = File::open(&path).map_err(|e| JournalError::io("open", &path, e))?;
    let Superblock::Formatted(geometry) = read_superblock(&file, &path)? else {
        return Ok(None);
    };
    for index in 0..geometry.slot_count as usize {
        let mut entry = [0u8; 8];
        file.read_exact_at(&mut entry, Geometry::entry_offset(index))
            .map_err(|e| JournalError::io("read", &path, e))?;
        if layout::decode_slot(u64::from_le_bytes(entry)) == Ok(SlotState::Live(file_id)) {
            return Ok(Some((
                path,
                geometry.slot_offset(index),
                geometry.slot_bytes,
            )));
        }
    }
    Ok(None)
}

/// How often the journal's preallocator retries a full pmem ring (a checkpoint's
/// `delete_files_before` also wakes it).
const RING_FULL_RETRY_INTERVAL: Duration = Duration::from_millis(10);

/// Waits a while for a checkpoint to free a slot of a full pmem ring (the
/// writer, once it needs the next file, waits in `rotate` meanwhile, and
/// appends back up into the queue). `false` (fail the journal with the ring's
/// error) when broken, or when shutting down while the writer may still need
/// the next file: a stopping bookie runs no more checkpoints, so waiting would
/// never end; what could not be written was never acknowledged.
pub(crate) fn wait_for_free_slot(shared: &Shared, error: &JournalError) -> bool {
    if shared.broken.load(Ordering::SeqCst) {
        return false;
    }
    let closed = shared
        .queue
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .closed;
    let config = &shared.config;
    let space = shared.space.lock().unwrap_or_else(|p| p.into_inner());
    if space.stop {
        return true;
    }
    // A group, then the FileEnd block, may still go into the current file
    // (`file_bytes_max` is the slot size here, a multiple of the alignment).
    let may_rotate = space.writer_offset + config.group_len_max() + config.alignment_bytes as u64
        > config.file_bytes_max;
    if closed && may_rotate {
        return false;
    }
    if !closed && shared.stats.record_ring_full_wait() {
        tracing::warn!(%error, "journal: waiting for ledger storage to checkpoint and free a slot");
    }
    let _ = shared
        .space_cv
        .wait_timeout(space, RING_FULL_RETRY_INTERVAL)
        .unwrap_or_else(|p| p.into_inner());
    true
}

/// The mapped region: geometry, persistence path, slot table.
#[derive(Debug)]
pub(crate) struct Region {
    path: PathBuf,
    geometry: Geometry,
    map: Mapping,
    persistence: Persistence,
    slots: Mutex<Slots>,
    /// Holds the exclusive flock on the region file.
    _file: File,
}

/// The slot table as this process sees it: the region's copy is written
/// through on every change, under this mutex.
#[derive(Debug)]
struct Slots {
    states: Vec<SlotState>,
    /// Slot of the newest file: the ring goes on after it.
    last_taken: usize,
    /// Whether the first file since open has been given a slot (only that one
    /// may take the last free slot).
    first_taken: bool,
}

impl Slots {
    fn free_count(&self) -> usize {
        self.states
            .iter()
            .filter(|s| **s == SlotState::Free)
            .count()
    }

    fn live_count(&self) -> usize {
        self.states
            .iter()
            .filter(|s| matches!(s, SlotState::Live(_)))
            .count()
    }

    fn find_live(&self, id: u64) -> Option<usize> {
        self.states.iter().position(|s| *s == SlotState::Live(id))
    }

    fn find_next(&self) -> Option<usize> {
        self.states.iter().position(|s| *s == SlotState::Next)
    }
}

/// A journal file name, as the pmem backend reads it.
enum Name {
    File(u64),
    Next,
    Free,
    Other,
}

fn classify(path: &Path) -> Name {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Name::Other;
    };
    if name == format::NEXT_FILE_NAME {
        Name::Next
    } else if let Some(id) = format::parse_file_name(name) {
        Name::File(id)
    } else if name.ends_with(format::FREE_FILE_SUFFIX) {
        Name::Free
    } else {
        Name::Other
    }
}

fn not_found(what: &str, path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{what} {} is not in the pmem region", path.display()),
    )
}

impl Region {
    /// Opens (formatting it if new) the region `config.pmem` names, maps it,
    /// checks it against the journal config, and frees the slots ledger
    /// storage has checkpointed past (`from`). When no slot is free after that
    /// and the newest file holds no record (a restart that stopped before its
    /// first checkpoint), that file's slot is freed too: see the module docs.
    pub(crate) fn open(
        config: &JournalConfig,
        from: JournalMark,
    ) -> Result<Arc<Region>, JournalError> {
        let Some(pmem) = config.pmem.as_ref() else {
            return Err(JournalError::InvalidConfig {
                reason: "the pmem backend needs a pmem config (directory and size)".to_string(),
            });
        };
        let wanted =
            Geometry::for_region(pmem.region_bytes).ok_or_else(|| JournalError::InvalidConfig {
                reason: format!(
                    "a pmem region of {} bytes is too small for {} slots",
                    pmem.region_bytes,
                    layout::SLOTS_MIN
                ),
            })?;
        std::fs::create_dir_all(&pmem.dir)
            .map_err(|e| JournalError::io("create_dir", &pmem.dir, e))?;
        let path = pmem.dir.join(PMEM_REGION_FILE_NAME);
        let file = open_locked(&path, &pmem.dir)?;
        let geometry = match read_superblock(&file, &path)? {
            Superblock::Unformatted => {
                format_region(&file, &path, wanted)?;
                wanted
            }
            Superblock::Formatted(geometry) => geometry,
        };
        check_geometry(config, &path, &file, geometry)?;
        let (map, persistence) = map_region(&file, &path, geometry, pmem.emulation)?;
        let mut states = Vec::with_capacity(geometry.slot_count as usize);
        for index in 0..geometry.slot_count as usize {
            let mut entry = [0u8; 8];
            map.read(Geometry::entry_offset(index) as usize, &mut entry);
            let state = layout::decode_slot(u64::from_le_bytes(entry)).map_err(|reason| {
                JournalError::Corruption {
                    path: path.clone(),
                    offset: Geometry::entry_offset(index),
                    reason: format!("slot {index}: {reason}"),
                }
            })?;
            states.push(state);
        }
        let newest = newest_live(&states);
        let region = Arc::new(Region {
            path,
            geometry,
            map,
            persistence,
            slots: Mutex::new(Slots {
                states,
                last_taken: newest.map_or(geometry.slot_count as usize - 1, |(slot, _)| slot),
                first_taken: false,
            }),
            _file: file,
        });
        region.free_checkpointed(config, from)?;
        let how = match persistence {
            Persistence::CacheFlush(instruction) => {
                format!("{} + sfence (MAP_SYNC)", instruction.name())
            }
            Persistence::Msync => "msync (emulation)".to_string(),
        };
        tracing::info!(
            region = %region.path.display(),
            slot_count = geometry.slot_count,
            slot_bytes = geometry.slot_bytes,
            durable_by = %how,
            "journal: persistent-memory region open"
        );
        Ok(region)
    }

    /// Bytes per slot: the journal's `file_bytes_max` on this backend.
    pub(crate) fn slot_bytes(&self) -> u64 {
        self.geometry.slot_bytes
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes a table entry through to the region and makes it durable.
    fn set_state(
        &self,
        slots: &mut Slots,
        index: usize,
        state: SlotState,
    ) -> Result<(), JournalError> {
        let offset = Geometry::entry_offset(index) as usize;
        self.map.store_u64(offset, layout::encode_slot(state));
        self.map
            .persist(offset, 8, self.persistence)
            .map_err(|e| JournalError::io("persist slot table", &self.path, e))?;
        slots.states[index] = state;
        Ok(())
    }

    /// See `open`: frees live slots below `from`, then, if none is free, the
    /// newest file's slot when it holds no record and `from` is not in it.
    fn free_checkpointed(
        &self,
        config: &JournalConfig,
        from: JournalMark,
    ) -> Result<(), JournalError> {
        let mut slots = self.lock();
        for index in 0..slots.states.len() {
            if let SlotState::Live(id) = slots.states[index]
                && id < from.file_id
            {
                self.set_state(&mut slots, index, SlotState::Free)?;
            }
        }
        let next_slots = slots
            .states
            .iter()
            .filter(|s| **s == SlotState::Next)
            .count();
        if slots.free_count() + next_slots > 0 {
            return Ok(());
        }
        if let Some((index, id)) = newest_live(&slots.states)
            && id > from.file_id
            && !self.slot_has_records(config, index, id)
        {
            tracing::warn!(region = %self.path.display(), file_id = id, slot = index,
                "journal: pmem ring full at open; reusing the newest file's slot, which holds no record");
            self.set_state(&mut slots, index, SlotState::Free)?;
        }
        Ok(())
    }

    /// Whether the file in slot `index` starts with a record replay would
    /// hand back.
    fn slot_has_records(&self, config: &JournalConfig, index: usize, id: u64) -> bool {
        let base = self.geometry.slot_offset(index) as usize;
        let mut header = vec![0u8; format::HEADER_BYTES];
        self.map.read(base, &mut header);
        let Ok(header) = format::decode_header(&header) else {
            return false;
        };
        let data_offset = u64::from(header.data_offset);
        let record_bytes_max =
            RECORD_HEADER_BYTES + 16 + config.payload_bytes_max.max(config.alignment_bytes);
        let room = self.geometry.slot_bytes.saturating_sub(data_offset);
        let mut first = vec![0u8; (record_bytes_max as u64).min(room) as usize];
        if header.file_id != id || first.is_empty() {
            return false;
        }
        self.map.read(base + data_offset as usize, &mut first);
        matches!(
            format::decode_record(&first, id, record_bytes_max),
            Decoded::Record {
                record: DecodedRecord::User(_),
                ..
            }
        )
    }

    /// Gives the next file a slot: the first free one after the newest file's,
    /// in ring order. Only the first file since open may take the last free
    /// slot; later ones leave it for the next restart (`RingFull` instead).
    fn allocate_next(&self) -> Result<usize, JournalError> {
        let mut slots = self.lock();
        let free = slots.free_count();
        let needed = if slots.first_taken { 2 } else { 1 };
        if free < needed {
            return Err(JournalError::RingFull {
                path: self.path.clone(),
                live_slots: slots.live_count(),
                slot_count: slots.states.len(),
            });
        }
        let count = slots.states.len();
        let start = slots.last_taken;
        let index = (1..=count)
            .map(|step| (start + step) % count)
            .find(|i| slots.states[*i] == SlotState::Free)
            .ok_or_else(|| JournalError::RingFull {
                path: self.path.clone(),
                live_slots: slots.live_count(),
                slot_count: count,
            })?;
        self.set_state(&mut slots, index, SlotState::Next)?;
        slots.last_taken = index;
        slots.first_taken = true;
        Ok(index)
    }

    fn slot_file(self: &Arc<Self>, index: usize, path: &Path) -> Arc<dyn JournalFile> {
        Arc::new(SlotFile {
            region: self.clone(),
            index,
            base: self.geometry.slot_offset(index),
            path: Mutex::new(path.to_path_buf()),
            dirty: Mutex::new(None),
        })
    }

    // -----------------------------------------------------------------------
    // The names the journal uses (see `journal::file::Backend`).
    // -----------------------------------------------------------------------

    pub(crate) fn list_file_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .lock()
            .states
            .iter()
            .filter_map(|s| match s {
                SlotState::Live(id) => Some(*id),
                _ => None,
            })
            .collect();
        ids.sort_unstable();
        ids
    }

    pub(crate) fn exists(&self, path: &Path) -> bool {
        let slots = self.lock();
        match classify(path) {
            Name::File(id) => slots.find_live(id).is_some(),
            Name::Next => slots.find_next().is_some(),
            Name::Free | Name::Other => false,
        }
    }

    /// The file journal's renames: next -> numbered (install), numbered or
    /// next -> retired (free the slot). Durable on return.
    pub(crate) fn rename(&self, from: &Path, to: &Path) -> Result<(), JournalError> {
        let mut slots = self.lock();
        match (classify(from), classify(to)) {
            (Name::Next, Name::File(id)) => {
                let index = slots.find_next().ok_or_else(|| {
                    JournalError::io("rename", from, not_found("next file", from))
                })?;
                assert!(
                    slots.find_live(id).is_none(),
                    "journal file {id} installed twice in the pmem ring"
                );
                self.set_state(&mut slots, index, SlotState::Live(id))
            }
            (Name::File(_) | Name::Next, Name::Free) => {
                drop(slots);
                self.remove(from)
            }
            _ => Err(JournalError::io(
                "rename",
                from,
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("the pmem region has no rename to {}", to.display()),
                ),
            )),
        }
    }

    /// Frees the slot of a numbered or the next file. Durable on return.
    pub(crate) fn remove(&self, path: &Path) -> Result<(), JournalError> {
        let mut slots = self.lock();
        let indexes: Vec<usize> = match classify(path) {
            Name::File(id) => slots.find_live(id).into_iter().collect(),
            // At most one while running; replay frees any a crash left.
            Name::Next => (0..slots.states.len())
                .filter(|i| slots.states[*i] == SlotState::Next)
                .collect(),
            Name::Free | Name::Other => Vec::new(),
        };
        if indexes.is_empty() {
            return Err(JournalError::io("remove", path, not_found("file", path)));
        }
        for index in indexes {
            self.set_state(&mut slots, index, SlotState::Free)?;
        }
        Ok(())
    }

    /// Opens a numbered file, or the next file (taking a slot for it when
    /// `create` and there is none).
    pub(crate) fn open_file(
        self: &Arc<Self>,
        path: &Path,
        create: bool,
    ) -> Result<Arc<dyn JournalFile>, JournalError> {
        let found = {
            let slots = self.lock();
            match classify(path) {
                Name::File(id) => slots.find_live(id),
                Name::Next => slots.find_next(),
                Name::Free | Name::Other => None,
            }
        };
        let index = match (found, classify(path)) {
            (Some(index), _) => index,
            (None, Name::Next) if create => self.allocate_next()?,
            _ => return Err(JournalError::io("open", path, not_found("file", path))),
        };
        Ok(self.slot_file(index, path))
    }

    /// More than half the slots hold files ledger storage has not
    /// checkpointed past: time for a checkpoint.
    pub(crate) fn wants_checkpoint(&self) -> bool {
        let slots = self.lock();
        slots.live_count() * 2 > slots.states.len()
    }
}

/// The newest live file: (slot, id).
fn newest_live(states: &[SlotState]) -> Option<(usize, u64)> {
    states
        .iter()
        .enumerate()
        .filter_map(|(index, s)| match s {
            SlotState::Live(id) => Some((index, *id)),
            _ => None,
        })
        .max_by_key(|(_, id)| *id)
}

fn open_locked(path: &Path, dir: &Path) -> Result<File, JournalError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| JournalError::io("open", path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(JournalError::Locked {
            dir: dir.to_path_buf(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(JournalError::io("flock", path, e)),
    }
}

fn read_superblock(file: &File, path: &Path) -> Result<Superblock, JournalError> {
    let mut block = vec![0u8; HEADER_AREA_BYTES as usize];
    let mut done = 0;
    while done < block.len() {
        match file.read_at(&mut block[done..], done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(JournalError::io("read", path, e)),
        }
    }
    // A file shorter than the superblock reads as zeros past its end.
    layout::decode_superblock(&block).map_err(|reason| JournalError::BadHeader {
        path: path.to_path_buf(),
        reason,
    })
}

/// Writes zeros over the whole region (so no page fault ever allocates a
/// block: on a DAX filesystem a MAP_SYNC fault that allocates must commit the
/// filesystem's journal before it returns), syncs, then writes the superblock
/// last (until then the region reads as unformatted) and syncs the file and
/// its directory.
fn format_region(file: &File, path: &Path, geometry: Geometry) -> Result<(), JournalError> {
    tracing::info!(region = %path.display(), region_bytes = geometry.region_bytes, "journal: formatting a new pmem region");
    let zeros = vec![0u8; FORMAT_WRITE_BYTES];
    let mut at = 0u64;
    while at < geometry.region_bytes {
        let n = (geometry.region_bytes - at).min(FORMAT_WRITE_BYTES as u64) as usize;
        file.write_all_at(&zeros[..n], at)
            .map_err(|e| JournalError::io("pwrite zeros", path, e))?;
        at += n as u64;
    }
    file.sync_all()
        .map_err(|e| JournalError::io("fsync", path, e))?;
    let mut header = vec![0u8; HEADER_AREA_BYTES as usize];
    layout::encode_superblock(geometry, &mut header);
    file.write_all_at(&header, 0)
        .map_err(|e| JournalError::io("pwrite", path, e))?;
    file.sync_all()
        .map_err(|e| JournalError::io("fsync", path, e))?;
    if let Some(dir) = path.parent() {
        super::file::sync_dir(dir)?;
    }
    Ok(())
}

/// The region on disk against the config: its size, and slots that fit a
/// journal file of this config.
fn check_geometry(
    config: &JournalConfig,
    path: &Path,
    file: &File,
    geometry: Geometry,
) -> Result<(), JournalError> {
    let pmem_bytes = config.pmem.as_ref().map_or(0, |p| p.region_bytes);
    if geometry.region_bytes != pmem_bytes {
        return Err(JournalError::InvalidConfig {
            reason: format!(
                "pmem region {} was created with {} bytes but the config asks for {pmem_bytes}; \
                 to resize, stop the bookie cleanly (everything is then checkpointed) and remove the file",
                path.display(),
                geometry.region_bytes
            ),
        });
    }
    let file_len = file
        .metadata()
        .map_err(|e| JournalError::io("stat", path, e))?
        .len();
    if file_len < geometry.region_bytes {
        return Err(JournalError::Corruption {
            path: path.to_path_buf(),
            offset: file_len,
            reason: format!(
                "region file is {file_len} bytes, its superblock says {}",
                geometry.region_bytes
            ),
        });
    }
    let file_min = config.file_bytes_min();
    if geometry.slot_bytes < file_min {
        return Err(JournalError::InvalidConfig {
            reason: format!(
                "pmem region {}: slots of {} bytes cannot hold a journal file of this config \
                 (header + largest group + end block: {file_min} bytes); use a region of at least {} bytes",
                path.display(),
                geometry.slot_bytes,
                file_min.next_multiple_of(layout::SLOT_ROUNDING_BYTES)
                    * u64::from(layout::SLOTS_MIN)
                    + HEADER_AREA_BYTES
            ),
        });
    }
    if !geometry
        .slot_bytes
        .is_multiple_of(config.alignment_bytes as u64)
    {
        return Err(JournalError::InvalidConfig {
            reason: format!(
                "alignment_bytes {} does not divide the pmem slot size {}",
                config.alignment_bytes, geometry.slot_bytes
            ),
        });
    }
    Ok(())
}

/// Maps the region with MAP_SYNC, or, when that is refused and emulation is
/// allowed, without it (msync per group, logged at warn).
fn map_region(
    file: &File,
    path: &Path,
    geometry: Geometry,
    emulation: PmemEmulation,
) -> Result<(Mapping, Persistence), JournalError> {
    let len = usize::try_from(geometry.region_bytes).map_err(|_| JournalError::InvalidConfig {
        reason: format!(
            "a pmem region of {} bytes does not fit this address space",
            geometry.region_bytes
        ),
    })?;
    let refusal = match Mapping::map(file, len, MapSync::Required) {
        Ok(map) => match FlushInstruction::detect() {
            Some(instruction) => return Ok((map, Persistence::CacheFlush(instruction))),
            None => format!(
                "MAP_SYNC granted, but the journal knows no cache-flush instruction for {}",
                std::env::consts::ARCH
            ),
        },
        Err(error) => {
            if emulation == PmemEmulation::Refuse {
                return Err(JournalError::PmemNotDax {
                    path: path.to_path_buf(),
                    source: Arc::new(error),
                });
            }
            format!("MAP_SYNC refused ({error}): not a DAX filesystem")
        }
    };
    if emulation == PmemEmulation::Refuse {
        return Err(JournalError::PmemUnsupported {
            path: path.to_path_buf(),
            reason: refusal,
        });
    }
    tracing::warn!(
        region = %path.display(),
        reason = %refusal,
        "journal: pmem EMULATION: each group is msync'ed; this is NOT persistent-memory durability \
         (on tmpfs nothing survives a reboot or power loss; on a disk filesystem it is as durable as fdatasync)"
    );
    let map =
        Mapping::map(file, len, MapSync::No).map_err(|e| JournalError::io("mmap", path, e))?;
    Ok((map, Persistence::Msync))
}

/// One slot as a journal file. Writes copy into the mapping; `sync_data`
/// makes everything written since the last one durable.
#[derive(Debug)]
struct SlotFile {
    region: Arc<Region>,
    index: usize,
    /// Offset of the slot in the region.
    base: u64,
    path: Mutex<PathBuf>,
    /// Bytes written and not yet made durable: [from, to) in the slot.
    dirty: Mutex<Option<(u64, u64)>>,
}

impl SlotFile {
    fn range(&self, offset: u64, len: usize) -> io::Result<usize> {
        let end = offset
            .checked_add(len as u64)
            .filter(|e| *e <= self.region.geometry.slot_bytes);
        match end {
            Some(_) => usize::try_from(self.base + offset).map_err(io::Error::other),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "[{offset}, +{len}) is outside slot {} ({} bytes)",
                    self.index, self.region.geometry.slot_bytes
                ),
            )),
        }
    }
}

impl JournalFile for SlotFile {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let at = self.range(offset, buf.len())?;
        self.region.map.write(at, buf);
        let end = offset + buf.len() as u64;
        let mut dirty = self.dirty.lock().unwrap_or_else(|p| p.into_inner());
        *dirty = Some(match *dirty {
            Some((from, to)) => (from.min(offset), to.max(end)),
            None => (offset, end),
        });
        Ok(())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n =
            (self.region.geometry.slot_bytes.saturating_sub(offset)).min(buf.len() as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        let at = self.range(offset, n)?;
        self.region.map.read(at, &mut buf[..n]);
        Ok(n)
    }

    fn sync_data(&self) -> io::Result<()> {
        let dirty = self.dirty.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some((from, to)) = dirty else {
            return Ok(());
        };
        let at = self.range(from, (to - from) as usize)?;
        self.region
            .map
            .persist(at, (to - from) as usize, self.region.persistence)
    }

    fn set_len(&self, _len: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a pmem slot has a fixed size",
        ))
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.region.geometry.slot_bytes)
    }

    fn path(&self) -> PathBuf {
        self.path.lock().map(|p| p.clone()).unwrap_or_default()
    }

    fn renamed(&self, to: &Path) {
        if let Ok(mut p) = self.path.lock() {
            *p = to.to_path_buf();
        }
    }
}

#[cfg(test)]
mod tests;
