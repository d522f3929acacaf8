//! Unit tests of the journal threads (fault-injecting backend).
