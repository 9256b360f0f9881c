//! The gateway as SCRAM server: checks a client's proof against a stored verifier and recovers
//! the client's ClientKey, so it can later log in to the backend as that user.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use subtle::ConstantTimeEq;
use thiserror::Error;

use super::{
    ClientKey, Nonce, SCRAM_SHA_256, SCRAM_SHA_256_PLUS, ScramSecret, ServerKey, StoredKey,
    attribute, auth_message, decode_key, hmac_sha256, is_attribute, is_printable, sha256, xor,
};
use crate::sqlstate;

/// The only channel-binding type Postgres (and so libpq) implements.
const TLS_SERVER_END_POINT: &[u8] = b"tls-server-end-point";

/// Why a client's SCRAM exchange failed. Every way of not knowing the password, an unknown user
/// included, is the single variant [`ScramError::AuthenticationFailed`]; the others describe
/// only the client's own messages, so their text is safe to send to the client.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ScramError {
    /// Wrong password, or a user the gateway does not know (mock exchange).
    #[error("password authentication failed")]
    AuthenticationFailed,
    /// A mechanism that is not offered on this link.
    #[error("client selected an invalid SASL authentication mechanism")]
    UnsupportedMechanism,
    /// A message that does not follow the SCRAM grammar.
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    /// The client can bind to the channel but believes the server cannot: a man in the middle may
    /// have removed SCRAM-SHA-256-PLUS from the offered mechanisms.
    #[error(
        "SCRAM channel binding negotiation error: the client supports channel binding but thinks \
         the server does not, yet this server does"
    )]
    ChannelBindingDowngrade,
    /// A channel-binding type other than `tls-server-end-point`.
    #[error("unsupported SCRAM channel-binding type")]
    UnsupportedChannelBindingType,
    /// The client-final's `c=` does not match the channel: another TLS certificate (a man in the
    /// middle), or flags that changed between the two messages.
    #[error("SCRAM channel binding check failed")]
    ChannelBindingMismatch,
    /// An authorization identity (`a=`), which Postgres does not support either.
    #[error("client uses authorization identity, but it is not supported")]
    AuthzidNotSupported,
    /// A mandatory extension (`m=`), which must be refused.
    #[error("client requires an unsupported SCRAM extension")]
    MandatoryExtension,
    /// The client-final's nonce is not the one the server issued.
    #[error("invalid SCRAM response: nonce does not match")]
    NonceMismatch,
}

/// What a [`ScramError`] means for the client: the SQLSTATE to send and whether it counts as a
/// failed password attempt (for throttling and the credential cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScramErrorKind {
    /// The password was not proven: `28P01`, with the same text whether or not the user exists.
    InvalidPassword,
    /// The client broke the protocol: `08P01`.
    ProtocolViolation,
}

impl ScramError {
    /// Whether this is a failed password or a protocol violation.
    pub fn kind(&self) -> ScramErrorKind {
        match self {
            ScramError::AuthenticationFailed => ScramErrorKind::InvalidPassword,
            _ => ScramErrorKind::ProtocolViolation,
        }
    }

    /// The SQLSTATE for the client's ErrorResponse.
    pub fn sqlstate(&self) -> &'static str {
        match self.kind() {
            ScramErrorKind::InvalidPassword => sqlstate::INVALID_PASSWORD,
            ScramErrorKind::ProtocolViolation => sqlstate::PROTOCOL_VIOLATION,
        }
    }
}

/// A SCRAM exchange with a client after the server-first message: waits for the client-final.
///
/// Both constructors validate the client-first and return the server-first to send in
/// AuthenticationSASLContinue; [`ScramServer::finish`] checks the client-final and returns the
/// server-final for AuthenticationSASLFinal. Nothing here is CPU-heavy (a few HMACs).
pub struct ScramServer {
    stored_key: StoredKey,
    server_key: ServerKey,
    /// `c=` the client must send: its gs2 header, then the end-point hash when bound.
    expected_binding: Vec<u8>,
    nonce: Vec<u8>,
    client_first_bare: Vec<u8>,
    server_first: Vec<u8>,
    /// A mock exchange, bound to fail after the same work as a real one.
    doomed: bool,
}

