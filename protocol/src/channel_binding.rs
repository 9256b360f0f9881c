//! `tls-server-end-point` channel binding (RFC 5929 section 4): a hash of the server's TLS
//! certificate that SCRAM-SHA-256-PLUS mixes into the proof, so a client's login cannot be relayed
//! through a man in the middle holding another certificate.

use ring::digest;
use thiserror::Error;

/// Why a certificate gives no `tls-server-end-point` hash; the gateway then offers only
/// SCRAM-SHA-256 (without -PLUS) on that link.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CertificateHashError {
    /// The bytes are not an X.509 certificate in DER.
    #[error("the certificate is not valid DER")]
    Malformed,
    /// The signature algorithm has no hash this gateway or libpq can use for channel binding.
    #[error(
        "no tls-server-end-point hash for the certificate's signature algorithm (OID bytes {0:02x?})"
    )]
    UnsupportedSignatureAlgorithm(Vec<u8>),
}

// DER encodings of the signature algorithm OIDs, without tag and length.
const MD5_WITH_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x04];
const SHA1_WITH_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05];
const SHA256_WITH_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b];
const SHA384_WITH_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c];
const SHA512_WITH_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d];
const ECDSA_WITH_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01];
const ECDSA_WITH_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
const ECDSA_WITH_SHA384: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03];
const ECDSA_WITH_SHA512: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04];

/// The `tls-server-end-point` channel-binding data of a DER certificate: its hash with the hash
/// function of its signature algorithm, SHA-256 where that is MD5 or SHA-1 (RFC 5929).
///
/// RSA (PKCS #1 v1.5) and ECDSA signatures with SHA-1/256/384/512 are supported. Others give an
/// error, Ed25519 and RSA-PSS among them: RFC 5929 defines no hash for Ed25519, and Postgres and
/// libpq look the hash up with OpenSSL's `OBJ_find_sigid_algs`, which has none for Ed25519 (nor
/// for RSA-PSS before PostgreSQL 17) and so fail the login ("could not find digest for NID
/// UNDEF"). Picking SHA-256 ourselves would make libpq choose -PLUS and then fail even with
/// `channel_binding=prefer`, so such a link offers plain SCRAM-SHA-256 instead.
pub fn tls_server_end_point(cert_der: &[u8]) -> Result<Vec<u8>, CertificateHashError> {
    let oid = signature_algorithm(cert_der).ok_or(CertificateHashError::Malformed)?;
    let algorithm = match oid {
        MD5_WITH_RSA | SHA1_WITH_RSA | ECDSA_WITH_SHA1 | SHA256_WITH_RSA | ECDSA_WITH_SHA256 => {
            &digest::SHA256
        }
        SHA384_WITH_RSA | ECDSA_WITH_SHA384 => &digest::SHA384,
        SHA512_WITH_RSA | ECDSA_WITH_SHA512 => &digest::SHA512,
        _ => {
            return Err(CertificateHashError::UnsupportedSignatureAlgorithm(
                oid.to_vec(),
            ));
        }
    };
    Ok(digest::digest(algorithm, cert_der).as_ref().to_vec())
}

/// The OID of `Certificate.signatureAlgorithm`:
/// `SEQUENCE { tbsCertificate SEQUENCE, signatureAlgorithm SEQUENCE { OID, params }, BIT STRING }`.
fn signature_algorithm(der: &[u8]) -> Option<&[u8]> {
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    let (certificate, rest) = read_tlv(der, SEQUENCE)?;
    if !rest.is_empty() {
        return None;
    }
    let (_, after_tbs) = read_tlv(certificate, SEQUENCE)?;
    let (algorithm, _) = read_tlv(after_tbs, SEQUENCE)?;
    let (oid, _) = read_tlv(algorithm, OID)?;
    Some(oid)
}

/// One DER element with the expected tag: its contents and what follows it.
fn read_tlv(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = input.split_first()?;
    if first != tag {
        return None;
    }
    let (&len_byte, rest) = rest.split_first()?;
    let (len, rest) = match len_byte {
        0..=0x7f => (usize::from(len_byte), rest),
        // Long form with 1 to 4 length bytes: far beyond any certificate.
        0x81..=0x84 => {
            let n = usize::from(len_byte & 0x7f);
            let bytes = rest.get(..n)?;
            let len = bytes
                .iter()
                .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
            (len, &rest[n..])
        }
        _ => return None,
    };
    (len <= rest.len()).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A structurally valid certificate shell: an empty tbsCertificate and this algorithm.
    fn shell(oid: &[u8]) -> Vec<u8> {
        let mut algorithm = vec![0x06, oid.len() as u8];
        algorithm.extend_from_slice(oid);
        algorithm.extend_from_slice(&[0x05, 0x00]);
        let mut body = vec![0x30, 0x00, 0x30, algorithm.len() as u8];
        body.extend_from_slice(&algorithm);
        body.extend_from_slice(&[0x03, 0x01, 0x00]);
        let mut der = vec![0x30, body.len() as u8];
        der.extend_from_slice(&body);
        der
    }

    #[test]
    fn hash_follows_the_signature_algorithm() {
        let len = |oid| tls_server_end_point(&shell(oid)).unwrap().len();
        for oid in [
            MD5_WITH_RSA,
            SHA1_WITH_RSA,
            SHA256_WITH_RSA,
            ECDSA_WITH_SHA1,
            ECDSA_WITH_SHA256,
        ] {
            assert_eq!(len(oid), 32);
        }
        assert_eq!(len(SHA384_WITH_RSA), 48);
        assert_eq!(len(ECDSA_WITH_SHA384), 48);
        assert_eq!(len(SHA512_WITH_RSA), 64);
        assert_eq!(len(ECDSA_WITH_SHA512), 64);
        let der = shell(SHA1_WITH_RSA);
        assert_eq!(
            tls_server_end_point(&der).unwrap(),
            digest::digest(&digest::SHA256, &der).as_ref()
        );
    }

    #[test]
    fn ed25519_and_pss_are_unsupported() {
        let ed25519 = [0x2b, 0x65, 0x70];
        let pss = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a];
        for oid in [&ed25519[..], &pss[..]] {
            assert_eq!(
                tls_server_end_point(&shell(oid)),
                Err(CertificateHashError::UnsupportedSignatureAlgorithm(
                    oid.to_vec()
                ))
            );
        }
    }

    #[test]
    fn real_certificates() {
        // rcgen's default keys are ECDSA P-256 with SHA-256, and its P-384 ones use SHA-384.
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let der = cert.cert.der();
        assert_eq!(
            tls_server_end_point(der).unwrap(),
            digest::digest(&digest::SHA256, der).as_ref()
        );
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        let der = params.self_signed(&key).unwrap().der().to_vec();
        assert_eq!(tls_server_end_point(&der).unwrap().len(), 48);
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        let der = params.self_signed(&key).unwrap().der().to_vec();
        assert!(matches!(
            tls_server_end_point(&der),
            Err(CertificateHashError::UnsupportedSignatureAlgorithm(_))
        ));
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        let base = shell(SHA256_WITH_RSA);
        let mut state = 0x1234_5678_9abc_def1u64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mut der = base.clone();
            let at = (state % der.len() as u64) as usize;
            der[at] = (state >> 32) as u8;
            der.truncate((state >> 48) as usize % (der.len() + 1));
            let _ = tls_server_end_point(&der);
        }
        assert_eq!(
            tls_server_end_point(&[]),
            Err(CertificateHashError::Malformed)
        );
        assert_eq!(
            tls_server_end_point(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]),
            Err(CertificateHashError::Malformed)
        );
    }
}
