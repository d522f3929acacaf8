//! Batches (to be written).
