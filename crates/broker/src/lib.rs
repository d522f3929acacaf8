//! vela-broker: see ARCHITECTURE.md. Filled in by its own issue.
