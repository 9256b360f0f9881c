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

/// The body: `queries` for a batch, else `query` and `params` for one statement. One struct
/// rather than an untagged enum, which would build (and drop) an error for every single
/// statement on its way to the second variant.
#[derive(Deserialize)]
struct Payload {
    queries: Option<Vec<QueryJson>>,
    query: Option<String>,
    #[serde(default)]
    params: Vec<Value>,
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
    let payload: Payload = serde_json::from_slice(body)?;
    if let Some(queries) = payload.queries {
        return Ok((
            queries.into_iter().map(QueryJson::statement).collect(),
            true,
        ));
    }
    let query = payload
        .query
        .ok_or_else(|| <serde_json::Error as serde::de::Error>::missing_field("query"))?;
    let single = QueryJson {
        query,
        params: payload.params,
    };
    Ok((vec![single.statement()], false))
}
