//! The TLS client configuration of a sink whose client takes a rustls `ClientConfig`
//! (feature `rustls`): the route's `tls_ca_file` (or the system's roots) and its
//! `tls_cert_file` / `tls_key_file`, with ring as the crypto provider.
//!
//! The configuration names its provider instead of taking the process's default, which
//! rustls cannot choose (and clients then panic) when an application's rustls has both
//! ring and aws-lc-rs.
//!
//! ```no_run
//! use std::path::Path;
//!
//! let config = outbox_engine::tls::client_config(
//!     Some(Path::new("/etc/ssl/broker-ca.pem")),
//!     Some((Path::new("/etc/ssl/relay.pem"), Path::new("/etc/ssl/relay.key"))),
//! )?;
//! # Ok::<(), outbox_engine::tls::TlsFileError>(())
//! ```

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A TLS file that could not be read, or holds no usable certificate or key. Names the
/// route setting and the path, never the file's content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot use the `{setting}` file {path}: {reason}")]
pub struct TlsFileError {
    /// `tls_ca_file`, `tls_cert_file` or `tls_key_file`.
    pub setting: &'static str,
    /// The file's path.
    pub path: String,
    /// What went wrong.
    pub reason: String,
}

/// A client configuration trusting the certificates of `ca_file` (PEM), or the system's
/// roots without one, and presenting `client` (a PEM certificate chain and its key)
/// when given.
///
/// # Errors
///
/// A [`TlsFileError`] naming the file that cannot be read or used.
pub fn client_config(
    ca_file: Option<&Path>,
    client: Option<(&Path, &Path)>,
) -> Result<rustls::ClientConfig, TlsFileError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for certificate in certificates("tls_ca_file", path)? {
                roots
                    .add(certificate)
                    .map_err(|e| file_error("tls_ca_file", path, e))?;
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring's default provider has cipher suites for TLS 1.2 and 1.3")
        .with_root_certificates(roots);
    match client {
        Some((cert, key)) => {
            let chain = certificates("tls_cert_file", cert)?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| file_error("tls_key_file", key, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| file_error("tls_cert_file", cert, e))
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

fn certificates(
    setting: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let found = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| file_error(setting, path, e))?;
    if found.is_empty() {
        return Err(file_error(setting, path, "holds no PEM certificate"));
    }
    Ok(found)
}

fn file_error(setting: &'static str, path: &Path, reason: impl ToString) -> TlsFileError {
    TlsFileError {
        setting,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_hold_nothing_usable_are_named() {
        let dir = std::env::temp_dir().join(format!("outbox-tls-{:016x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = client_config(Some(&empty), None).unwrap_err();
        assert_eq!(e.setting, "tls_ca_file");
        let missing = dir.join("missing.pem");
        let e = client_config(None, Some((&missing, &missing))).unwrap_err();
        assert_eq!(e.setting, "tls_cert_file");
        assert!(client_config(None, None).is_ok(), "the system's roots");
        let _ = std::fs::remove_dir_all(dir);
    }
}
