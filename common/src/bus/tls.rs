//! Whether TLS can use a client certificate, judged before any connection is tried. TLS here
//! (rustls, under async-nats) takes only X.509 version 3 certificates, and of any other it says no
//! more than "could not add certificate or key"; so the certificate file is read first, and one
//! TLS cannot use is refused with its path, the reason and how to make a usable one.
//!
//! Invariants: only the file's first certificate is judged (the client's own; any others are its
//! chain); the check reads the certificate's structure, it verifies nothing (the server does).

use std::path::Path;

use async_nats::rustls::pki_types::pem::{self, PemObject};
use async_nats::rustls::pki_types::CertificateDer;

/// How to sign a client certificate TLS can use: version 3, for client authentication.
pub const HOW_TO_SIGN: &str = "sign the client's request again as a version 3 certificate, \
     with extensions: openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key \
     -CAcreateserial -out client.crt -days 365 -extfile <(printf \
     'basicConstraints=CA:FALSE\\nkeyUsage=digitalSignature,keyEncipherment\\n\
     extendedKeyUsage=clientAuth')";

/// Refuses a client certificate file TLS cannot use, saying which file, why, and how to make
/// one it can.
pub fn check_client_certificate(path: &Path) -> Result<(), String> {
    let shown = path.display();
    let text = std::fs::read(path)
        .map_err(|e| format!("cannot read the client certificate {shown}: {e}"))?;
    let der = match CertificateDer::from_pem_slice(&text) {
        Ok(der) => der,
        Err(pem::Error::NoItemsFound) => {
            return Err(format!(
                "the client certificate {shown} holds no PEM certificate \
                 (-----BEGIN CERTIFICATE-----)"
            ))
        }
        Err(e) => {
            return Err(format!(
                "the client certificate {shown} is not valid PEM: {e}"
            ))
        }
    };
    match version(&der) {
        Some(3) => Ok(()),
        Some(version) => Err(format!(
            "the client certificate {shown} is an X.509 version {version} certificate (what \
             `openssl x509 -req` makes without an extensions file), and TLS takes only version \
             3 certificates: {HOW_TO_SIGN}"
        )),
        None => Err(format!(
            "the client certificate {shown} holds no X.509 certificate TLS can read"
        )),
    }
}

/// The X.509 version (1 to 3) of the DER certificate `der`; `None` if it is not one. A
/// certificate is a SEQUENCE whose first element, the TBSCertificate, is a SEQUENCE that opens
/// with the version, `[0] EXPLICIT INTEGER` (0 for version 1 ... 2 for version 3), or, when the
/// version is 1, with the serial number (an INTEGER): the version field is left out then.
fn version(der: &[u8]) -> Option<u8> {
    const SEQUENCE: u8 = 0x30;
    const INTEGER: u8 = 0x02;
    const VERSION: u8 = 0xa0;
    let (SEQUENCE, certificate) = element(der)? else {
        return None;
    };
    let (SEQUENCE, tbs) = element(certificate)? else {
        return None;
    };
    match element(tbs)? {
        (INTEGER, _) => Some(1),
        (VERSION, field) => match element(field)? {
            (INTEGER, &[number]) if number <= 2 => Some(number + 1),
            _ => None,
        },
        _ => None,
    }
}

/// The tag and contents of the DER element `der` opens with (definite lengths of up to four
/// bytes, as any certificate's).
fn element(der: &[u8]) -> Option<(u8, &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let bytes = usize::from(first & 0x7f);
        if !(1..=4).contains(&bytes) || rest.len() < bytes {
            return None;
        }
        let (length, rest) = rest.split_at(bytes);
        let length = length
            .iter()
            .fold(0usize, |sum, byte| sum << 8 | usize::from(*byte));
        (length, rest)
    };
    rest.get(..length).map(|contents| (tag, contents))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate whose TBSCertificate opens with `head`, padded with `padding` zero bytes
    /// (a long-form length past 127).
    fn certificate(head: &[u8], padding: usize) -> Vec<u8> {
        let mut tbs = head.to_vec();
        tbs.extend(std::iter::repeat_n(0u8, padding));
        let wrap = |tag: u8, contents: Vec<u8>| {
            let mut out = vec![tag];
            match contents.len() {
                len @ 0..=127 => out.push(len as u8),
                len => out.extend([0x82, (len >> 8) as u8, len as u8]),
            }
            out.extend(contents);
            out
        };
        wrap(0x30, wrap(0x30, tbs))
    }

    #[test]
    fn the_version_is_read_from_the_certificate_structure() {
        let serial = [0x02, 0x01, 0x05];
        assert_eq!(version(&certificate(&serial, 0)), Some(1));
        assert_eq!(version(&certificate(&serial, 300)), Some(1));
        for (number, expected) in [(0u8, 1u8), (1, 2), (2, 3)] {
            let head = [&[0xa0, 0x03, 0x02, 0x01, number][..], &serial].concat();
            assert_eq!(version(&certificate(&head, 0)), Some(expected));
            assert_eq!(version(&certificate(&head, 300)), Some(expected));
        }
    }

    #[test]
    fn what_is_not_a_certificate_has_no_version() {
        let too_new = [0xa0, 0x03, 0x02, 0x01, 0x03, 0x02, 0x01, 0x05];
        assert_eq!(version(&certificate(&too_new, 0)), None);
        assert_eq!(version(&certificate(&[0x04, 0x00], 0)), None);
        assert_eq!(version(b""), None);
        assert_eq!(version(&[0x30, 0x05, 0x30]), None, "cut short");
        assert_eq!(
            version(&[0x31, 0x03, 0x30, 0x01, 0x02]),
            None,
            "not a sequence"
        );
    }

    #[test]
    fn a_file_without_a_certificate_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("skein-cert-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("client.crt");
        std::fs::write(&file, "not a certificate\n").expect("written");
        let refused = check_client_certificate(&file).expect_err("refused");
        assert!(refused.contains(&file.display().to_string()), "{refused}");
        assert!(refused.contains("no PEM certificate"), "{refused}");
        let missing = check_client_certificate(&dir.join("nope.crt")).expect_err("refused");
        assert!(missing.contains("nope.crt"), "{missing}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
