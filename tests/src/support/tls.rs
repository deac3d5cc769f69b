//! Certificates for TLS tests, made with the `openssl` command: a CA, a server certificate for
//! 127.0.0.1 and localhost, and a client certificate, all signed by the CA and valid for two days;
//! on request, the client's certificate again as X.509 version 1 (which TLS cannot use).

use std::path::{Path, PathBuf};
use std::process::Command;

/// PEM files in one directory.
#[derive(Debug, Clone)]
pub struct TestCertificates {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TestCertificates {
    /// Generates the certificates into `dir`.
    ///
    /// # Panics
    /// When `openssl` is missing or fails.
    pub fn generate(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("certificate dir");
        let path = |name: &str| dir.join(name);
        let openssl = |args: &[&str]| openssl(dir, args);
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=skein-test-ca",
        ]);
        std::fs::write(
            path("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )
        .expect("extensions");
        std::fs::write(path("client.ext"), "extendedKeyUsage=clientAuth\n").expect("extensions");
        for (name, subject) in [("server", "/CN=localhost"), ("client", "/CN=skein-client")] {
            let (key, csr, crt, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            openssl(&[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                subject,
            ]);
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &ext,
            ]);
        }
        Self {
            ca: path("ca.crt"),
            server_cert: path("server.crt"),
            server_key: path("server.key"),
            client_cert: path("client.crt"),
            client_key: path("client.key"),
        }
    }

    /// The client's key signed by the CA again, without extensions: what `openssl x509 -req`
    /// makes then is an X.509 version 1 certificate. Returns its path.
    pub fn version_1_client(&self) -> PathBuf {
        let dir = self.ca.parent().expect("the certificates' directory");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "client.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "client-v1.crt",
                "-days",
                "2",
            ],
        );
        dir.join("client-v1.crt")
    }
}

/// Runs `openssl` in `dir`.
///
/// # Panics
/// When `openssl` is missing or fails.
fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs (apt-get install openssl)");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
