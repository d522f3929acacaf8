//! vela-client: see ARCHITECTURE.md. Filled in by its own issue.
