//! vela-wire: see ARCHITECTURE.md. Filled in by its own issue.
