//! Reading whole messages from a client or backend stream during a login or a reset, where the
//! gateway needs each message in hand (the relay itself moves bytes without collecting them).

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::SessionError;
use crate::stream::Stream;

/// One framed message read whole: header included, so it can be forwarded as is.
pub(crate) struct RawMessage {
    pub(crate) bytes: Vec<u8>,
}

impl RawMessage {
    /// The message type.
    pub(crate) fn tag(&self) -> u8 {
        self.bytes[0]
    }
    /// The message after its header.
    pub(crate) fn body(&self) -> &[u8] {
        &self.bytes[5..]
    }
}

/// The body length a tagged message's 5-byte header announces, or `None` when it is out of
/// range (shorter than the length field itself, or longer than `max`).
pub(crate) fn body_len(header: &[u8; 5], max: usize) -> Option<usize> {
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    len.checked_sub(4).filter(|&body| body <= max)
}

/// Reads one tagged message whole, or `None` when its length is out of range.
pub(crate) async fn read_message<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> std::io::Result<Option<RawMessage>> {
    let mut header = [0u8; 5];
    r.read_exact(&mut header).await?;
    let Some(body) = body_len(&header, max) else {
        return Ok(None);
    };
    let mut bytes = vec![0u8; body + 5];
    bytes[..5].copy_from_slice(&header);
    r.read_exact(&mut bytes[5..]).await?;
    Ok(Some(RawMessage { bytes }))
}

/// Reads the client's answer to an authentication request: a password-family message (`p`).
pub(crate) async fn read_password_message(
    client: &mut Stream,
    max: usize,
) -> Result<RawMessage, SessionError> {
    let answer = read_message(client, max)
        .await
        .map_err(SessionError::ClientIo)?
        .ok_or_else(|| {
            SessionError::ClientProtocol("password message length out of range".into())
        })?;
    if answer.tag() != b'p' {
        return Err(SessionError::ClientProtocol(format!(
            "expected a password message, got message type {:?}",
            answer.tag() as char
        )));
    }
    Ok(answer)
}