impl ScramServer {
    /// Starts an exchange against a user's verifier. `channel_binding` is the client link's
    /// `tls-server-end-point` hash, `None` when the link is not TLS or the certificate has none;
    /// it must be what [`super::mechanisms`] was told. `mechanism` and `client_first` come from
    /// the client's SASLInitialResponse (no data counts as empty).
    pub fn start(
        secret: &ScramSecret,
        channel_binding: Option<&[u8]>,
        nonce: Nonce,
        mechanism: &str,
        client_first: &[u8],
    ) -> Result<(ScramServer, Vec<u8>), ScramError> {
        let binding_in_use = match mechanism {
            SCRAM_SHA_256_PLUS if channel_binding.is_some() => true,
            SCRAM_SHA_256 => false,
            _ => return Err(ScramError::UnsupportedMechanism),
        };
        let first = parse_client_first(client_first)?;
        match first.cbind_flag {
            CbindFlag::None | CbindFlag::ClientOnly if binding_in_use => {
                return Err(ScramError::Malformed(
                    "SCRAM-SHA-256-PLUS was selected but the message has no channel binding",
                ));
            }
            // The client would bind, but did not see -PLUS offered. We offered it on this link,
            // so someone in between removed it (RFC 5802 section 6).
            CbindFlag::ClientOnly if channel_binding.is_some() => {
                return Err(ScramError::ChannelBindingDowngrade);
            }
            CbindFlag::Bound(_) if !binding_in_use => {
                return Err(ScramError::Malformed(
                    "SCRAM-SHA-256 without channel binding was selected but the message has \
                     channel-binding data",
                ));
            }
            CbindFlag::Bound(kind) if kind != TLS_SERVER_END_POINT => {
                return Err(ScramError::UnsupportedChannelBindingType);
            }
            _ => {}
        }
        let mut expected_binding = first.gs2_header.to_vec();
        if binding_in_use {
            expected_binding.extend_from_slice(channel_binding.unwrap_or_default());
        }
        let mut full_nonce = first.nonce.to_vec();
        full_nonce.extend_from_slice(nonce.0.as_bytes());
        let mut server_first = b"r=".to_vec();
        server_first.extend_from_slice(&full_nonce);
        server_first.extend_from_slice(
            format!(",s={},i={}", BASE64.encode(&secret.salt), secret.iterations).as_bytes(),
        );
        let server = ScramServer {
            stored_key: secret.stored_key.clone(),
            server_key: secret.server_key.clone(),
            expected_binding,
            nonce: full_nonce,
            client_first_bare: first.bare.to_vec(),
            server_first: server_first.clone(),
            doomed: false,
        };
        Ok((server, server_first))
    }

    /// Starts a mock exchange for a user the gateway does not know, so that roles cannot be
    /// enumerated: the salt is derived from `mock_key` (a secret the gateway keeps stable across
    /// restarts and replicas) and `user`, so repeated attempts for one name see the same salt and
    /// the default iteration count, as for a real verifier; [`ScramServer::finish`] then fails
    /// with [`ScramError::AuthenticationFailed`] after the same work as a wrong password.
    pub fn start_mock(
        mock_key: &[u8],
        user: &str,
        channel_binding: Option<&[u8]>,
        nonce: Nonce,
        mechanism: &str,
        client_first: &[u8],
    ) -> Result<(ScramServer, Vec<u8>), ScramError> {
        let secret = ScramSecret::mock(mock_key, user);
        let (mut server, server_first) =
            Self::start(&secret, channel_binding, nonce, mechanism, client_first)?;
        server.doomed = true;
        Ok((server, server_first))
    }

