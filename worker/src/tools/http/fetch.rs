//! `http_fetch`: GET a URL from an allowed host and return its body as text (the rules it follows
//! are those of the parent module).

use reqwest::{Method, StatusCode};
use schemars::JsonSchema;
use serde::Deserialize;
use skein_common::protocol::ToolEffects;

use super::{parse_url, read_body, Access, Body, HttpSettings, Outgoing};
use crate::tools::{Tool, ToolContext, ToolError};

/// Fetches URLs from allowed hosts.
#[derive(Debug, Clone)]
pub struct HttpFetch {
    access: Access,
}

impl HttpFetch {
    /// `client` is the shared pool (built with [`super::client`]).
    pub fn new(client: reqwest::Client, settings: &HttpSettings) -> Self {
        Self {
            access: Access::new(client, settings),
        }
    }
}

/// Arguments of `http_fetch`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpFetchArgs {
    /// Absolute http(s) URL to GET.
    pub url: String,
    /// Most bytes of the body to return (default and ceiling: the worker's limit).
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

impl Tool for HttpFetch {
    const NAME: &'static str = "http_fetch";
    type Args = HttpFetchArgs;

    /// GET only: it reads what the allowed hosts serve.
    fn effects(&self) -> ToolEffects {
        ToolEffects::READ_ONLY
    }

    fn description(&self) -> String {
        format!(
            "GET an http(s) URL and return its body as text (at most {} bytes). A non-2xx \
             response is returned as `HTTP <status>` followed by the body. {}",
            self.access.max_bytes,
            self.access.reach()
        )
    }

    async fn call(&self, args: HttpFetchArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let url = parse_url(&args.url)?;
        self.access.check(&url)?;
        let cap = self.access.cap(args.max_bytes);
        let outgoing = Outgoing::new(Method::GET, ctx.idempotency_key)?;
        self.access
            .bounded(async {
                let mut response = self.access.exchange(outgoing, url).await?;
                let body = read_body(&mut response, cap).await?;
                Ok(render(response.status(), &body))
            })
            .await
    }
}

/// The model's view of a fetched response: the body, after `HTTP <status>` when it is not a
/// success.
fn render(status: StatusCode, body: &Body) -> String {
    let text = String::from_utf8_lossy(&body.bytes);
    let mut out = if status.is_success() {
        if text.is_empty() {
            format!("HTTP {status} (empty body)")
        } else {
            text.into_owned()
        }
    } else {
        format!("HTTP {status}\n\n{text}")
    };
    if let Some(note) = body.cut_note() {
        out.push('\n');
        out.push_str(&note);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(bytes: &[u8], cut: Option<(usize, Option<u64>)>) -> Body {
        Body {
            bytes: bytes.to_vec(),
            truncated: cut.is_some(),
            declared: cut.and_then(|(_, d)| d),
            cap: cut.map_or(usize::MAX, |(c, _)| c),
        }
    }

    #[test]
    fn bodies_render_with_status_and_cut_note() {
        assert_eq!(render(StatusCode::OK, &body(b"hi", None)), "hi");
        assert_eq!(
            render(StatusCode::NO_CONTENT, &body(b"", None)),
            "HTTP 204 No Content (empty body)"
        );
        assert_eq!(
            render(StatusCode::NOT_FOUND, &body(b"gone", Some((4, Some(10))))),
            "HTTP 404 Not Found\n\ngone\n[response truncated at 4 of 10 bytes]"
        );
        assert_eq!(
            render(StatusCode::OK, &body(b"abc", Some((3, None)))),
            "abc\n[response truncated at 3 bytes]"
        );
    }
}
