//! The gateway as SCRAM client, logging in to a backend on a user's behalf with [`ScramKeys`]:
//! either the ones recovered from the client's own login (when the backend holds the same
//! verifier) or ones derived from the password for the backend's salt.
//!
//! The gateway never asks the backend for channel binding: it sends the gs2 flag `n` ("client
//! does not support binding") and selects plain SCRAM-SHA-256. Its backend link may be plaintext
//! (a local socket, a private network) or TLS, and Postgres accepts `n` with SCRAM-SHA-256 on
//! both; `y` would be refused by a TLS backend that offers -PLUS, and binding belongs to links
//! where the client cannot trust the path, which the gateway-to-backend hop is not.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use subtle::ConstantTimeEq;
use thiserror::Error;

use super::{
    KEY_LEN, Nonce, ScramKeys, attribute, auth_message, hmac_sha256, is_attribute, is_printable,
    parse_iterations, xor,
};

/// The gs2 header the gateway sends: no channel binding, no authorization identity.
const GS2_HEADER: &[u8] = b"n,,";

/// Why a SCRAM login to a backend failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ScramClientError {
    /// The backend's message does not follow the SCRAM grammar.
    #[error("malformed SCRAM message from the backend: {0}")]
    Malformed(&'static str),
    /// The backend's nonce does not extend the one the gateway sent.
    #[error("the backend's SCRAM nonce does not extend the gateway's")]
    NonceMismatch,
    /// The keys were derived for another salt or iteration count than the backend's verifier.
    #[error(
        "the SCRAM keys were made for another verifier than the backend's (salt or iterations differ)"
    )]
    KeysForOtherVerifier,
    /// The backend reported an error in its server-final message.
    #[error("the backend refused the SCRAM proof: {0}")]
    ServerError(String),
    /// The backend's signature is wrong: it does not hold the verifier the keys belong to.
    #[error("the backend's SCRAM signature does not verify")]
    ServerSignatureMismatch,
}

/// A SCRAM login to a backend before its server-first message.
///
/// Send [`SCRAM_SHA_256`](super::SCRAM_SHA_256) with [`ScramClient::client_first`] in a
/// SASLInitialResponse, then pass the AuthenticationSASLContinue data to
/// [`ScramClient::handle_server_first`].
pub struct ScramClient {
    client_first_bare: Vec<u8>,
    nonce: Vec<u8>,
}

impl ScramClient {
    /// A login with a fresh nonce (consumed: a nonce is never reused).
    pub fn new(nonce: Nonce) -> Self {
        // Postgres ignores the SCRAM user name in favour of the startup message's, so the
        // gateway sends an empty one like libpq (and needs no SASLprep or escaping of names).
        Self::for_user("", nonce)
    }

    fn for_user(user: &str, nonce: Nonce) -> Self {
        ScramClient {
            client_first_bare: format!("n={user},r={}", nonce.0).into_bytes(),
            nonce: nonce.0.into_bytes(),
        }
    }

    /// The client-first message, the data of the SASLInitialResponse.
    pub fn client_first(&self) -> Vec<u8> {
        [GS2_HEADER, &self.client_first_bare].concat()
    }

    /// Reads the server-first message (the AuthenticationSASLContinue data). Cheap: the salt and
    /// iteration count it returns tell the caller which keys to use, and deriving them from a
    /// password is the heavy step that belongs on a blocking thread.
    pub fn handle_server_first(
        self,
        server_first: &[u8],
    ) -> Result<ScramChallenge, ScramClientError> {
        if server_first.contains(&0) {
            return Err(ScramClientError::Malformed(
                "NUL byte in server-first-message",
            ));
        }
        let mut attrs = server_first.split(|&c| c == b',');
        let first = attrs.next().unwrap_or_default();
        if attribute(first, b'm').is_some() {
            return Err(ScramClientError::Malformed(
                "unsupported mandatory extension",
            ));
        }
        let nonce =
            attribute(first, b'r').ok_or(ScramClientError::Malformed("expected nonce (r=)"))?;
        if !is_printable(nonce) {
            return Err(ScramClientError::Malformed(
                "non-printable characters in the nonce",
            ));
        }
        if nonce.len() <= self.nonce.len() || !nonce.starts_with(&self.nonce) {
            return Err(ScramClientError::NonceMismatch);
        }
        let salt = attrs
            .next()
            .and_then(|a| attribute(a, b's'))
            .and_then(|s| BASE64.decode(s).ok())
            .ok_or(ScramClientError::Malformed("expected base64 salt (s=)"))?;
        let iterations = attrs
            .next()
            .and_then(|a| attribute(a, b'i'))
            .and_then(|i| std::str::from_utf8(i).ok())
            .and_then(parse_iterations)
            .ok_or(ScramClientError::Malformed(
                "expected a positive iteration count (i=)",
            ))?;
        if !attrs.all(is_attribute) {
            return Err(ScramClientError::Malformed(
                "invalid attribute in server-first-message",
            ));
        }
        let mut without_proof = b"c=".to_vec();
        without_proof.extend_from_slice(BASE64.encode(GS2_HEADER).as_bytes());
        without_proof.extend_from_slice(b",r=");
        without_proof.extend_from_slice(nonce);
        Ok(ScramChallenge {
            client_first_bare: self.client_first_bare,
            server_first: server_first.to_vec(),
            without_proof,
            salt,
            iterations,
        })
    }
}

