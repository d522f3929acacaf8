//! Compression (to be written).
