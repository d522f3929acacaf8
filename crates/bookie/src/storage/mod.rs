//! Filled in by issue 10 (see ARCHITECTURE.md).