    /// Checks the client-final (the SASLResponse body) and, when the proof holds, returns the
    /// server-final to send and the client's ClientKey: with the verifier it makes the
    /// [`super::ScramKeys`] that log in to backends sharing that verifier.
    pub fn finish(self, client_final: &[u8]) -> Result<(Vec<u8>, ClientKey), ScramError> {
        if client_final.contains(&0) {
            return Err(ScramError::Malformed("NUL byte in client-final-message"));
        }
        let parts: Vec<&[u8]> = client_final.split(|&c| c == b',').collect();
        let [binding, nonce, extensions @ .., proof] = parts.as_slice() else {
            return Err(ScramError::Malformed("client-final-message is too short"));
        };
        let binding = attribute(binding, b'c')
            .ok_or(ScramError::Malformed("expected channel binding (c=)"))?;
        let nonce = attribute(nonce, b'r').ok_or(ScramError::Malformed("expected nonce (r=)"))?;
        if !extensions.iter().all(|e| is_attribute(e)) {
            return Err(ScramError::Malformed(
                "invalid attribute in client-final-message",
            ));
        }
        let proof = attribute(proof, b'p')
            .ok_or(ScramError::Malformed("expected proof (p=) at the end"))?;
        let binding = BASE64
            .decode(binding)
            .map_err(|_| ScramError::Malformed("channel binding is not base64"))?;
        if binding != self.expected_binding {
            return Err(ScramError::ChannelBindingMismatch);
        }
        if nonce != self.nonce.as_slice() {
            return Err(ScramError::NonceMismatch);
        }
        let proof = std::str::from_utf8(proof)
            .ok()
            .and_then(decode_key)
            .ok_or(ScramError::Malformed("proof is not 32 bytes of base64"))?;
        let without_proof = &client_final[..client_final.len() - proof_len(&parts)];
        let message = auth_message(&self.client_first_bare, &self.server_first, without_proof);

        // ClientProof = ClientKey XOR HMAC(StoredKey, AuthMessage): undo the XOR and check that
        // the result hashes to StoredKey. A mock exchange does the same work before failing.
        let signature = hmac_sha256(&self.stored_key.0, &message);
        let client_key = ClientKey(xor(&proof, &signature));
        let proven: bool = sha256(&client_key.0).ct_eq(&self.stored_key.0).into();
        if !proven || self.doomed {
            return Err(ScramError::AuthenticationFailed);
        }
        let server_signature = hmac_sha256(&self.server_key.0, &message);
        let server_final = format!("v={}", BASE64.encode(server_signature)).into_bytes();
        Ok((server_final, client_key))
    }
}

/// Length of `,p=<proof>` at the end of a client-final split into `parts`.
fn proof_len(parts: &[&[u8]]) -> usize {
    parts.last().map_or(0, |p| p.len() + 1)
}

/// The gs2 channel-binding flag of a client-first message.
#[derive(Debug, PartialEq, Eq)]
enum CbindFlag<'a> {
    /// `n`: the client does not support channel binding.
    None,
    /// `y`: the client supports it but thinks the server does not.
    ClientOnly,
    /// `p=<type>`: the client binds with this type.
    Bound(&'a [u8]),
}

struct ClientFirst<'a> {
    cbind_flag: CbindFlag<'a>,
    /// `flag,authzid,`: echoed (base64) in the client-final's `c=`.
    gs2_header: &'a [u8],
    bare: &'a [u8],
    nonce: &'a [u8],
}

