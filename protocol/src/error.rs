//! ErrorResponse and NoticeResponse messages written by the gateway itself.

use bytes::BytesMut;
use pgwire::messages::Message;
use pgwire::messages::response::{ErrorResponse, NoticeResponse};

/// How bad a message is; FATAL ends the connection, NOTICE is informational.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// The connection ends after this message.
    Fatal,
    /// The current command failed; the session goes on.
    Error,
    /// Informational, sent as a NoticeResponse.
    Notice,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Severity::Fatal => "FATAL",
            Severity::Error => "ERROR",
            Severity::Notice => "NOTICE",
        }
    }
}

/// A message for the client: severity, SQLSTATE, a human message and optional detail and hint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorMessage {
    /// Severity of the message.
    pub severity: Severity,
    /// Five-character SQLSTATE (see [`crate::sqlstate`]).
    pub code: &'static str,
    /// Primary human-readable message.
    pub message: String,
    /// Optional secondary detail.
    pub detail: Option<String>,
    /// Optional suggestion of what to do.
    pub hint: Option<String>,
}

impl ErrorMessage {
    /// A FATAL message with this SQLSTATE and text.
    pub fn fatal(code: &'static str, message: impl Into<String>) -> Self {
        ErrorMessage {
            severity: Severity::Fatal,
            code,
            message: message.into(),
            detail: None,
            hint: None,
        }
    }

    /// An ERROR with this SQLSTATE and text: the request failed, the session goes on.
    pub fn error(code: &'static str, message: impl Into<String>) -> Self {
        ErrorMessage {
            severity: Severity::Error,
            ..Self::fatal(code, message)
        }
    }

    /// A NOTICE with this SQLSTATE and text.
    pub fn notice(code: &'static str, message: impl Into<String>) -> Self {
        ErrorMessage {
            severity: Severity::Notice,
            ..Self::fatal(code, message)
        }
    }

    /// Adds a hint.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Adds a detail line.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Appends the wire encoding (ErrorResponse, or NoticeResponse for notices) to `buf`.
    pub fn encode(&self, buf: &mut BytesMut) {
        let sev = self.severity.as_str().to_owned();
        let mut fields = vec![
            (b'S', sev.clone()),
            (b'V', sev),
            (b'C', self.code.to_owned()),
            (b'M', self.message.clone()),
        ];
        if let Some(d) = &self.detail {
            fields.push((b'D', d.clone()));
        }
        if let Some(h) = &self.hint {
            fields.push((b'H', h.clone()));
        }
        // Encoding into a BytesMut only fails for messages over pgwire's size limit, which
        // these gateway-written texts never approach.
        let _ = match self.severity {
            Severity::Notice => NoticeResponse::new(fields).encode(buf),
            _ => ErrorResponse::new(fields).encode(buf),
        };
    }

    /// The wire encoding as a fresh buffer.
    pub fn to_bytes(&self) -> BytesMut {
        let mut buf = BytesMut::new();
        self.encode(&mut buf);
        buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlstate;

    #[test]
    fn encodes_fields_in_order() {
        let msg = ErrorMessage::fatal(sqlstate::ADMIN_SHUTDOWN, "bye").with_hint("retry");
        let b = msg.to_bytes();
        assert_eq!(b[0], b'E');
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        assert_eq!(len + 1, b.len());
        let body = &b[5..];
        assert_eq!(body, b"SFATAL\0VFATAL\0C57P01\0Mbye\0Hretry\0\0");
    }

    #[test]
    fn notice_uses_n_tag() {
        let b = ErrorMessage::notice("00000", "waking").to_bytes();
        assert_eq!(b[0], b'N');
    }
}