/// A SCRAM login to a backend after its server-first message: knows the backend's salt and
/// iteration count and waits for the keys to prove the password with.
pub struct ScramChallenge {
    client_first_bare: Vec<u8>,
    server_first: Vec<u8>,
    without_proof: Vec<u8>,
    salt: Vec<u8>,
    iterations: u32,
}

impl ScramChallenge {
    /// The salt of the backend's verifier.
    pub fn salt(&self) -> &[u8] {
        &self.salt
    }

    /// The iteration count of the backend's verifier. It costs the gateway that many HMACs to
    /// derive keys from a password, so a caller may refuse absurd counts from a backend whose
    /// verifiers a tenant controls.
    pub fn iterations(&self) -> u32 {
        self.iterations
    }

    /// Whether `keys` were made for this backend's salt and iteration count. Only then can they
    /// work, and they do exactly when the backend's verifier comes from the same password too,
    /// which the protocol cannot reveal before the proof: the usual case is a backend holding the
    /// very verifier the gateway checked the client against. Otherwise the login needs
    /// [`ScramKeys::from_password`] with this salt and count, hence the password.
    pub fn matches(&self, keys: &ScramKeys) -> bool {
        keys.iterations == self.iterations && keys.salt == self.salt
    }

    /// The client-final message (the SASLResponse data) proving `keys`, and the state that checks
    /// the backend's answer.
    pub fn client_final(
        self,
        keys: &ScramKeys,
    ) -> Result<(AwaitingServerFinal, Vec<u8>), ScramClientError> {
        if !self.matches(keys) {
            return Err(ScramClientError::KeysForOtherVerifier);
        }
        let message = auth_message(
            &self.client_first_bare,
            &self.server_first,
            &self.without_proof,
        );
        let signature = hmac_sha256(&keys.client_key.stored_key().0, &message);
        let proof = xor(&keys.client_key.0, &signature);
        let server_signature = hmac_sha256(&keys.server_key.0, &message);
        let mut client_final = self.without_proof;
        client_final.extend_from_slice(format!(",p={}", BASE64.encode(proof)).as_bytes());
        Ok((AwaitingServerFinal { server_signature }, client_final))
    }
}

/// A SCRAM login to a backend after the client-final: checks the backend's signature.
pub struct AwaitingServerFinal {
    server_signature: [u8; KEY_LEN],
}

