//! The `local` credential source: the superuser the local backend created, with its password.

use std::sync::Arc;

use async_trait::async_trait;

use super::{Credential, CredentialError, CredentialSource};

/// One user, known from `[local]`.
pub struct LocalSource {
    user: String,
    credential: Arc<Credential>,
}

impl LocalSource {
    /// The source for this superuser (computes its verifier: call it at start-up).
    pub fn new(user: &str, password: &str) -> LocalSource {
        LocalSource {
            user: user.to_owned(),
            credential: Arc::new(Credential::from_password(password)),
        }
    }
}

#[async_trait]
impl CredentialSource for LocalSource {
    fn kind(&self) -> &'static str {
        "local"
    }

    async fn lookup(&self, user: &str) -> Result<Option<Arc<Credential>>, CredentialError> {
        Ok((user == self.user).then(|| self.credential.clone()))
    }
}
