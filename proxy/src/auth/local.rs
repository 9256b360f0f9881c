//! The `local` credential source: the superuser the local backend created and, when
//! configured, the owner role it created beside it, with their passwords.

use std::sync::Arc;

use async_trait::async_trait;

use super::{Credential, CredentialError, CredentialSource};

/// The users known from `[local]`.
pub struct LocalSource {
    users: Vec<(String, Arc<Credential>)>,
}

impl LocalSource {
    /// The source for these (user, password) pairs (computes their verifiers: call it at
    /// start-up).
    pub fn new(users: &[(&str, &str)]) -> LocalSource {
        let users = users
            .iter()
            .map(|(user, password)| {
                let credential = Arc::new(Credential::from_password(password));
                ((*user).to_owned(), credential)
            })
            .collect();
        LocalSource { users }
    }
}

#[async_trait]
impl CredentialSource for LocalSource {
    fn kind(&self) -> &'static str {
        "local"
    }

    async fn lookup(&self, user: &str) -> Result<Option<Arc<Credential>>, CredentialError> {
        let known = self.users.iter().find(|(name, _)| name == user);
        Ok(known.map(|(_, credential)| credential.clone()))
    }
}