impl AwaitingServerFinal {
    /// Checks the server-final message (the AuthenticationSASLFinal data). Success proves the
    /// backend holds the verifier, so the gateway is not talking to an impostor.
    pub fn verify_server_final(self, server_final: &[u8]) -> Result<(), ScramClientError> {
        let first = server_final
            .split(|&c| c == b',')
            .next()
            .unwrap_or_default();
        if let Some(error) = attribute(first, b'e') {
            return Err(ScramClientError::ServerError(
                String::from_utf8_lossy(error).into_owned(),
            ));
        }
        let signature = attribute(first, b'v')
            .and_then(|v| BASE64.decode(v).ok())
            .ok_or(ScramClientError::Malformed(
                "expected a base64 server signature (v=)",
            ))?;
        if bool::from(signature.ct_eq(&self.server_signature)) {
            Ok(())
        } else {
            Err(ScramClientError::ServerSignatureMismatch)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::RFC_SALT;
    use super::*;

    const SERVER_FIRST: &[u8] =
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";

    fn rfc_client() -> ScramClient {
        ScramClient::for_user("user", Nonce::from_printable("rOprNGfwEbeRWgbNEkqO"))
    }

    fn rfc_keys() -> ScramKeys {
        ScramKeys::from_password("pencil", &BASE64.decode(RFC_SALT).unwrap(), 4096)
    }

    #[test]
    fn rfc7677_vector() {
        let client = rfc_client();
        assert_eq!(client.client_first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let challenge = client.handle_server_first(SERVER_FIRST).unwrap();
        assert_eq!(challenge.iterations(), 4096);
        assert_eq!(BASE64.encode(challenge.salt()), RFC_SALT);
        let keys = rfc_keys();
        assert!(challenge.matches(&keys));
        let (awaiting, client_final) = challenge.client_final(&keys).unwrap();
        assert_eq!(
            client_final,
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
              p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        awaiting
            .verify_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
    }

    #[test]
    fn empty_user_name_towards_backends() {
        let client = ScramClient::new(Nonce::from_random([1; 18]));
        assert_eq!(client.client_first(), b"n,,n=,r=AQEBAQEBAQEBAQEBAQEBAQEB");
    }

    #[test]
    fn wrong_server_signature_and_errors() {
        let fin = || {
            let challenge = rfc_client().handle_server_first(SERVER_FIRST).unwrap();
            challenge.client_final(&rfc_keys()).unwrap().0
        };
        assert_eq!(
            fin().verify_server_final(b"v=7rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
            Err(ScramClientError::ServerSignatureMismatch)
        );
        assert_eq!(
            fin().verify_server_final(b"e=invalid-proof"),
            Err(ScramClientError::ServerError("invalid-proof".into()))
        );
        assert!(matches!(
            fin().verify_server_final(b"v=!!"),
            Err(ScramClientError::Malformed(_))
        ));
        assert!(matches!(
            fin().verify_server_final(b""),
            Err(ScramClientError::Malformed(_))
        ));
    }

    #[test]
    fn keys_for_another_salt_are_refused() {
        let challenge = rfc_client().handle_server_first(SERVER_FIRST).unwrap();
        let other = ScramKeys::from_password("pencil", b"another salt", 4096);
        assert!(!challenge.matches(&other));
        assert_eq!(
            challenge.client_final(&other).err(),
            Some(ScramClientError::KeysForOtherVerifier)
        );
    }

    #[test]
    fn bad_server_first_is_refused() {
        let bad: [&[u8]; 9] = [
            b"",
            b"r=rOprNGfwEbeRWgbNEkqO,s=QSXCR+Q6sek8bf92,i=4096",
            b"r=someoneelse,s=QSXCR+Q6sek8bf92,i=4096",
            b"r=rOprNGfwEbeRWgbNEkqOx,s=!!,i=4096",
            b"r=rOprNGfwEbeRWgbNEkqOx,s=QSXCR+Q6sek8bf92,i=0",
            b"r=rOprNGfwEbeRWgbNEkqOx,s=QSXCR+Q6sek8bf92,i=-1",
            b"r=rOprNGfwEbeRWgbNEkqOx,s=QSXCR+Q6sek8bf92",
            b"m=ext,r=rOprNGfwEbeRWgbNEkqOx,s=QSXCR+Q6sek8bf92,i=1",
            b"r=rOprNGfwEbeRWgbNEkqOx,s=QSXCR+Q6sek8bf92,i=1,\0",
        ];
        for msg in bad {
            assert!(rfc_client().handle_server_first(msg).is_err(), "{msg:?}");
        }
        assert_eq!(
            rfc_client().handle_server_first(bad[2]).err(),
            Some(ScramClientError::NonceMismatch)
        );
    }

    #[test]
    fn never_panics_on_arbitrary_messages() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mut msg = SERVER_FIRST.to_vec();
            let cut = (state % (msg.len() as u64 + 1)) as usize;
            msg.truncate(cut);
            let at = (state >> 16) as usize % (msg.len() + 1);
            msg.insert(at, (state >> 40) as u8);
            if let Ok(challenge) = rfc_client().handle_server_first(&msg) {
                let keys = ScramKeys::from_password("p", challenge.salt(), 1);
                if let Ok((awaiting, _)) = challenge.client_final(&keys) {
                    let _ = awaiting.verify_server_final(&msg);
                }
            }
        }
    }
}
