//! redis sink (being built).
