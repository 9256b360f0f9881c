//! The body of a `POST /sql` request: one statement with its parameters, or a batch. It uses
//! nothing else of the crate, so the fuzz targets build it on its own.

use serde::Deserialize;
use serde_json::Value;

/// One statement and its parameters (`None` is SQL NULL).
pub struct Statement {
    /// SQL text with `$n` placeholders.
    pub query: String,
    /// Parameter values in text form.
    pub params: Vec<Option<String>>,
}

/// The body: one statement, or a batch.
#[derive(Deserialize)]
#[serde(untagged)]
enum Payload {
    Batch { queries: Vec<QueryJson> },
    Single(QueryJson),
}

#[derive(Deserialize)]
struct QueryJson {
    query: String,
    #[serde(default)]
    params: Vec<Value>,
}

impl QueryJson {
    /// Parameters in text form, as the extended protocol sends them: strings as they are, other
    /// JSON values in their JSON text, null as SQL NULL.
    fn statement(self) -> Statement {
        let params = self
            .params
            .into_iter()
            .map(|p| match p {
                Value::Null => None,
                Value::String(s) => Some(s),
                other => Some(other.to_string()),
            })
            .collect();
        Statement {
            query: self.query,
            params,
        }
    }
}

/// The statements of a request body, `{"query", "params"}` or `{"queries": [...]}`, and whether
/// it is a batch (run in one transaction).
pub fn parse(body: &[u8]) -> Result<(Vec<Statement>, bool), serde_json::Error> {
    Ok(match serde_json::from_slice(body)? {
        Payload::Single(q) => (vec![q.statement()], false),
        Payload::Batch { queries } => (
            queries.into_iter().map(QueryJson::statement).collect(),
            true,
        ),
    })
}
