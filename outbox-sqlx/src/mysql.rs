//! MySQL / MariaDB backend (in progress).
