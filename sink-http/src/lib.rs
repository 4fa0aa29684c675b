//! http sink (being built).
