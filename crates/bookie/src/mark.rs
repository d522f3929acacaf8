//! `JournalMark`: a position in the journal, shared by the journal (which
//! produces marks) and ledger storage (which checkpoints them).

/// A position in the journal: every record that ends at or before
/// (`file_id`, `offset`) is covered by the mark. Marks order by file, then offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct JournalMark {
    /// Id of the journal file (the number in its file name).
    pub file_id: u64,
    /// Byte offset in that file just past the last covered record.
    pub offset: u64,
}

impl JournalMark {
    /// The mark before any journal record: replay from here replays everything.
    pub const START: JournalMark = JournalMark {
        file_id: 0,
        offset: 0,
    };
}
