//! Tests of the placement engine.
