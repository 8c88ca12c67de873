//! Connecting to the proxy with the protocol's limits.

use tonic::transport::Channel;

use crate::convert::MAX_MESSAGE_BYTES;
use crate::v1::proxy_client::ProxyClient;

/// Why a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL does not parse.
    #[error("invalid proxy URL `{url}`: {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// Parser message.
        reason: String,
    },
    /// Nothing answered.
    #[error("cannot connect to proxy at {url}: {reason}")]
    Connect {
        /// The URL given.
        url: String,
        /// Transport message.
        reason: String,
    },
}

/// Connects to the proxy at `url` with the protocol's message size limits.
pub async fn connect(url: &str) -> Result<ProxyClient<Channel>, ConnectError> {
    let endpoint = Channel::from_shared(url.to_string()).map_err(|e| ConnectError::Url {
        url: url.to_string(),
        reason: e.to_string(),
    })?;
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| ConnectError::Connect {
            url: url.to_string(),
            reason: format!(
                "{e}: {}",
                std::error::Error::source(&e)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            ),
        })?;
    Ok(ProxyClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}
