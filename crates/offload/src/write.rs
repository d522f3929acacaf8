//! The copy of one closed ledger: read from the bookies in batches of about
//! `PART_BYTES`, framed (`format`) into a multipart upload of the data
//! object, then the index object in one PUT. Memory of one copy: one read
//! batch, the upload's buffer (one part) and `UPLOAD_PARTS_IN_FLIGHT_MAX`
//! parts being sent.
//!
//! A failure aborts the upload when it can; whatever is left (a completed
//! data object without its index, an S3 upload the store kept) is under the
//! attempt's names, which the log never points readers to, and the log
//! deletes them (`LedgerOffloader::delete`).

use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};
use vela_log::{LedgerBackend, OffloadError, OffloadTarget};

use crate::format::{self, DATA_HEADER_BYTES, ENTRY_HEADER_BYTES, Index};
use crate::{COPY_READ_ENTRIES_MAX, ObjectStoreOffloader, PART_BYTES, UPLOAD_PARTS_IN_FLIGHT_MAX};

/// Entries of one read of the ledger: about `PART_BYTES` at the ledger's
/// mean entry size, at least one.
fn read_batch_entries(entries: u64, size_bytes: u64) -> u64 {
    let mean_bytes = (size_bytes / entries.max(1)).max(1);
    (PART_BYTES as u64 / mean_bytes).clamp(1, COPY_READ_ENTRIES_MAX)
}

impl ObjectStoreOffloader {
    /// Copies the ledger; the bytes of both objects when done.
    pub(crate) async fn copy_ledger(
        &self,
        target: OffloadTarget,
        entries: u64,
        size_bytes: u64,
        source: &dyn LedgerBackend,
    ) -> Result<u64, OffloadError> {
        if entries == 0 {
            return Err(OffloadError::Refused(format!(
                "ledger {} holds no entry",
                target.ledger_id
            )));
        }
        let data_path = format::data_path(&self.prefix, target);
        let upload = self
            .store
            .put_multipart(&data_path)
            .await
            .map_err(|error| self.store_error(error))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let offsets = match self
            .write_entries(&mut writer, target, entries, size_bytes, source)
            .await
        {
            Ok(offsets) => offsets,
            Err(error) => {
                if let Err(abort_error) = writer.abort().await {
                    tracing::debug!(ledger_id = target.ledger_id, %abort_error, "offload upload not aborted");
                }
                return Err(error);
            }
        };
        writer
            .finish()
            .await
            .map_err(|error| self.store_error(error))?;
        let data_bytes = *offsets.last().unwrap_or(&DATA_HEADER_BYTES);
        let index = Index {
            ledger_id: target.ledger_id,
            uid: target.uid,
            offsets,
        }
        .encode();
        let index_bytes = index.len() as u64;
        self.store
            .put(
                &format::index_path(&self.prefix, target),
                PutPayload::from(index),
            )
            .await
            .map_err(|error| self.store_error(error))?;
        Ok(data_bytes + index_bytes)
    }

    /// Writes the header and every entry into `writer`; the offsets of the
    /// index.
    async fn write_entries(
        &self,
        writer: &mut WriteMultipart,
        target: OffloadTarget,
        entries: u64,
        size_bytes: u64,
        source: &dyn LedgerBackend,
    ) -> Result<Vec<u64>, OffloadError> {
        writer.write(&format::data_header(target.ledger_id, entries));
        let mut offsets = Vec::with_capacity(entries as usize + 1);
        let mut offset = DATA_HEADER_BYTES;
        let batch = read_batch_entries(entries, size_bytes);
        let mut next = 0u64;
        while next < entries {
            let last = (next + batch - 1).min(entries - 1);
            let read = source.read(target.ledger_id, next, last).await?;
            if read.len() as u64 != last - next + 1 {
                return Err(OffloadError::Refused(format!(
                    "ledger {}: read of entries {next}..={last} returned {} entries",
                    target.ledger_id,
                    read.len()
                )));
            }
            for data in read {
                if u32::try_from(data.len()).is_err() {
                    return Err(OffloadError::Refused(format!(
                        "ledger {} entry {next}: {} bytes is over the format's limit",
                        target.ledger_id,
                        data.len()
                    )));
                }
                offsets.push(offset);
                offset += ENTRY_HEADER_BYTES + data.len() as u64;
                writer.write(&format::entry_header(next, &data));
                writer.put(data); // no copy: the part holds the buffer
                next += 1;
            }
            writer
                .wait_for_capacity(UPLOAD_PARTS_IN_FLIGHT_MAX)
                .await
                .map_err(|error| self.store_error(error))?;
        }
        offsets.push(offset);
        debug_assert_eq!(offsets.len() as u64, entries + 1);
        Ok(offsets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_batches_follow_the_mean_entry_size() {
        assert_eq!(read_batch_entries(10, 10 * (PART_BYTES as u64)), 1);
        assert_eq!(
            read_batch_entries(1000, 1000 * 1024),
            COPY_READ_ENTRIES_MAX.min(8192)
        );
        assert_eq!(read_batch_entries(100, 100 * (1 << 20)), 8);
        assert_eq!(read_batch_entries(0, 0), COPY_READ_ENTRIES_MAX);
    }
}