fn parse_client_first(msg: &[u8]) -> Result<ClientFirst<'_>, ScramError> {
    if msg.contains(&0) {
        return Err(ScramError::Malformed("NUL byte in client-first-message"));
    }
    let mut parts = msg.splitn(3, |&c| c == b',');
    let (Some(flag), Some(authzid), Some(bare)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(ScramError::Malformed(
            "client-first-message has no gs2 header",
        ));
    };
    let cbind_flag = match flag {
        b"n" => CbindFlag::None,
        b"y" => CbindFlag::ClientOnly,
        _ => CbindFlag::Bound(
            attribute(flag, b'p')
                .ok_or(ScramError::Malformed("unexpected channel-binding flag"))?,
        ),
    };
    if !authzid.is_empty() {
        return Err(if attribute(authzid, b'a').is_some() {
            ScramError::AuthzidNotSupported
        } else {
            ScramError::Malformed("unexpected attribute in gs2 header")
        });
    }
    let gs2_header = &msg[..flag.len() + 2];
    let mut attrs = bare.split(|&c| c == b',');
    let user = attrs.next().unwrap_or_default();
    if attribute(user, b'm').is_some() {
        return Err(ScramError::MandatoryExtension);
    }
    // The user name in the message is ignored, as Postgres does: the startup message names the
    // user, and libpq sends an empty one.
    if attribute(user, b'n').is_none() {
        return Err(ScramError::Malformed("expected user name (n=)"));
    }
    let nonce = attrs
        .next()
        .and_then(|a| attribute(a, b'r'))
        .ok_or(ScramError::Malformed("expected nonce (r=)"))?;
    if !is_printable(nonce) {
        return Err(ScramError::Malformed(
            "non-printable characters in SCRAM nonce",
        ));
    }
    if !attrs.all(is_attribute) {
        return Err(ScramError::Malformed(
            "invalid attribute in client-first-message",
        ));
    }
    Ok(ClientFirst {
        cbind_flag,
        gs2_header,
        bare,
        nonce,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{RFC_SALT, rfc_secret};
    use super::super::{
        DEFAULT_ITERATIONS, DEFAULT_SALT_LEN, ScramChallenge, ScramClient, ScramKeys, mechanisms,
    };
    use super::*;

    const CLIENT_FIRST: &[u8] = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
    const SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
    const SERVER_FIRST: &[u8] =
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const CLIENT_FINAL: &[u8] = b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
        p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const SERVER_FINAL: &[u8] = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";
    const CERT_HASH: &[u8] = &[7; 32];

    fn rfc_start(
        cb: Option<&[u8]>,
        mechanism: &str,
        first: &[u8],
    ) -> Result<ScramServer, ScramError> {
        let nonce = Nonce::from_printable(SERVER_NONCE);
        ScramServer::start(&rfc_secret(), cb, nonce, mechanism, first).map(|(s, _)| s)
    }

    fn nonce(n: u8) -> Nonce {
        Nonce::from_random([n; 18])
    }

    /// A full exchange: the gateway's client side against its server side.
    fn exchange(
        client_password: &str,
        server: impl FnOnce(&[u8]) -> Result<(ScramServer, Vec<u8>), ScramError>,
    ) -> Result<(), ScramError> {
        let client = ScramClient::new(nonce(1));
        let (server, server_first) = server(&client.client_first())?;
        let challenge: ScramChallenge = client.handle_server_first(&server_first).unwrap();
        let keys =
            ScramKeys::from_password(client_password, challenge.salt(), challenge.iterations());
        let (awaiting, client_final) = challenge.client_final(&keys).unwrap();
        let (server_final, client_key) = server.finish(&client_final)?;
        assert_eq!(client_key, keys.client_key);
        awaiting.verify_server_final(&server_final).unwrap();
        Ok(())
    }

    #[test]
    fn rfc7677_vector() {
        let (server, server_first) = ScramServer::start(
            &rfc_secret(),
            None,
            Nonce::from_printable(SERVER_NONCE),
            SCRAM_SHA_256,
            CLIENT_FIRST,
        )
        .unwrap();
        assert_eq!(server_first, SERVER_FIRST);
        let (server_final, client_key) = server.finish(CLIENT_FINAL).unwrap();
        assert_eq!(server_final, SERVER_FINAL);
        assert_eq!(client_key.stored_key(), rfc_secret().stored_key);
        // The recovered key is the one the password derives.
        let salt = BASE64.decode(RFC_SALT).unwrap();
        assert_eq!(
            client_key,
            ScramKeys::from_password("pencil", &salt, 4096).client_key
        );
    }

    #[test]
    fn wrong_password_and_tampered_proof_fail_alike() {
        let secret = ScramSecret::from_password("right", b"salty", 16);
        let start = |m: &[u8]| ScramServer::start(&secret, None, nonce(2), SCRAM_SHA_256, m);
        assert_eq!(exchange("right", start), Ok(()));
        let err = exchange("wrong", start).unwrap_err();
        assert_eq!(err, ScramError::AuthenticationFailed);
        assert_eq!(err.kind(), ScramErrorKind::InvalidPassword);
        assert_eq!(err.sqlstate(), "28P01");

        let mut tampered = CLIENT_FINAL.to_vec();
        let at = tampered.len() - 5;
        tampered[at] = b'A';
        let server = rfc_start(None, SCRAM_SHA_256, CLIENT_FIRST).unwrap();
        assert_eq!(
            server.finish(&tampered),
            Err(ScramError::AuthenticationFailed)
        );
    }

    #[test]
    fn wrong_nonce_is_a_protocol_violation() {
        let server = rfc_start(None, SCRAM_SHA_256, CLIENT_FIRST).unwrap();
        let other = String::from_utf8(CLIENT_FINAL.to_vec())
            .unwrap()
            .replace("k0,p", "k1,p");
        let err = server.finish(other.as_bytes()).unwrap_err();
        assert_eq!(err, ScramError::NonceMismatch);
        assert_eq!(err.sqlstate(), sqlstate::PROTOCOL_VIOLATION);
    }

    fn bound_client_final(
        server_first: &[u8],
        binding: &[u8],
        keys: &ScramKeys,
        first_bare: &[u8],
    ) -> Vec<u8> {
        // A hand-made -PLUS client: the gateway's own client never binds.
        let nonce = &server_first[2..server_first.iter().position(|&c| c == b',').unwrap()];
        let mut without_proof = format!("c={},r=", BASE64.encode(binding)).into_bytes();
        without_proof.extend_from_slice(nonce);
        let message = auth_message(first_bare, server_first, &without_proof);
        let signature = hmac_sha256(&keys.client_key.stored_key().0, &message);
        let proof = xor(&keys.client_key.0, &signature);
        let mut msg = without_proof;
        msg.extend_from_slice(format!(",p={}", BASE64.encode(proof)).as_bytes());
        msg
    }

    #[test]
    fn channel_binding_is_checked() {
        let salt = BASE64.decode(RFC_SALT).unwrap();
        let keys = ScramKeys::from_password("pencil", &salt, 4096);
        let first = b"p=tls-server-end-point,,n=,r=abc";
        let header = b"p=tls-server-end-point,,";
        let run = |binding: &[u8]| {
            let (server, server_first) = ScramServer::start(
                &rfc_secret(),
                Some(CERT_HASH),
                nonce(3),
                SCRAM_SHA_256_PLUS,
                first,
            )
            .unwrap();
            server.finish(&bound_client_final(
                &server_first,
                binding,
                &keys,
                &first[24..],
            ))
        };
        let good = [&header[..], CERT_HASH].concat();
        let (_, client_key) = run(&good).unwrap();
        assert_eq!(client_key, keys.client_key);
        // Another certificate's hash: a man in the middle terminated TLS.
        let other = [&header[..], &[8u8; 32][..]].concat();
        assert_eq!(run(&other), Err(ScramError::ChannelBindingMismatch));
        assert_eq!(run(b"n,,"), Err(ScramError::ChannelBindingMismatch));
        // Without binding, `c=` must echo the client's own flag.
        let server = rfc_start(None, SCRAM_SHA_256, CLIENT_FIRST).unwrap();
        let eyws = String::from_utf8(CLIENT_FINAL.to_vec())
            .unwrap()
            .replace("c=biws", "c=eSws");
        assert_eq!(
            server.finish(eyws.as_bytes()),
            Err(ScramError::ChannelBindingMismatch)
        );
    }

    #[test]
    fn gs2_header_rules() {
        let plus = SCRAM_SHA_256_PLUS;
        let plain = SCRAM_SHA_256;
        let cb = Some(CERT_HASH);
        let bound = b"p=tls-server-end-point,,n=,r=abc";
        assert!(rfc_start(cb, plus, bound).is_ok());
        // -PLUS only where offered.
        assert_eq!(
            rfc_start(None, plus, bound).err(),
            Some(ScramError::UnsupportedMechanism)
        );
        assert_eq!(
            rfc_start(cb, "SCRAM-SHA-1", b"n,,n=,r=a").err(),
            Some(ScramError::UnsupportedMechanism)
        );
        // -PLUS without binding data, binding data without -PLUS.
        assert!(matches!(
            rfc_start(cb, plus, b"n,,n=,r=abc"),
            Err(ScramError::Malformed(_))
        ));
        assert!(matches!(
            rfc_start(cb, plus, b"y,,n=,r=abc"),
            Err(ScramError::Malformed(_))
        ));
        assert!(matches!(
            rfc_start(cb, plain, bound),
            Err(ScramError::Malformed(_))
        ));
        assert_eq!(
            rfc_start(cb, plus, b"p=tls-unique,,n=,r=abc").err(),
            Some(ScramError::UnsupportedChannelBindingType)
        );
        // Downgrade: the client could bind, we offered -PLUS, it did not see it.
        let err = rfc_start(cb, plain, b"y,,n=,r=abc").err().unwrap();
        assert_eq!(err, ScramError::ChannelBindingDowngrade);
        assert_eq!(err.kind(), ScramErrorKind::ProtocolViolation);
        // `y` is fine where we cannot bind (no TLS, or a certificate without an end-point hash),
        // and `n` is always fine for plain SCRAM.
        assert!(rfc_start(None, plain, b"y,,n=,r=abc").is_ok());
        assert!(rfc_start(cb, plain, b"n,,n=,r=abc").is_ok());
        assert_eq!(
            rfc_start(None, plain, b"n,a=bob,n=,r=abc").err(),
            Some(ScramError::AuthzidNotSupported)
        );
        assert_eq!(
            rfc_start(None, plain, b"n,,m=x,n=,r=abc").err(),
            Some(ScramError::MandatoryExtension)
        );
        assert_eq!(mechanisms(cb.is_some())[0], plus);
    }

    #[test]
    fn malformed_messages_are_protocol_violations() {
        let firsts: [&[u8]; 10] = [
            b"",
            b"n",
            b"n,",
            b"n,,",
            b"x,,n=,r=abc",
            b"n,,r=abc",
            b"n,,n=,r=",
            b"n,,n=,r=a\x01b",
            b"n,,n=,r=abc,junk",
            b"n,,n=,r=abc\0",
        ];
        for first in firsts {
            let err = rfc_start(None, SCRAM_SHA_256, first).err().unwrap();
            assert_eq!(err.kind(), ScramErrorKind::ProtocolViolation, "{first:?}");
        }
        assert!(rfc_start(None, SCRAM_SHA_256, b"n,,n=,r=abc,x=ext").is_ok());
        let finals: [&[u8]; 8] = [
            b"",
            b"c=biws",
            b"c=biws,r=x",
            b"c=!!,r=x,p=AAAA",
            b"r=x,c=biws,p=AAAA",
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAA",
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=x,z",
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,,p=AAAA",
        ];
        for msg in finals {
            let server = rfc_start(None, SCRAM_SHA_256, CLIENT_FIRST).unwrap();
            let err = server.finish(msg).unwrap_err();
            assert_eq!(err.kind(), ScramErrorKind::ProtocolViolation, "{msg:?}");
        }
    }

    #[test]
    fn mock_exchange_is_indistinguishable() {
        let key = b"gateway mock key";
        let salt_of = |user: &str, n: u8| {
            let (_, first) =
                ScramServer::start_mock(key, user, None, nonce(n), SCRAM_SHA_256, b"n,,n=,r=abc")
                    .unwrap();
            let text = String::from_utf8(first).unwrap();
            let (_, params) = text.split_once(",s=").unwrap();
            params.to_owned()
        };
        // Stable per user (salt and iterations), different across users, shaped like a real one.
        assert_eq!(salt_of("alice", 1), salt_of("alice", 2));
        assert_ne!(salt_of("alice", 1), salt_of("bob", 1));
        let real = ScramSecret::from_password("pw", &[9; DEFAULT_SALT_LEN], DEFAULT_ITERATIONS);
        let (_, real_first) =
            ScramServer::start(&real, None, nonce(1), SCRAM_SHA_256, b"n,,n=,r=abc").unwrap();
        let real_params = String::from_utf8(real_first)
            .unwrap()
            .split_once(",s=")
            .unwrap()
            .1
            .to_owned();
        assert_eq!(real_params.len(), salt_of("alice", 1).len());
        assert!(salt_of("alice", 1).ends_with(",i=4096"));
        // Same gs2 validation, same failure as a wrong password whatever the client sends.
        let mock = |first: &[u8]| {
            ScramServer::start_mock(key, "alice", None, nonce(4), SCRAM_SHA_256, first)
        };
        assert_eq!(
            exchange("anything", mock),
            Err(ScramError::AuthenticationFailed)
        );
        assert_eq!(
            mock(b"n,a=x,n=,r=a").err(),
            Some(ScramError::AuthzidNotSupported)
        );
        let (server, _) =
            ScramServer::start_mock(key, "alice", None, nonce(4), SCRAM_SHA_256, CLIENT_FIRST)
                .unwrap();
        let wrong_nonce = server.finish(CLIENT_FINAL).unwrap_err();
        assert_eq!(
            wrong_nonce,
            ScramError::NonceMismatch,
            "nonce errors come before the proof, as for real users"
        );
    }

    /// xorshift64: deterministic pseudo-random bytes for the fuzz loops.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    fn mutate(base: &[u8], state: &mut u64) -> Vec<u8> {
        let mut msg = base.to_vec();
        for _ in 0..=next(state) % 4 {
            let r = next(state);
            let at = (r as usize >> 8) % (msg.len() + 1);
            match r % 4 {
                0 if at < msg.len() => msg[at] = (r >> 32) as u8,
                1 if at < msg.len() => {
                    msg.remove(at);
                }
                2 => msg.insert(at, b",=p\0"[(r >> 40) as usize % 4]),
                _ => msg.truncate(at),
            }
        }
        msg
    }

    #[test]
    fn never_panics_on_arbitrary_messages() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let cb = [None, Some(CERT_HASH)];
        for i in 0..20_000 {
            let first = if i % 2 == 0 {
                mutate(CLIENT_FIRST, &mut state)
            } else {
                (0..next(&mut state) % 40)
                    .map(|_| next(&mut state) as u8)
                    .collect()
            };
            let mechanism = [SCRAM_SHA_256, SCRAM_SHA_256_PLUS][i % 3 % 2];
            let _ = rfc_start(cb[i % 5 % 2], mechanism, &first);
            let server = rfc_start(None, SCRAM_SHA_256, CLIENT_FIRST).unwrap();
            let last = mutate(CLIENT_FINAL, &mut state);
            let _ = server.finish(&last);
        }
    }
}
