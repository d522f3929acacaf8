//! vela-meta: see ARCHITECTURE.md. Filled in by issue 3.
