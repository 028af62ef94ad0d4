//! Building a client endpoint from a server URL and optional TLS files,
//! shared by the agent and the CLI: `http://` is plaintext; `https://` uses
//! TLS verified against the CA file (`--ca-file`), and presents a client
//! certificate when one is given (for servers that require mTLS).

use std::path::PathBuf;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// TLS files for a client.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// CA bundle (PEM) the server's certificate must chain to.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM), for mTLS.
    pub cert_file: Option<PathBuf>,
    /// Client key (PEM), for mTLS.
    pub key_file: Option<PathBuf>,
}

fn read(path: &PathBuf, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("reading the {what} {}: {e}", path.display()))
}

/// An endpoint for `url`, with TLS when the URL is `https://`.
pub fn endpoint(url: &str, tls: &ClientTls) -> Result<Endpoint, String> {
    let endpoint =
        Endpoint::from_shared(url.to_owned()).map_err(|_| format!("{url:?} is not a URL"))?;
    if !url.starts_with("https://") {
        if tls.ca_file.is_some() || tls.cert_file.is_some() {
            return Err(format!(
                "TLS files were given but {url} is not an https:// URL"
            ));
        }
        return Ok(endpoint);
    }
    let ca = tls
        .ca_file
        .as_ref()
        .ok_or("an https:// server needs --ca-file (the CA that signed its certificate)")?;
    let mut config =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca, "CA file")?));
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            config = config.identity(Identity::from_pem(
                read(cert, "client certificate")?,
                read(key, "client key")?,
            ));
        }
        (None, None) => {}
        _ => return Err("--tls-cert and --tls-key go together".to_owned()),
    }
    endpoint
        .tls_config(config)
        .map_err(|e| format!("TLS configuration: {e}"))
}
